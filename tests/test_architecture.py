"""The design's one rule, checked: the cores are sans-I/O and the arrows point one way (DESIGN.md)."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

import progrouter.program

SRC = Path(__file__).resolve().parents[1] / "src" / "progrouter"
IO_MODULES = {"asyncio", "aiohttp", "time", "socket", "uvloop", "threading", "zmq"}
# The engine package also carries its own HTTP shell; these files are that shell, not the core.
ENGINE_SHELL = {"server.py", "cli.py", "fidelity.py", "kv_events_publisher.py", "__init__.py"}
# Which top-level progrouter packages each package may import (besides itself).
ALLOWED = {
    "config": set(),
    "routing": {"config"},
    "program": {"config", "routing"},
    # shell-side but sans-I/O: identity, estimate, usage, residency prompts around the scheduler
    "agents": {"config", "routing", "program"},
    "engine": {"config"},
    "observe": {"config", "routing", "program"},
    # talks HTTP and knows no router internals; from the engine it takes data (profiles, which bench hands
    # to the emulators it launches) and the block-hash chain its prompts are keyed by
    "workload": {"config", "engine"},
    "sim": {"config", "routing", "program", "agents", "engine", "workload"},
    # the Envoy ext_proc shell: the cores, the server's pure pieces (never its proxy: see below), the vLLM
    # /metrics parsing (its counter usage), and config_cli (the flags generated from the settings models)
    "epp": {"config", "config_cli", "routing", "program", "agents", "server", "observe"},
}
# The simulator drives the cores in virtual time: it never loads the HTTP stack, an event loop or the
# console (its CLI, sim/cli.py, is a shell and may).
SIMULATOR_NEVER_LOADS = ("aiohttp", "asyncio", "uvloop", "rich")


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


SERVER = SRC / "server"
# The worker hop's decisions (retries, the circuit breaker) take explicit times: sans-I/O like the cores. Only
# its client and the health loop talk to workers.
HOP_TALKS = {"worker_client.py", "health.py", "__init__.py"}


def _core_files() -> list[Path]:
    files = sorted((SRC / "program").rglob("*.py")) + sorted((SRC / "routing").glob("*.py"))
    files += sorted((SRC / "agents").glob("*.py"))
    files += [p for p in sorted((SERVER / "hop").glob("*.py")) if p.name not in HOP_TALKS]
    files += [p for p in sorted((SRC / "engine").glob("*.py")) if p.name not in ENGINE_SHELL]
    return files


@pytest.mark.parametrize("path", _core_files(), ids=lambda p: f"{p.parent.name}/{p.name}")
def test_cores_do_no_io(path: Path) -> None:
    bad = {name for name in _imports(path) if name.split(".")[0] in IO_MODULES}
    assert not bad, f"{path.relative_to(SRC)} imports {sorted(bad)}"


@pytest.mark.parametrize("package", sorted(ALLOWED))
def test_arrows_point_one_way(package: str) -> None:
    paths = [SRC / "config.py"] if package == "config" else sorted((SRC / package).rglob("*.py"))
    assert paths
    for path in paths:
        if package == "engine" and path.name in ENGINE_SHELL:
            continue
        for name in _imports(path):
            parts = name.split(".")
            if parts[0] != "progrouter" or len(parts) < 2:
                continue
            assert parts[1] in ALLOWED[package] | {package}, f"{path.relative_to(SRC)} imports {name}"


def _progrouter_imports(path: Path) -> set[str]:
    return {name for name in _imports(path) if name.split(".")[0] == "progrouter"}


def _within(name: str, packages: set[str]) -> bool:
    """``name`` is one of ``packages`` (dotted, below ``progrouter``) or a module inside one."""
    return any(name == f"progrouter.{p}" or name.startswith(f"progrouter.{p}.") for p in packages)


# Each package of server/ by its job, and what it may import besides the standard library and third parties.
SERVER_PACKAGES = {
    # the client edge: what every request crosses before a handler runs; it knows the config and itself
    # only, so no routing, Program or proxy code can weaken a refusal (and the edge can be read on its own)
    "edge": {"config", "server.edge"},
    # the worker hop: speaks HTTP/1.1 to workers and decides retries, the breaker and health; no router
    # internals
    "hop": {"config", "server.hop"},
    # metrics, logs (every line carries the request id), traces and the event feed
    "telemetry": {"config", "server.telemetry", "server.edge.request_id"},
    # the Program shell: the scheduler's surface and its agents, the observation and residency feeds
    "gate": {
        "config",
        "agents",
        "engine",
        "observe",
        "program",
        "routing",
        "server.gate",
        "server.telemetry",
        "server.dashboard.summary",
    },
    # the dashboard: the scheduler's read-only view, served as admin routes from the router's state
    "dashboard": {"config", "program", "server.dashboard", "server.edge", "server.state"},
}


def _server_package_files() -> list[Path]:
    return [p for package in sorted(SERVER_PACKAGES) for p in sorted((SERVER / package).glob("*.py"))]


@pytest.mark.parametrize("path", _server_package_files(), ids=lambda p: f"{p.parent.name}/{p.name}")
def test_each_server_package_imports_only_what_its_job_needs(path: Path) -> None:
    allowed = set(SERVER_PACKAGES[path.parent.name])
    if path.parent.name == "edge" and path.name in EDGE_STATEFUL:
        allowed.add("server.state")
    for imported in _progrouter_imports(path):
        assert _within(imported, allowed), f"server/{path.parent.name}/{path.name} imports {imported}"


def test_the_server_package_rules_cover_every_package() -> None:
    """A new sub-package of server/ gets a rule: every directory with modules is listed above."""
    packages = {p.parent.name for p in SERVER.glob("*/*.py")}
    assert packages == set(SERVER_PACKAGES), packages ^ set(SERVER_PACKAGES)


# Of the edge, two modules also read the router's state: the middleware (it counts requests in progress and
# orders the rules) and the drain (it refuses new work while draining). The rules themselves import neither
# them nor the state, so each refusal can be read on its own.
EDGE_STATEFUL = {"middleware.py", "drain.py"}
EDGE_RULES = [p for p in sorted((SERVER / "edge").glob("*.py")) if p.name not in EDGE_STATEFUL]


@pytest.mark.parametrize("path", EDGE_RULES, ids=lambda p: p.name)
def test_the_edge_rules_stand_alone(path: Path) -> None:
    stateful = {f"progrouter.server.edge.{name[:-3]}" for name in EDGE_STATEFUL}
    reaching = stateful | {"progrouter.server.state"}
    assert not _progrouter_imports(path) & reaching, f"server/edge/{path.name}"


def test_the_edge_rule_can_fail() -> None:
    """The checks above can fail: the middleware does reach the router's state, which is outside the edge."""
    middleware = _progrouter_imports(SERVER / "edge" / "middleware.py")
    assert "progrouter.server.state" in middleware
    assert not _within("progrouter.server.state", SERVER_PACKAGES["edge"])


# The front door (front.py) serves the hot routes below aiohttp's web layer, through the same edge and the
# same proxy as aiohttp's server: it calls ``Edge.admit`` and ``proxy_request`` and re-implements no rule.
# The proxy reads requests as an ``Exchange`` only; aiohttp's request type stays in its adapter, handle_post.
FRONT_MAY_IMPORT = {"config", "server.edge", "server.proxy"}


def test_the_front_door_reuses_the_edge_and_the_proxy() -> None:
    front = SERVER / "front.py"
    imported = _progrouter_imports(front)
    assert all(_within(name, FRONT_MAY_IMPORT) for name in imported), sorted(imported)
    text = front.read_text()
    for used in ("edge.admit(", "proxy_request(", ".decorate(", "body_timed_out("):
        assert used in text, used
    proxy = (SERVER / "proxy.py").read_text()
    assert proxy.count("web.Request") == 1  # handle_post's signature


# The worker client: one module that speaks HTTP/1.1 to workers and knows no router internals; every proxied
# request goes through it, never through aiohttp's client (which stays for health checks, the poller and the
# admin fan-outs).
def test_the_worker_client_stands_alone_and_carries_every_proxied_request() -> None:
    imported = _progrouter_imports(SERVER / "hop" / "worker_client.py")
    assert not imported, sorted(imported)
    proxy = (SERVER / "proxy.py").read_text()
    assert "progrouter.server.hop.worker_client" in _imports(SERVER / "proxy.py")
    for forbidden in ("ClientSession", "ClientResponse", "state.session", ".session"):
        assert forbidden not in proxy, forbidden


def test_outside_the_gate_the_program_shell_is_reached_through_its_contract() -> None:
    """The proxy, the router's state and the EPP depend on the gate's contract (``gate/contract.py``), not on
    the scheduler's shell: only the gate package imports its other modules."""
    shell = {"progrouter.server.gate.program_gate", "progrouter.server.gate.program_metrics"}
    shell.add("progrouter.server.gate.program_residency")
    outside = [p for p in sorted(SRC.rglob("*.py")) if p.parent != SERVER / "gate"]
    readers = [str(p.relative_to(SRC)) for p in outside if _progrouter_imports(p) & shell]
    assert readers == [], readers


def _loaded_after_importing(modules: list[str], watched: tuple[str, ...]) -> str:
    """Which of ``watched`` a fresh interpreter has loaded after importing ``modules`` (a printed list)."""
    probe = (
        "import importlib, sys\n"
        f"for name in {modules!r}: importlib.import_module(name)\n"
        f"print(sorted(m for m in {watched!r} if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout
    return out.strip()


def test_the_simulator_imports_only_cores_and_pure_helpers() -> None:
    modules = sorted(
        f"progrouter.sim.{p.stem}"
        for p in (SRC / "sim").glob("*.py")
        if p.name not in ("cli.py", "__init__.py")
    )
    loaded = _loaded_after_importing(["progrouter.sim", *modules], SIMULATOR_NEVER_LOADS)
    assert loaded == "[]", f"the simulator loads {loaded}"


def test_the_simulator_probe_sees_a_shell() -> None:
    """The probe above can fail: the simulator's CLI (a shell) does load the console."""
    probe = "import sys, progrouter.sim.cli; print('rich' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "True"


def test_top_is_a_client_of_the_stream_only() -> None:
    """`progrouter top` reads the dashboard stream over HTTP; it imports no router or scheduler code."""
    imported = _progrouter_imports(SRC / "top.py")
    assert not imported, imported


def test_no_shell_reaches_into_the_scheduler() -> None:
    """Shells read scheduler state through its API (``diagnostics``, the read-only ``view``), never its
    private parts."""
    outside = [p for p in sorted(SRC.rglob("*.py")) if p.relative_to(SRC).parts[0] != "program"]
    readers = [str(p.relative_to(SRC)) for p in outside if re.search(r"scheduler\._[a-z]", p.read_text())]
    assert readers == [], readers


BENCH = SRC.parents[1] / "bench"


def _surface_breaches(path: Path) -> list[str]:
    """The imports in ``path`` of anything below ``progrouter.program`` (the surface is the package)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    found: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            modules = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            modules = [node.module]
            if node.module == "progrouter.program":  # ``from progrouter.program import core``
                surface = set(progrouter.program.__all__)
                modules += [f"progrouter.program.{a.name}" for a in node.names if a.name not in surface]
        else:
            continue
        for name in modules:
            parts = name.split(".")
            if parts[:2] != ["progrouter", "program"] or len(parts) == 2:
                continue
            found.append(f"{path.name}:{node.lineno} imports {name}")
    return found


def test_shells_import_only_the_program_surface() -> None:
    """Outside program/, the scheduler is ``progrouter.program`` (its ``__init__``), never a submodule: the
    components, formulas and variants can move inside without a shell noticing."""
    shells = [p for p in sorted(SRC.rglob("*.py")) if p.relative_to(SRC).parts[0] != "program"]
    shells += sorted(BENCH.rglob("*.py"))
    assert len(shells) > 50
    breaches = [breach for path in shells for breach in _surface_breaches(path)]
    assert breaches == [], breaches


def test_the_surface_check_finds_a_submodule_import(tmp_path: Path) -> None:
    """The check above can fail: a submodule, a sub-package and a type-only import are each found."""
    shell = tmp_path / "shell.py"
    shell.write_text(
        "from typing import TYPE_CHECKING\n"
        "from progrouter.program import ProgramScheduler, core\n"
        "import progrouter.program.formulas.ttl_fit\n"
        "from progrouter.program.identity import extract_identity\n"
        "if TYPE_CHECKING:\n"
        "    from progrouter.program.core.state import Program\n"
    )
    assert _surface_breaches(shell) == [
        "shell.py:2 imports progrouter.program.core",
        "shell.py:3 imports progrouter.program.formulas.ttl_fit",
        "shell.py:4 imports progrouter.program.identity",
        "shell.py:6 imports progrouter.program.core.state",
    ]


def _program_module(path: Path) -> str:
    """``path``'s module inside program/, dotted (``core.lifecycle``; ``core`` for ``core/__init__.py``)."""
    return ".".join(path.relative_to(SRC / "program").with_suffix("").parts).removesuffix(".__init__")


def _program_imports(path: Path) -> set[str]:
    """The program/ modules ``path`` imports, type-only (``TYPE_CHECKING``) imports included."""
    names: set[str] = set()
    for name in _imports(path):
        parts = name.split(".")
        if parts[:2] == ["progrouter", "program"] and len(parts) > 2:
            names.add(".".join(parts[2:]))
    tree = ast.parse(path.read_text(), filename=str(path))
    for node in ast.walk(tree):  # ``from progrouter.program.formulas import warmup``
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("progrouter.program"):
            package = node.module.split(".")[2:]
            for alias in node.names:
                if (SRC / "program" / Path(*package, f"{alias.name}.py")).exists():
                    names.add(".".join([*package, alias.name]))
    return names - {_program_module(path), ""}


def _cycle(graph: dict[str, set[str]]) -> list[str]:
    """One import cycle of ``graph`` (module -> modules it imports), or [] if it has none."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done

    def visit(module: str, path: list[str]) -> list[str]:
        state[module] = 1
        for imported in sorted(graph.get(module, ())):
            if state.get(imported) == 1:
                return [*path[path.index(imported) :], imported]
            if imported not in state:
                found = visit(imported, [*path, imported])
                if found:
                    return found
        state[module] = 2
        return []

    for module in sorted(graph):
        if module not in state:
            found = visit(module, [module])
            if found:
                return found
    return []


def test_the_program_modules_import_each_other_without_a_cycle() -> None:
    """Every module of program/ stands on the ones below it: no import cycle, type-only imports included,
    so each component can be read (and built) from its dependencies up."""
    graph = {
        _program_module(p): _program_imports(p)
        for p in sorted((SRC / "program").rglob("*.py"))
        if p != SRC / "program" / "__init__.py"
    }
    assert {"core.lifecycle", "formulas.ttl_fit", "variants.acting_ttl"} <= set(graph)
    assert _cycle(graph) == [], " -> ".join(_cycle(graph))


def test_the_cycle_check_finds_a_type_only_cycle() -> None:
    """The check above can fail: a cycle closed by a ``TYPE_CHECKING`` import is found."""
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) == []


# What the EPP must never load: Envoy is its proxy, so the aiohttp proxy and the app that wires it stay out.
EPP_NEVER_LOADS = ("progrouter.server.proxy", "progrouter.server.app", "progrouter.server.runner")


def test_the_epp_never_loads_the_proxy() -> None:
    modules = sorted(
        f"progrouter.epp.{p.stem}" for p in (SRC / "epp").glob("*.py") if p.name != "__init__.py"
    )
    assert modules
    loaded = _loaded_after_importing(modules, EPP_NEVER_LOADS)
    assert loaded == "[]", f"the EPP loads {loaded}"


def test_the_epp_probe_sees_the_proxy_when_it_is_loaded() -> None:
    """The probe above can fail: `serve`'s app does load the proxy."""
    probe = "import sys, progrouter.server.app; print('progrouter.server.proxy' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "True"
