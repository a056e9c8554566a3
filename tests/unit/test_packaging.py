"""racktwin installed from its wheel, not only from a checkout: every package is in the wheel, and the
example files (the embedded defaults of ``racktwin twin``, ``sim`` and ``demo`` among them) ship
inside it as ``agent.examples``. An installed wheel used to look for them in ``site-packages/examples``
and stop (``racktwin twin steady``: file not found).
"""

from __future__ import annotations

import os
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parents[2]


def test_every_package_folder_is_listed_in_pyproject() -> None:
    setuptools = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["setuptools"]
    folders = {
        ".".join(init.parent.relative_to(REPO).parts)
        for top in ("twin", "models", "agent", "sim")
        for init in (REPO / top).rglob("__init__.py")
    }
    assert set(setuptools["packages"]) == folders | {"agent.examples"}
    assert setuptools["package-dir"] == {"agent.examples": "examples"}


def test_the_installed_wheel_runs_on_its_embedded_defaults(tmp_path: Path) -> None:
    wheels = tmp_path / "wheels"
    build = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", str(wheels), str(REPO)],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert build.returncode == 0, build.stderr[-3000:]
    [wheel] = wheels.glob("racktwin-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    for example in (REPO / "examples").iterdir():
        assert f"agent/examples/{example.name}" in names, example.name
    assert not any(n.startswith(("tests/", "benchmarks/", "examples/")) for n in names)
    sources = {
        p.relative_to(REPO).as_posix() for top in ("twin", "models", "agent", "sim") for p in (REPO / top).rglob("*.py")
    }
    assert {n for n in names if n.endswith(".py")} == sources  # (a stale build/ folder would add old modules)
    site = tmp_path / "site"
    install = subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(site), str(wheel)],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert install.returncode == 0, install.stderr[-3000:]
    env = {**os.environ, "PYTHONPATH": str(site)}  # the installed copy, not this checkout
    where = subprocess.run(
        [sys.executable, "-c", "import agent.commands.common as c; print(c.__file__); print(c.DEFAULT_SITE)"],
        capture_output=True, text=True, cwd=tmp_path, env=env, timeout=60,
    )  # fmt: skip
    module, default_site = where.stdout.split()
    assert Path(module).is_relative_to(site) and Path(default_site) == site / "agent/examples/supernode-512.toml"
    steady = subprocess.run(
        [sys.executable, "-m", "agent.cli", "twin", "steady"],
        capture_output=True, text=True, cwd=tmp_path, env=env, timeout=120,
    )  # fmt: skip
    assert steady.returncode == 0, steady.stderr
    assert steady.stdout.startswith("supernode-512: 512 cards"), steady.stdout[:300]
    project = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    shown = subprocess.run(
        [sys.executable, "-m", "agent.cli", "--version"], capture_output=True, text=True, cwd=tmp_path, env=env
    )
    assert (shown.returncode, shown.stdout) == (0, f"racktwin {project['version']}\n")


def test_a_bare_pytest_collects_the_suite_from_any_folder(tmp_path: Path) -> None:
    """The ``pytest`` console script puts no checkout on sys.path: without the configured pythonpath
    it imported tests/agent (a folder without ``__init__``) as the package ``agent`` and 12 test files
    failed to collect ("cannot import name ... from 'agent' (unknown location)")."""
    pytest_script = Path(sys.executable).with_name("pytest")
    if not pytest_script.exists():
        pytest.skip("no pytest console script beside this interpreter")
    files = [str(REPO / "tests" / "integration" / "test_sim_cli_errors.py"), str(REPO / "tests" / "agent")]
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    out = subprocess.run(
        [str(pytest_script), "--collect-only", "-q", "-p", "no:cacheprovider", *files],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-2000:]
    assert "error" not in out.stdout.lower().splitlines()[-1], out.stdout[-2000:]
