"""The package installs from a built wheel (not editable) and its commands work with the dashboard assets.

The wheel is built with ``python -m build``; it goes into a fresh venv with ``--no-deps``, the
dependencies coming from the test venv's site-packages through a path file (so the test needs no network),
and the installed ``progrouter`` serves ``/dashboard`` from its own copy of the files.
"""

from __future__ import annotations

import asyncio
import re
import subprocess
import sys
import sysconfig
import venv
from pathlib import Path

import aiohttp
import pytest

from progrouter import __version__
from support.factories import EngineFactory

pytestmark = pytest.mark.timeout(300)
ROOT = Path(__file__).resolve().parents[2]
LISTENING = re.compile(r"progrouter listening on (http://\S+)")


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh venv with the wheel built from this checkout installed; its ``bin`` directory."""
    tmp = tmp_path_factory.mktemp("wheel")
    dist = tmp / "dist"
    subprocess.run(
        [sys.executable, "-m", "build", "--wheel", "--no-isolation", "--outdir", str(dist), str(ROOT)],
        check=True,
        capture_output=True,
    )
    (wheel,) = dist.glob("progrouter-*.whl")
    assert wheel.name.startswith(f"progrouter-{__version__}-")
    env = tmp / "venv"
    venv.create(env, with_pip=True)
    python = env / "bin" / "python"
    site = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    (Path(site) / "test-deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    subprocess.run([str(python), "-m", "pip", "install", "-q", "--no-deps", str(wheel)], check=True)
    return env / "bin"


def test_the_wheel_carries_the_dashboard_and_the_version(installed: Path) -> None:
    probe = (
        "import progrouter, importlib.resources as r;"
        "print(progrouter.__file__); print(progrouter.__version__);"
        "print(r.files('progrouter.server').joinpath('dashboard', 'dashboard.js').read_text()[:40])"
    )
    out = subprocess.run(
        [str(installed / "python"), "-c", probe], check=True, capture_output=True, text=True
    ).stdout.splitlines()
    assert out[0].startswith(str(installed.parent)), out[0]  # the installed copy, not this checkout
    assert out[1] == __version__
    assert out[2].startswith("// progrouter dashboard")
    help_text = subprocess.run(
        [str(installed / "progrouter"), "serve", "--help"], check=True, capture_output=True, text=True
    ).stdout
    assert "--log-format" in help_text and "--dashboard" in help_text


async def test_the_installed_router_serves_the_dashboard(
    installed: Path, make_engine: EngineFactory, client: aiohttp.ClientSession
) -> None:
    engine = await make_engine()
    process = await asyncio.create_subprocess_exec(
        str(installed / "progrouter"),
        "serve",
        "--worker-urls",
        engine.url,
        "--port",
        "0",
        "--prometheus-port",
        "0",
        "--enable-program-scheduling",
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        assert process.stderr is not None
        url = None
        async with asyncio.timeout(60):
            while url is None:
                line = (await process.stderr.readline()).decode()
                assert line, "progrouter serve exited"
                found = LISTENING.search(line)
                url = None if found is None else found.group(1)
        for path, marker in (("/dashboard", "<table>"), ("/dashboard/dashboard.css", ".rank")):
            async with client.get(url + path) as response:
                assert response.status == 200 and marker in await response.text()
    finally:
        process.terminate()
        await process.wait()
