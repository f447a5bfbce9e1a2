# The README's commands. Every target is safe to re-run: setup and models skip what exists.
PYTHON ?= python

.PHONY: setup models demo test docs check

setup:
	bash tools/setup.sh

models:
	$(PYTHON) -m tools.models all

demo: setup models
	$(PYTHON) examples/ch07_scheduler.py

test: setup models
	$(PYTHON) -m pytest

docs: setup
	$(PYTHON) -m mkdocs build --strict

check: setup models
	$(PYTHON) -m tools.steps check
	$(PYTHON) practice/judge.py check
