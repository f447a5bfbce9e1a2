"""The book's own scripts, run from the repository root as ``python -m tools.<name>``.

* ``steps``: rebuild the source tree chapter by chapter and prove each step runs on its own
  (on top of ``manifest``, the chapter manifests; ``captured``, what each main printed;
  ``jobs``, running steps side by side).
* ``outputs``: capture what the examples print into ``outputs/``; ``notebooks``: one Jupyter
  notebook per chapter; ``docs``: the site (chapters, ``@@macros@@``, the mkdocs hooks);
  ``upstream_index``: where upstream's symbols live, for pinned links.
* ``models``: build the book's models offline under ``models/``.
* ``diagnostics``: checks of the engine on real hardware (``gpu_check``, ``tp_compare``,
  ``tp_logits``), apart from the book's machinery.

``setup.sh`` (``bash tools/setup.sh``) installs what the book needs.
"""
