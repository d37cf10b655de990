"""``pip install`` of a checkout and of its sdist as a user runs it: build isolation, PyPI, a fresh venv.

With a C compiler the sdist installs with the listed modules compiled by mypyc; on a machine without one (no
``gcc`` or ``cc`` on the PATH, ``CC`` naming a binary that does not exist) the checkout installs as plain
Python and the build says why. Each installed copy then runs ``progrouter --help``. They need PyPI and
minutes (mypyc compiles inside pip's build environment), so they run in a step of their own
(``make test-install``), not in ``make test``.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import venv
from pathlib import Path

import pytest

from progrouter import compiled

pytestmark = [pytest.mark.install, pytest.mark.timeout(1200)]
ROOT = Path(__file__).resolve().parents[2]
FALLBACK = "no C extension can be built here"
#: what the installed copy reports: where it is, what runs compiled, what is stale, how the scheduler loads
PROBE = (
    "import json, progrouter.program.core.scheduler as s; from progrouter import compiled as c;"
    "print(json.dumps([c.PACKAGE.as_posix(), c.compiled(), c.stale(), s.__file__]))"
)


def _checkout(destination: Path) -> Path:
    """A clean checkout of this working tree: the files git tracks or would track, nothing built."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        check=True,
        capture_output=True,
    ).stdout.split(b"\0")
    for name in filter(None, (entry.decode() for entry in listed)):
        source = ROOT / name
        if source.is_file():  # (a file deleted but not yet staged is still listed)
            (destination / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, destination / name)
    return destination


def _user_env(**overrides: str) -> dict[str, str]:
    """The environment a user's shell has: none of this test run's path or build switches."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PROGROUTER_COMPILE")}
    env.pop("MYPYC_OPT_LEVEL", None)
    return env | overrides


def _pip_install(target: Path, venv_dir: Path, env: dict[str, str]) -> tuple[Path, str]:
    """``pip install <target>`` into a fresh venv; its ``bin`` directory and pip's verbose output."""
    venv.create(venv_dir, with_pip=True)
    bin_dir = venv_dir / "bin"
    done = subprocess.run(
        [str(bin_dir / "python"), "-m", "pip", "install", "-v", "--disable-pip-version-check", str(target)],
        env=env,
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    output = done.stdout + done.stderr
    assert "Building wheel for progrouter" in output, output[-2000:]  # built here, not a cached wheel
    return bin_dir, output


def _installed(bin_dir: Path, env: dict[str, str]) -> tuple[str, list[str], list[str], str]:
    """The installed copy's package directory, compiled modules, stale modules and scheduler file."""
    assert "COMMAND" in _run([str(bin_dir / "progrouter"), "--help"], env)
    package, built, stale, scheduler = json.loads(_run([str(bin_dir / "python"), "-c", PROBE], env))
    assert package.startswith(bin_dir.parent.as_posix()), package  # the installed copy, not this checkout
    return package, built, stale, scheduler


def _run(command: list[str], env: dict[str, str]) -> str:
    done = subprocess.run(command, env=env, capture_output=True, text=True, cwd="/", timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


def test_the_sdist_installs_with_the_cores_compiled(tmp_path: Path) -> None:
    if shutil.which("cc") is None and shutil.which("gcc") is None:
        pytest.skip("no C compiler on this machine")
    env = _user_env()
    checkout = _checkout(tmp_path / "checkout")
    subprocess.run(
        [sys.executable, "-m", "build", "--sdist", "--outdir", str(tmp_path / "dist"), str(checkout)],
        env=env,
        check=True,
        capture_output=True,
    )
    (sdist,) = (tmp_path / "dist").glob("progrouter-*.tar.gz")
    bin_dir, output = _pip_install(sdist, tmp_path / "venv", env)
    assert FALLBACK not in output and "progrouter: mypyc failed" not in output, output[-4000:]
    _, built, stale, scheduler = _installed(bin_dir, env)
    assert sorted(built) == sorted(compiled.SOURCES)
    assert stale == []  # the wheel carries the digests of the sources it was built from
    assert not scheduler.endswith(".py"), scheduler


def test_the_checkout_installs_as_plain_python_without_a_compiler(tmp_path: Path) -> None:
    checkout = _checkout(tmp_path / "checkout")
    venv_dir = tmp_path / "venv"
    path = str(venv_dir / "bin")  # the venv's own commands, and no compiler
    env = _user_env(PATH=path, CC=str(tmp_path / "no-such-cc"))
    assert shutil.which("cc", path=path) is None and shutil.which("gcc", path=path) is None
    bin_dir, output = _pip_install(checkout, venv_dir, env)
    assert FALLBACK in output, output[-2000:]
    _, built, stale, scheduler = _installed(bin_dir, env)
    assert built == [] and stale == []
    assert scheduler.endswith("program/core/scheduler.py"), scheduler
