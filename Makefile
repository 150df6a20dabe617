# The README's two entry points: `make bench` (the quick tour) and `make test`.
# Both set up .venv first (scripts/setup.sh); GNNPAR_PYTHON=/path/to/python uses an existing env.
PY := $(or $(GNNPAR_PYTHON),.venv/bin/python)
# The pinned loss curves again, as an AVX2 CPU without AVX-512 computes (ATen, MKL and oneDNN
# each told to go no higher): the pinned curves must not move, and the AVX2 paths must agree
# with them to rounding. (A CPU without AVX computes the pinned curves themselves.)
AVX2_CPU := ATEN_CPU_CAPABILITY=avx2 MKL_CBWR=AVX2 ONEDNN_MAX_CPU_ISA=AVX2

.PHONY: setup bench test lint test-cpu-levels
setup:
	bash scripts/setup.sh

bench: setup
	$(PY) -m gnnpar bench --out runs/tour

lint: setup
	$(PY) -m ruff check src tests benchmarks
	$(PY) -m ruff format --check src tests benchmarks

# The suite in two worker processes (pytest-xdist), each test file whole on one of them (its
# module fixtures made once): most slow tests wait on processes, links and timeouts, so two
# workers on two cores keep both busy. Then, alone, the tests marked `serial` (deadlines on
# real processes, process-wide state). GNNPAR_TEST_WORKERS=0 runs the first part in one process.
TEST_WORKERS := $(or $(GNNPAR_TEST_WORKERS),2)
test: lint
	$(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadfile --durations=20 -m "not serial" tests
	$(PY) -m pytest -q --durations=5 -m serial tests

test-cpu-levels: setup
	$(AVX2_CPU) $(PY) -m pytest -q -m "not multirank" -k "not small_change" tests/e2e/test_same_seed_same_loss.py
