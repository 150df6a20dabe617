"""Build the neighbour sampler's hop kernel, and GAT's fused edge softmax
(``src/gnnpar/models/gat_kernel.c``, OpenMP, loaded the same way by gnnpar.models.gat_kernel),
with setuptools (everything else is in pyproject.toml).

``src/gnnpar/data/sampling/sampler_kernel.c`` is plain C (no Python or torch headers) that
``gnnpar.data.sampling.kernel`` loads with ctypes. Building it as an extension module is only the
ordinary way to get it compiled by ``pip install .``, ``pip install -e .`` and wheel builds, with
the interpreter's compiler and flags; it is never imported. ``-O3`` matches scripts/setup.sh's
old ``gcc -O3``: the kernel is integer-only but for the feature cache's ranking, built without
FMA contraction, so flags change its speed, never its output.

Without a working C compiler the build only warns and the install goes on: sampling then falls
back to vectorised torch (slower, other random stream) with a warning that says how to get the
kernel.
"""

from __future__ import annotations

import sys

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext
from setuptools.errors import BaseError, CCompilerError

# what a missing or failing compiler raises (BaseError is DistutilsError; CCompilerError covers
# compile and link errors; OSError a compiler that cannot be started at all)
BUILD_ERRORS = (BaseError, CCompilerError, OSError)


class OptionalBuildExt(build_ext):
    """build_ext that warns instead of failing when the kernel cannot be compiled."""

    def get_export_symbols(self, ext):
        # not a Python module: no PyInit_ function to export (MSVC would insist on one)
        return []

    def run(self):
        try:
            super().run()
        except BUILD_ERRORS as e:  # e.g. no compiler for this platform at all
            self._warn(e)

    def build_extension(self, ext):
        try:
            super().build_extension(ext)
        except BUILD_ERRORS as e:  # compile or link error, compiler not found
            self._warn(e, ext.name)

    @staticmethod
    def _warn(e: Exception, name: str = "") -> None:
        what = (
            "GAT's fused edge softmax; gnnpar installs without it and runs GAT's attention "
            "as torch operations (the same values, slower with several threads)"
            if name.endswith("_gat_kernel")
            else "the sampler kernel; gnnpar installs without it and samples with vectorised "
            "torch (~3-4x slower)"
            if name
            else "gnnpar's C kernels (sampler, GAT attention); gnnpar installs without them and "
            "runs torch operations instead (slower)"
        )
        print(
            f"gnnpar: warning: could not compile {what} ({e}). Install a C compiler (gcc, with "
            "OpenMP) and reinstall to get it: pip install --force-reinstall --no-deps .",
            file=sys.stderr,
        )


setup(
    ext_modules=[
        Extension(
            "gnnpar.data.sampling._sampler_kernel",
            ["src/gnnpar/data/sampling/sampler_kernel.c"],
            # -pthread: gnnpar_pread_rows reads a batch's feature rows with several threads;
            # no FMA contraction: gnnpar_visit_hop gives numpy's bits
            extra_compile_args=["-O3", "-pthread", "-ffp-contract=off"]
            if sys.platform != "win32"
            else ["/O2", "/fp:strict"],
            extra_link_args=["-pthread", "-lm"] if sys.platform != "win32" else [],
            optional=True,  # a missing library is tolerated where setuptools copies outputs
        ),
        # GAT's fused edge softmax: OpenMP, and no FMA contraction (its results must equal
        # torch's float operations to the bit; gnnpar/models/gat_kernel.c)
        Extension(
            "gnnpar.models._gat_kernel",
            ["src/gnnpar/models/gat_kernel.c"],
            extra_compile_args=["-O3", "-fopenmp", "-ffp-contract=off"]
            if sys.platform != "win32"
            else ["/O2", "/openmp", "/fp:strict"],
            extra_link_args=["-fopenmp"] if sys.platform != "win32" else [],
            optional=True,
        ),
    ],
    cmdclass={"build_ext": OptionalBuildExt},
)
