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
if ! "$PY" -c "import gnnpar, pytest, ruff, setuptools" >/dev/null 2>&1 || [ -n "${GNNPAR_REINSTALL:-}" ]; then
  "$PY" -m pip install -q -e ".[dev]"
fi

# The neighbour sampler's compiled hop kernel (plain C, loaded with ctypes: no torch headers, so
# it fits any torch build). pip builds it from sampler_kernel.c with setup.py on every install
# (`pip install -e .` puts it next to the source as _sampler_kernel<EXT_SUFFIX>, e.g.
# _sampler_kernel.cpython-311-x86_64-linux-gnu.so); an editable install does not notice a later
# edit of the source, so here it is rebuilt whenever the source is newer, by the same setup.py
# build (same compiler flags as a wheel's), then moved into place in one rename. Without it the
# sampler falls back to vectorised torch (slower, other random stream) with a warning.
sampling=src/gnnpar/data/sampling
suffix=$("$PY" -c 'import sysconfig; print(sysconfig.get_config_var("EXT_SUFFIX"))')
kernel=$sampling/_sampler_kernel$suffix
if [ ! -f "$kernel" ] || [ "$sampling/sampler_kernel.c" -nt "$kernel" ]; then
  tmp=$(mktemp -d)
  # setup.py warns rather than fails when there is no compiler; -W ignore: setuptools' notices
  "$PY" -W ignore setup.py -q build_ext --force --build-lib "$tmp/lib" --build-temp "$tmp/obj" || true
  if [ -f "$tmp/lib/gnnpar/data/sampling/_sampler_kernel$suffix" ]; then
    cp "$tmp/lib/gnnpar/data/sampling/_sampler_kernel$suffix" "$kernel.tmp"
    mv "$kernel.tmp" "$kernel"
  else
    echo "setup.sh: warning: could not build $kernel (needs a C compiler, e.g. gcc); the sampler will use torch" >&2
  fi
  rm -rf "$tmp"
fi
# GAT's fused edge softmax (src/gnnpar/models/gat_kernel.c, OpenMP), the same way; without it
# GAT's attention runs as torch operations (the same values, slower with several threads)
models=src/gnnpar/models
gat_kernel=$models/_gat_kernel$suffix
if [ ! -f "$gat_kernel" ] || [ "$models/gat_kernel.c" -nt "$gat_kernel" ]; then
  tmp=$(mktemp -d)
  "$PY" -W ignore setup.py -q build_ext --force --build-lib "$tmp/lib" --build-temp "$tmp/obj" || true
  if [ -f "$tmp/lib/gnnpar/models/_gat_kernel$suffix" ]; then
    cp "$tmp/lib/gnnpar/models/_gat_kernel$suffix" "$gat_kernel.tmp"
    mv "$gat_kernel.tmp" "$gat_kernel"
  else
    echo "setup.sh: warning: could not build $gat_kernel (needs a C compiler with OpenMP); GAT will use torch" >&2
  fi
  rm -rf "$tmp"
fi
# the plain name older versions of this script built: stale once the new one exists
if [ -f "$kernel" ] && [ "$kernel" != "$sampling/_sampler_kernel.so" ]; then
  rm -f "$sampling/_sampler_kernel.so"
fi
# builds from before the kernel moved from src/gnnpar/data/ into data/sampling/: never loaded
rm -f src/gnnpar/data/_sampler_kernel*
