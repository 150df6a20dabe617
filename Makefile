# Two entry points the README promises: `make bench` (the quick tour) and `make test`.
PY := $(shell bash scripts/setup.sh | tail -n 1)

.PHONY: bench test lint
bench:
	$(PY) -m gnnpar bench --out runs/tour

test: lint
	$(PY) -m pytest -q tests

lint:
	$(PY) -m ruff check src tests benchmarks
	$(PY) -m ruff format --check src tests benchmarks
