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

test: lint
	$(PY) -m pytest -q tests
