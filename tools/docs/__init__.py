"""The book's site machinery: chapters and practice problems (`chapters`), symbol lookup
(`symbols`), the `@@macro@@` resolver (`macros`) and the mkdocs event handlers (`hooks`),
shared by the site (mkdocs_hooks.py at the root), `python -m tools.notebooks` (Jupyter) and
`python -m tools.upstream_index`."""
