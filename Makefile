# The README's commands. Every target is safe to re-run: setup and models skip what exists.
PYTHON ?= python

.PHONY: setup models demo test docs check

setup:
	bash tools/setup.sh

models:
	$(PYTHON) -m tools.models all

demo: setup models
	$(PYTHON) examples/ch07_scheduler.py

# two pytest workers, a test file each (its module fixtures stay in one process), one thread
# apiece: two torch processes with two OpenMP threads each spin-wait into each other
TEST_JOBS ?= 2
test: setup models
	OMP_NUM_THREADS=$${OMP_NUM_THREADS:-1} $(PYTHON) -m pytest -n $(TEST_JOBS) --dist loadfile

docs: setup
	$(PYTHON) -m mkdocs build --strict

check: setup models
	$(PYTHON) -m tools.steps check
	$(PYTHON) practice/judge.py check
