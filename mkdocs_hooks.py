"""The site's mkdocs hooks, named in mkdocs.yml `hooks:`; they live in tools/docs/hooks.py.

mkdocs loads a hook by its file path, with the hook's folder on `sys.path` while the file
runs: this file sits at the repository root so that `tools` imports as the package it is,
whether the site is built with `mkdocs build` or `python -m mkdocs`, from any folder.
"""

from tools.docs.hooks import on_config, on_files, on_page_content, on_page_markdown, on_serve

__all__ = ["on_config", "on_files", "on_page_content", "on_page_markdown", "on_serve"]
