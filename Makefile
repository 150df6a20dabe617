# The README's two entry points: `make bench` (the quick tour) and `make test`.
# Both set up .venv first (scripts/setup.sh); GNNPAR_PYTHON=/path/to/python uses an existing env.
PY := $(or $(GNNPAR_PYTHON),.venv/bin/python)

.PHONY: setup bench test lint
setup:
	bash scripts/setup.sh

bench: setup
	$(PY) -m gnnpar bench --out runs/tour

lint: setup
	$(PY) -m ruff check src tests benchmarks
	$(PY) -m ruff format --check src tests benchmarks

# The suite in two worker processes (pytest-xdist), each test file whole on one of them (its
# module fixtures made once): most slow tests wait on processes, links and timeouts, so two
# workers on two cores keep both busy. Files are handed out in collection order, which
# tests/conftest.py (LONGEST_FILES) makes longest first (--no-loadscope-reorder: not xdist's
# most-tests-first, which left the long files, few tests each, for the end). Then, alone, the
# tests marked `serial` (deadlines on real processes, process-wide state).
# GNNPAR_TEST_WORKERS=0 runs the first part in one process.
TEST_WORKERS := $(or $(GNNPAR_TEST_WORKERS),2)
test: lint
	$(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder --durations=20 -m "not serial" tests
	$(PY) -m pytest -q --durations=5 -m serial tests
