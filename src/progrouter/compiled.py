"""Which modules are compiled with mypyc, and whether the compiled copies still match their sources.

The two sans-I/O cores run every scheduling decision and every emulated engine step; compiled from the same
typed source (mypy --strict) they cost about half as much CPU, with the same decisions. ``setup.py`` reads
``SOURCES`` from this file without importing the package (so it imports the standard library only), builds
one extension per module and records each source's digest in ``DIGESTS``. An extension module shadows its
``.py`` on import, so a source edited after the build would silently not run: ``stale`` names those, the
test suite refuses to start on them and ``make`` rebuilds them. ``PROGROUTER_COMPILE=0`` at build time
builds nothing and the package runs as plain Python.

Left out on purpose: ``program/types.py``, whose exceptions give their HTTP status as a class attribute each
subclass overrides (compiled, ``PoolFull`` answered the base class's 500), and the observer protocol and its
Prometheus implementation (mypyc 2.4 cannot compile a method with ``**labels`` after a defaulted argument).
"""

from __future__ import annotations

import hashlib
import importlib.machinery
import json
import os
import sys
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent
DIGESTS = "_compiled.json"  # beside this file: {module path: sha256 of the source it was built from}

_PROGRAM = (
    "core/admission core/agenda core/binding core/demand core/diagnostics core/dispatch core/factors"
    " core/fleet core/force_resume core/ledger core/lifecycle core/lineage core/queues core/rank_capacity"
    " core/rank_facts core/records core/request_pool core/resume core/resume_order core/scheduler"
    " core/state core/table core/telemetry core/timers formulas/accounting formulas/batch_gain"
    " formulas/force_resume formulas/freshness formulas/growth formulas/repair formulas/ttl_fit"
    " formulas/ttl_pricing formulas/ttl_weighing variants/acting_ttl variants/adaptive_ttl variants/migration"
    " variants/warmup outcomes residency"
)
#: the shell-side pieces every Program request passes through (driver, identity, estimate, usage, residency)
_AGENTS = "driver identity residency_prompts token_estimator usage"
_ENGINE = "block_pool kv_cache_manager scheduler request core cost"
#: the Program gate (every Program request's acquire and finish) and the hash ring's key: our own types on
#: both sides; the rest of the server is left out — aiohttp's C objects are not the types its stubs declare
_SHELL = "server/gate/program_gate routing/hash_key routing/hash_ring"

#: the compiled modules' sources, relative to the package directory
SOURCES: tuple[str, ...] = tuple(
    [f"program/{name}.py" for name in _PROGRAM.split()]
    + [f"agents/{name}.py" for name in _AGENTS.split()]
    + [f"engine/{name}.py" for name in _ENGINE.split()]
    + [f"{path}.py" for path in _SHELL.split()]
)


def digest(source: Path) -> str:
    return hashlib.sha256(source.read_bytes()).hexdigest()


def built(source: str, package: Path = PACKAGE) -> list[Path]:
    """The extension modules beside ``source`` (what import loads instead of it)."""
    stem = (package / source).with_suffix("")
    found = (stem.with_name(stem.name + suffix) for suffix in importlib.machinery.EXTENSION_SUFFIXES)
    return [path for path in found if path.exists()]


def compiled(package: Path = PACKAGE) -> list[str]:
    """The modules of ``SOURCES`` with an extension module beside their source."""
    return [source for source in SOURCES if built(source, package)]


def stale(package: Path = PACKAGE) -> list[str]:
    """Compiled modules whose source changed since the build (or whose build recorded no digest)."""
    present = compiled(package)
    if not present:
        return []
    path = package / DIGESTS
    recorded: dict[str, str] = json.loads(path.read_text()) if path.exists() else {}
    return [source for source in present if recorded.get(source) != digest(package / source)]


def up_to_date() -> tuple[bool, str]:
    """Whether ``make compile`` has nothing to do, and why."""
    present = compiled()
    if os.environ.get("PROGROUTER_COMPILE", "1") == "0":
        return True, f"PROGROUTER_COMPILE=0: plain Python ({len(present)} compiled modules left in place)"
    missing = sorted(set(SOURCES) - set(present))
    if missing:
        return False, f"{len(missing)} of {len(SOURCES)} modules not compiled yet"
    changed = stale()
    if changed:
        return False, f"sources changed since the build: {', '.join(changed)}"
    return True, f"{len(SOURCES)} modules compiled and current"


if __name__ == "__main__":
    done, why = up_to_date()
    print(f"progrouter.compiled: {why}")
    sys.exit(0 if done else 1)
