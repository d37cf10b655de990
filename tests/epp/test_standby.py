"""Two pickers for one pool: Envoy sends every stream to the active one and, once it is gone, to the
standby (priority levels, gRPC health checks, ejection on the first refused connection).

The active runs as its own process and is killed with SIGKILL while a few agents (concurrent clients, one
Program each, a bounded loop of turns) keep sending. Every client request must have either succeeded, or
failed before it reached a worker with Envoy's 503 — or, when it was already being answered, been cut
(the worker saw it: the engine's own count says so). The standby then carries the traffic: the Programs
are rebuilt from their next requests, each once, and each request it routed completes there once. The
test prints the outage window (kill to the first success through the standby) and what the clients saw.
"""

from __future__ import annotations

import asyncio
import json
import signal
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import pytest

from integration.helpers import program_body, programs, wait_until, words
from integration.test_program_scheduling import CHAT
from progrouter.epp.bootstrap import NOT_ROUTED, ROUTED, epp_bootstrap
from progrouter.epp.envoy import RunningEnvoy, start_envoy
from progrouter.epp.service import start_epp
from support.factories import EngineFactory, router_config
from support.processes import _drain, _wait_for_line

from .conftest import program_config
from .test_cli import STARTED

pytestmark = pytest.mark.timeout(120)
AGENTS = 4
MAX_TURNS = 400
TURNS_AFTER_FAILOVER = 5  # each agent keeps going until this many of its turns succeeded via the standby
PAUSE_SECONDS = 0.02  # between one agent's turns (a tool call's worth, shortened)


@dataclass
class Outcomes:
    """What the clients saw, with the time of each request's end."""

    killed_at: float | None = None
    seen: list[tuple[float, str]] = field(default_factory=list)

    def after_kill(self, kind: str) -> int:
        return sum(1 for t, k in self.seen if k == kind and self.killed_at is not None and t > self.killed_at)


async def _turn(client: aiohttp.ClientSession, url: str, body: dict[str, Any], outcomes: Outcomes) -> str:
    try:
        async with client.post(url + CHAT, json=body) as response:
            text = await response.text()
            if response.status == 200:
                json.loads(text)  # the whole answer arrived
                kind = "200"
            elif response.status == 503 and ROUTED in text:
                kind = "503 routed"  # the worker had it; the picker died before the answer started
            elif response.status == 503 and NOT_ROUTED in text:
                kind = "503 not routed"
            else:
                kind = f"{response.status} {text[:100]}"
    except (aiohttp.ClientPayloadError, aiohttp.ServerDisconnectedError, json.JSONDecodeError):
        kind = "cut"  # the answer had started: Envoy reset the stream when the picker went away
    outcomes.seen.append((time.monotonic(), kind))
    return kind


async def _agent(
    index: int, client: aiohttp.ClientSession, url: str, outcomes: Outcomes, warm: asyncio.Event
) -> None:
    history = words(chr(ord("a") + index), 100)
    ok_after_kill = 0
    for turn in range(MAX_TURNS):
        history += " " + words("t", 10, 100 + 10 * turn)
        body = program_body(f"agent-{index}", history, max_tokens=16, kv_retention_ttl_seconds=30)
        kind = await _turn(client, url, body, outcomes)
        if kind == "200" and outcomes.killed_at is not None:
            ok_after_kill += 1
            if ok_after_kill >= TURNS_AFTER_FAILOVER:
                return
        if sum(1 for _, k in outcomes.seen if k == "200") >= 3 * AGENTS:
            warm.set()
        await asyncio.sleep(PAUSE_SECONDS)


async def _active_picker(
    worker: str, program: dict[str, Any], mode: str
) -> tuple[asyncio.subprocess.Process, str]:
    """``progrouter epp`` as its own process (so that it can be killed), on any free port."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "progrouter", "epp",
        "--worker-urls", worker, "--policy", "round_robin",
        "--host", "127.0.0.1", "--port", "0", "--admin-port", "0", "--prometheus-port", "off",
        "--enable-program-scheduling", "--program-scheduling-config-json", json.dumps(program),
        "--epp-response-body", mode, "--log-level", "info",
        stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    assert proc.stderr is not None
    try:
        grpc_address = (await _wait_for_line(proc.stderr, STARTED, 30)).group(1)
    except BaseException:
        proc.kill()
        await proc.wait()
        raise
    return proc, grpc_address


@pytest.mark.parametrize("mode", ["stream", "end"])
async def test_killing_the_active_picker_fails_over_to_the_standby(
    mode: str, make_engine: EngineFactory, client: aiohttp.ClientSession
) -> None:
    engine = await make_engine()
    program = program_config()
    standby = await start_epp(router_config([engine.url], program, epp_response_body=mode), admin_port=0)
    envoy: RunningEnvoy | None = None
    active: asyncio.subprocess.Process | None = None
    drainer: asyncio.Task[None] | None = None
    try:
        active, address = await _active_picker(engine.url, program, mode)
        assert active.stderr is not None
        drainer = asyncio.create_task(_drain(active.stderr, []))
        host, port = address.rsplit(":", 1)
        s_host, s_port = standby.grpc_address.rsplit(":", 1)
        envoy = await start_envoy(
            epp_bootstrap(
                (host, int(port)),
                queue_timeout_seconds=60,
                request_timeout_seconds=60,
                max_request_bytes=1 << 22,
                response_body=mode,
                standby=[(s_host, int(s_port))],
            )
        )
        await _until_routed(client, envoy.url)
        outcomes = Outcomes()
        warm = asyncio.Event()
        agents = [asyncio.create_task(_agent(i, client, envoy.url, outcomes, warm)) for i in range(AGENTS)]
        await asyncio.wait_for(warm.wait(), 30)
        active.send_signal(signal.SIGKILL)
        outcomes.killed_at = time.monotonic()
        await asyncio.wait_for(asyncio.gather(*agents), 60)

        kinds = Counter(kind for _, kind in outcomes.seen)
        first_ok = min(t for t, k in outcomes.seen if k == "200" and t > outcomes.killed_at)
        print(
            f"\n[{mode}] outage (kill to first success via the standby): "
            f"{(first_ok - outcomes.killed_at) * 1000:.0f} ms; what the clients saw: {dict(kinds)}"
        )
        assert set(kinds) <= {"200", "503 not routed", "503 routed", "cut"}, kinds
        assert outcomes.after_kill("200") >= AGENTS * TURNS_AFTER_FAILOVER
        # "not routed" is true: the engine finished exactly the answered, the cut and the routed requests.
        engine_seen = sum(engine.server.cores[0].stats.request_success.values())
        assert engine_seen == kinds["200"] + kinds["cut"] + kinds["503 routed"] + 1  # + the warm-up

        # The standby rebuilt each Program once, from its next request, and completed what it routed.
        async def diagnostics() -> dict[str, Any]:
            async with client.get(standby.admin_url + "/scheduling/diagnostics") as response:
                data: dict[str, Any] = await response.json()
                return data

        # (settled: the EPP completes a request when Envoy closes its stream, just after the client's end)
        d = await wait_until(
            diagnostics, lambda d: all(r["router_in_flight_requests"] == 0 for r in d["ranks"])
        )
        rebuilt = programs(d)
        assert len(rebuilt) == AGENTS
        routed = standby.registry.get_sample_value("progrouter_epp_decisions_total", {"decision": "program"})
        assert routed is not None and routed >= AGENTS * TURNS_AFTER_FAILOVER
        completed = sum(p["completed_requests"] for p in rebuilt)
        assert completed == routed  # each once: none lost, none counted twice
    finally:
        if envoy is not None:
            await envoy.stop()
        if active is not None and active.returncode is None:
            active.kill()
        if active is not None:
            await active.wait()
        if drainer is not None:
            await drainer
        await standby.stop()


async def _until_routed(client: aiohttp.ClientSession, url: str) -> None:
    """Envoy binds its listener once its first health checks of the pickers are done; it is ready once a
    request is answered (the warm-up request)."""
    deadline = time.monotonic() + 30
    while True:
        try:
            async with client.post(url + CHAT, json=program_body("warm-up", words("w", 20))) as response:
                if response.status == 200:
                    return
        except aiohttp.ClientConnectorError:
            pass
        assert time.monotonic() < deadline, "Envoy never routed a request"
        await asyncio.sleep(0.1)
