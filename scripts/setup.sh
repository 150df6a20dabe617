#!/usr/bin/env bash
# Create .venv (if needed) and install gnnpar with its dev tools.
# torch: on a machine with no torch yet we ask for torch==2.13.0 first. Here that is a CPU build
# lying on disk; elsewhere pip picks the platform's default build (CUDA on Linux). A torch that is
# already installed (e.g. a CUDA build in an existing venv, or GNNPAR_PYTHON pointing at one) is kept.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${GNNPAR_PYTHON:-}
if [ -z "$PY" ]; then
  if [ ! -x .venv/bin/python ]; then
    python3 -m venv .venv
  fi
  PY=.venv/bin/python
fi
if ! "$PY" -c "import torch" >/dev/null 2>&1; then
  "$PY" -m pip install -q "torch==${GNNPAR_TORCH_VERSION:-2.13.0}"
fi
if ! "$PY" -c "import gnnpar, pytest, ruff" >/dev/null 2>&1 || [ -n "${GNNPAR_REINSTALL:-}" ]; then
  "$PY" -m pip install -q -e ".[dev]"
fi

# The neighbour sampler's compiled hop kernel (plain C, loaded with ctypes: no torch headers, so
# it fits any torch build). Rebuilt whenever the source changed; without it the sampler falls
# back to vectorised torch (slower, other random stream) with a warning.
kernel=src/gnnpar/data/_sampler_kernel.so
if [ ! -f "$kernel" ] || [ src/gnnpar/data/sampler_kernel.c -nt "$kernel" ]; then
  if ${CC:-gcc} -O3 -shared -fPIC -o "$kernel.tmp" src/gnnpar/data/sampler_kernel.c; then
    mv "$kernel.tmp" "$kernel"
  else
    echo "setup.sh: warning: could not build $kernel (needs gcc); the sampler will use torch" >&2
  fi
fi
