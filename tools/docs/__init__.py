"""The book's site machinery: chapters and practice problems (`chapters`), symbol lookup
(`symbols`) and the `@@macro@@` resolver (`macros`), shared by tools/docs_hooks.py (mkdocs),
tools/notebooks.py (Jupyter) and tools/upstream_index.py."""
