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
if ! "$PY" -c "import gnnpar, pytest, ruff, setuptools, xdist" >/dev/null 2>&1 || [ -n "${GNNPAR_REINSTALL:-}" ]; then
  "$PY" -m pip install -q -e ".[dev]"
fi

# gnnpar's two compiled kernels, plain C loaded with ctypes (no torch headers, so they fit any
# torch build): the neighbour sampler's hop kernel (data/sampling/sampler_kernel.c) and GAT's
# fused edge softmax (models/gat_kernel.c, OpenMP). pip builds both with setup.py on every
# install (`pip install -e .` puts them next to their sources as _<name><EXT_SUFFIX>, e.g.
# _sampler_kernel.cpython-311-x86_64-linux-gnu.so); an editable install does not notice a later
# edit of a source, so here they are rebuilt whenever a source is newer, by one setup.py build
# (same compiler flags as a wheel's), each then moved into place in one rename. Without them the
# sampler falls back to vectorised torch (slower, other random stream) and GAT's attention runs
# as torch operations (the same values, slower with several threads), each with a warning.
sampling=src/gnnpar/data/sampling
models=src/gnnpar/models
suffix=$("$PY" -c 'import sysconfig; print(sysconfig.get_config_var("EXT_SUFFIX"))')
kernel=$sampling/_sampler_kernel$suffix
gat_kernel=$models/_gat_kernel$suffix
stale() { [ ! -f "$1" ] || [ "$2" -nt "$1" ]; }
if stale "$kernel" "$sampling/sampler_kernel.c" || stale "$gat_kernel" "$models/gat_kernel.c"; then
  tmp=$(mktemp -d)
  # setup.py warns rather than fails when there is no compiler; -W ignore: setuptools' notices
  "$PY" -W ignore setup.py -q build_ext --force --build-lib "$tmp/lib" --build-temp "$tmp/obj" || true
  # install KERNEL (its path here) from the build, or warn WHY-NOT
  install_kernel() {
    built="$tmp/lib/gnnpar/${1#src/gnnpar/}"
    if [ -f "$built" ]; then
      cp "$built" "$1.tmp"
      mv "$1.tmp" "$1"
    else
      echo "setup.sh: warning: could not build $1 ($2)" >&2
    fi
  }
  install_kernel "$kernel" "needs a C compiler, e.g. gcc; the sampler will use torch"
  install_kernel "$gat_kernel" "needs a C compiler with OpenMP; GAT will use torch"
  rm -rf "$tmp"
fi
# the plain name older versions of this script built: stale once the new one exists
if [ -f "$kernel" ] && [ "$kernel" != "$sampling/_sampler_kernel.so" ]; then
  rm -f "$sampling/_sampler_kernel.so"
fi
# builds from before the kernel moved from src/gnnpar/data/ into data/sampling/: never loaded
rm -f src/gnnpar/data/_sampler_kernel*
