"""The design's one rule, checked: the cores are sans-I/O and the arrows point one way (DESIGN.md)."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

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


# Sans-I/O pieces of the router shell: decisions on explicit times, no sockets, no clocks of their own.
SERVER_CORES = ("retry.py", "circuit_breaker.py")


def _core_files() -> list[Path]:
    files = sorted((SRC / "program").glob("*.py")) + sorted((SRC / "routing").glob("*.py"))
    files += sorted((SRC / "agents").glob("*.py"))
    files += [SRC / "server" / name for name in SERVER_CORES]
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


# The client edge: what every request crosses before a handler runs. It knows the config and itself only, so
# no routing, Program or proxy code can weaken a refusal (and the edge can be read on its own).
# exchange.py is the shape of a request the edge reads, whichever server carries it (no router code).
EDGE = {"auth.py", "connection.py", "cors.py", "errors.py", "exchange.py", "headers.py", "log_hygiene.py"}


@pytest.mark.parametrize("name", sorted(EDGE))
def test_the_edge_stands_alone(name: str) -> None:
    for imported in _imports(SRC / "server" / name):
        parts = imported.split(".")
        if parts[0] != "progrouter":
            continue
        assert imported == "progrouter.config" or (parts[1] == "server" and f"{parts[2]}.py" in EDGE), (
            f"server/{name} imports {imported}"
        )


# The router's one edge middleware (edge.py) orders those rules plus the two that read the router's state (the
# drain) or stamp the request (its id); nothing from routing, Program scheduling or the proxy.
EDGE_MIDDLEWARE_IMPORTS = {f"progrouter.server.{name[:-3]}" for name in EDGE} | {
    "progrouter.config",
    "progrouter.server.drain",
    "progrouter.server.request_id",
    "progrouter.server.state",
}


def test_the_edge_middleware_composes_edge_rules_only() -> None:
    imported = {name for name in _imports(SRC / "server" / "edge.py") if name.startswith("progrouter")}
    assert imported <= EDGE_MIDDLEWARE_IMPORTS, sorted(imported - EDGE_MIDDLEWARE_IMPORTS)


# The front door (front.py) serves the hot routes below aiohttp's web layer, through the same edge and the
# same proxy as aiohttp's server: it calls ``Edge.admit`` and ``proxy_request`` and re-implements no rule.
# The proxy reads requests as an ``Exchange`` only; aiohttp's request type stays in its adapter, handle_post.
FRONT_MAY_IMPORT = {
    "progrouter.config",
    "progrouter.server.connection",  # the connection guard, the body deadline, aiohttp's protocol
    "progrouter.server.edge",
    "progrouter.server.errors",
    "progrouter.server.exchange",
    "progrouter.server.proxy",
    "progrouter.server.request_id",  # the context variable only
}


def test_the_front_door_reuses_the_edge_and_the_proxy() -> None:
    front = SRC / "server" / "front.py"
    imported = {name for name in _imports(front) if name.startswith("progrouter")}
    assert imported <= FRONT_MAY_IMPORT, sorted(imported - FRONT_MAY_IMPORT)
    text = front.read_text()
    for used in ("edge.admit(", "proxy_request(", ".decorate(", "body_timed_out("):
        assert used in text, used
    proxy = (SRC / "server" / "proxy.py").read_text()
    assert proxy.count("web.Request") == 1  # handle_post's signature


# The worker hop: one module that speaks HTTP/1.1 to workers and knows no router internals; every proxied
# request goes through it, never through aiohttp's client (which stays for health checks, the poller and the
# admin fan-outs).
def test_the_worker_hop_stands_alone_and_carries_every_proxied_request() -> None:
    imported = {
        name for name in _imports(SRC / "server" / "worker_client.py") if name.startswith("progrouter")
    }
    assert not imported, sorted(imported)
    proxy = (SRC / "server" / "proxy.py").read_text()
    assert "progrouter.server.worker_client" in _imports(SRC / "server" / "proxy.py")
    for forbidden in ("ClientSession", "ClientResponse", "state.session", ".session"):
        assert forbidden not in proxy, forbidden


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
    imported = {name for name in _imports(SRC / "server" / "top.py") if name.startswith("progrouter")}
    assert not imported, imported


def test_no_shell_reaches_into_the_scheduler() -> None:
    """Shells read scheduler state through its API (``diagnostics``, the read-only ``view``), never its
    private parts."""
    outside = [p for p in sorted(SRC.rglob("*.py")) if p.relative_to(SRC).parts[0] != "program"]
    readers = [str(p.relative_to(SRC)) for p in outside if re.search(r"scheduler\._[a-z]", p.read_text())]
    assert readers == [], readers


def _program_imports(path: Path) -> set[str]:
    """The program/ modules ``path`` imports, type-only (``TYPE_CHECKING``) imports included."""
    names: set[str] = set()
    for name in _imports(path):
        parts = name.split(".")
        if parts[:2] == ["progrouter", "program"] and len(parts) > 2:
            names.add(parts[2])
    tree = ast.parse(path.read_text(), filename=str(path))
    for node in ast.walk(tree):  # ``from progrouter.program import lifecycle``
        if isinstance(node, ast.ImportFrom) and node.module == "progrouter.program":
            names.update(a.name for a in node.names if (SRC / "program" / f"{a.name}.py").exists())
    return names - {path.stem, "__init__"}


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
        p.stem: _program_imports(p) for p in sorted((SRC / "program").glob("*.py")) if p.stem != "__init__"
    }
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
