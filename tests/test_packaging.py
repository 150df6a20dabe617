"""A wheel of gnnpar carries the compiled sampler kernel: pip builds it from sampler_kernel.c, and
the package installed from the wheel (not the checkout) loads it; the loader finds the kernel
under the name setuptools gives it and under the plain name older checkouts built."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import textwrap
from pathlib import Path

import pytest

from helpers import ROOT

PROBE = textwrap.dedent(
    """
    import json
    import gnnpar
    from gnnpar.data.sampling import kernel
    print(json.dumps({"package": gnnpar.__file__, "available": kernel.kernel_available(),
                      "kernel": str(kernel.kernel_path())}))
    """
)


def _isolated_env(tmp_path: Path) -> dict[str, str]:
    """The environment with the home folder, the caches and the temporary folder pip uses moved
    into tmp_path (tests never write to the user's home), and no PYTHONPATH of the caller's."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    for name in ("HOME", "XDG_CACHE_HOME", "PIP_CACHE_DIR", "TMPDIR"):
        env[name] = str(tmp_path / name.lower())
        Path(env[name]).mkdir()
    env["PIP_NO_INPUT"] = "1"
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    return env


def _copy_sources(dest: Path) -> None:
    """What a build reads. A copy: pip writes build/ and egg-info next to the sources it builds,
    and a kernel already built in the checkout (scripts/setup.sh) must not reach the wheel."""
    dest.mkdir()
    for name in ("pyproject.toml", "setup.py", "README.md"):
        shutil.copy2(ROOT / name, dest / name)
    skip = shutil.ignore_patterns("__pycache__", "*.egg-info", "_sampler_kernel*")
    shutil.copytree(ROOT / "src", dest / "src", ignore=skip)


@pytest.mark.slow
@pytest.mark.skipif(shutil.which(os.environ.get("CC", "gcc")) is None, reason="no C compiler")
def test_wheel_installs_and_loads_the_kernel(tmp_path):
    env = _isolated_env(tmp_path)
    src, wheels, site = tmp_path / "checkout", tmp_path / "wheels", tmp_path / "site"
    _copy_sources(src)
    pip = [sys.executable, "-m", "pip"]
    # --no-build-isolation: the running environment's setuptools builds it, so no index is needed
    build = [*pip, "wheel", "--no-deps", "--no-build-isolation", "-w", str(wheels), str(src)]
    subprocess.run(build, env=env, check=True, capture_output=True, timeout=120)
    (wheel,) = wheels.glob("gnnpar-*.whl")
    install = [*pip, "install", "--no-deps", "--no-index", "--target", str(site), str(wheel)]
    subprocess.run(install, env=env, check=True, capture_output=True, timeout=120)

    env["PYTHONPATH"] = str(site)  # ahead of the environment's own (editable) gnnpar
    out = subprocess.run(
        [sys.executable, "-c", PROBE],
        env=env,
        cwd=tmp_path,  # not the checkout, whose src/ must not be what gets imported
        check=True,
        capture_output=True,
        text=True,
        timeout=120,
    )
    got = json.loads(out.stdout.strip().splitlines()[-1])
    site = site.resolve()
    assert Path(got["package"]).resolve().is_relative_to(site), got
    assert got["available"], got
    kernel = Path(got["kernel"]).resolve()
    assert kernel.is_relative_to(site), got
    # the name setuptools gives an extension module, e.g. .cpython-311-x86_64-linux-gnu.so
    assert kernel.name == "_sampler_kernel" + sysconfig.get_config_var("EXT_SUFFIX"), got


@pytest.mark.parametrize("suffix", [sysconfig.get_config_var("EXT_SUFFIX"), ".so"])
def test_loader_finds_the_kernel_by_either_name(tmp_path, monkeypatch, suffix):
    from gnnpar.data.sampling import kernel

    built = kernel.kernel_path()
    if built is None:
        pytest.skip("the kernel is not built here (test_sampling.py's test_kernel_is_built fails)")
    shutil.copy2(built, tmp_path / f"_sampler_kernel{suffix}")
    monkeypatch.setattr(kernel, "_KERNEL_DIR", tmp_path)
    monkeypatch.setattr(kernel, "_kernel_lib", None)
    monkeypatch.setattr(kernel, "_kernel_file", None)
    monkeypatch.setattr(kernel, "_kernel_tried", False)
    assert kernel.kernel_path() == tmp_path / f"_sampler_kernel{suffix}"
    (tmp_path / f"_sampler_kernel{suffix}").unlink()
    monkeypatch.setattr(kernel, "_kernel_lib", None)
    monkeypatch.setattr(kernel, "_kernel_tried", False)
    assert not kernel.kernel_available()  # nothing in the folder: no kernel, no error
