"""The emulator over loopback HTTP: vLLM's API, usage, metrics, DP routing, streaming, errors, faults."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from progrouter.config import PrefillCostModel
from support.factories import EngineFactory

from .http_helpers import metrics, sample, words

pytestmark = pytest.mark.timeout(60)


async def complete(http: aiohttp.ClientSession, url: str, body: dict[str, Any], **kw: Any) -> dict[str, Any]:
    async with http.post(url + "/v1/completions", json=body, **kw) as resp:
        data: dict[str, Any] = await resp.json()
        assert resp.status == 200, data
        return data


async def test_second_request_with_same_prefix_reports_cached_tokens(
    make_engine: EngineFactory, http: aiohttp.ClientSession
) -> None:
    eng = await make_engine()
    shared = words(300)
    first = await complete(http, eng.url, {"prompt": shared + " first tail", "max_tokens": 4})
    second = await complete(http, eng.url, {"prompt": shared + " second tail", "max_tokens": 4})
    assert first["usage"]["prompt_tokens"] == 302
    assert first["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    assert second["usage"]["prompt_tokens_details"]["cached_tokens"] == 288  # 18 whole blocks of 16
    assert second["usage"]["completion_tokens"] == 4
    assert second["choices"][0]["finish_reason"] == "length"
    m = await metrics(http, eng.url)
    assert sample(m, "vllm:prompt_tokens_cached_total", 0) == 288
    assert sample(m, "vllm:prompt_tokens_total", 0) == 604
    assert sample(m, "vllm:prefix_cache_hits_total", 0) == 288
    assert sample(m, "vllm:generation_tokens_total", 0) == 8


async def test_metrics_parse_with_vllm_names_and_labels(
    make_engine: EngineFactory, http: aiohttp.ClientSession
) -> None:
    eng = await make_engine(data_parallel_size=2, block_size=32, num_blocks=300)
    await complete(
        http, eng.url, {"prompt": words(50), "max_tokens": 3}, headers={"X-data-parallel-rank": "1"}
    )
    async with http.get(eng.url + "/metrics") as resp:
        families = {f.name: f for f in text_string_to_metric_families(await resp.text())}
    for name in (
        "vllm:num_requests_running",
        "vllm:num_requests_waiting",
        "vllm:kv_cache_usage_perc",
        "vllm:cache_config_info",
    ):
        assert families[name].type == "gauge"
        assert {s.labels["engine"] for s in families[name].samples} == {"0", "1"}
    for name in (
        "vllm:prompt_tokens",
        "vllm:prompt_tokens_cached",
        "vllm:generation_tokens",
        "vllm:prefix_cache_queries",
        "vllm:prefix_cache_hits",
        "vllm:num_preemptions",
    ):
        assert families[name].type == "counter"
        assert all(s.name == name + "_total" for s in families[name].samples)
    info = families["vllm:cache_config_info"].samples[0].labels
    assert info["block_size"] == "32" and info["num_gpu_blocks"] == "300"
    for name in ("vllm:time_to_first_token_seconds", "vllm:e2e_request_latency_seconds"):
        fam = families[name]
        assert fam.type == "histogram"
        counts = {s.labels["engine"]: s.value for s in fam.samples if s.name == name + "_count"}
        assert counts == {"0": 0, "1": 1}
    m = await metrics(http, eng.url)
    assert sample(m, "vllm:generation_tokens_total", 1) == 3
    assert sample(m, "vllm:generation_tokens_total", 0) == 0


async def test_dp_header_routes_and_out_of_range_is_400(
    make_engine: EngineFactory, http: aiohttp.ClientSession
) -> None:
    eng = await make_engine(data_parallel_size=3)
    for rank in (2, 0, 2):
        await complete(
            http, eng.url, {"prompt": words(20), "max_tokens": 2}, headers={"X-data-parallel-rank": str(rank)}
        )
    m = await metrics(http, eng.url)
    assert [sample(m, "vllm:request_success_total", r, finished_reason="length") for r in range(3)] == [
        1,
        0,
        2,
    ]
    for bad in ("3", "-1", "x"):
        async with http.post(
            eng.url + "/v1/completions", json={"prompt": "a b"}, headers={"X-data-parallel-rank": bad}
        ) as resp:
            assert resp.status == 400
            body = await resp.json()
            assert body["error"]["code"] == 400 and body["error"]["type"] == "BadRequestError"
    async with http.post(
        eng.url + "/v1/completions", json={"prompt": "a b"}, headers={"X-data-parallel-rank": "3"}
    ) as resp:
        assert "out of range" in (await resp.json())["error"]["message"]


async def test_without_header_the_least_loaded_rank_serves(
    make_engine: EngineFactory, http: aiohttp.ClientSession
) -> None:
    eng = await make_engine(data_parallel_size=2, time_scale=1.0)
    busy = asyncio.ensure_future(
        complete(
            http, eng.url, {"prompt": words(10), "max_tokens": 2000}, headers={"X-data-parallel-rank": "0"}
        )
    )
    while eng.server.cores[0].num_running == 0:
        await asyncio.sleep(0.005)
    await complete(http, eng.url, {"prompt": words(10), "max_tokens": 2})
    m = await metrics(http, eng.url)
    assert sample(m, "vllm:request_success_total", 1, finished_reason="length") == 1
    assert sample(m, "vllm:num_requests_running", 0) == 1
    busy.cancel()


async def read_sse(resp: aiohttp.ClientResponse) -> list[Any]:
    events = []
    async for raw in resp.content:
        line = raw.decode().strip()
        if line.startswith("data: "):
            payload = line.removeprefix("data: ")
            events.append(payload if payload == "[DONE]" else json.loads(payload))
    return events


async def test_streaming_completion_chunks_and_usage(
    make_engine: EngineFactory, http: aiohttp.ClientSession
) -> None:
    eng = await make_engine()
    body = {"prompt": words(40), "max_tokens": 5, "stream": True, "stream_options": {"include_usage": True}}
    async with http.post(eng.url + "/v1/completions", json=body) as resp:
        assert resp.status == 200
        assert resp.headers["Content-Type"].startswith("text/event-stream")
        events = await read_sse(resp)
    assert events[-1] == "[DONE]"
    chunks, usage = events[:-2], events[-2]
    assert len(chunks) == 5
    assert all(c["object"] == "text_completion" and len(c["choices"]) == 1 for c in chunks)
    assert [c["choices"][0]["finish_reason"] for c in chunks] == [None] * 4 + ["length"]
    assert all(
        c["choices"][0]["text"].startswith(" tok") or c["choices"][0]["text"].startswith(" ") for c in chunks
    )
    assert usage["choices"] == []
    assert usage["usage"] == {
        "prompt_tokens": 40,
        "total_tokens": 45,
        "completion_tokens": 5,
        "prompt_tokens_details": {"cached_tokens": 0},
    }
    plain = {"prompt": words(40), "max_tokens": 3, "stream": True}
    async with http.post(eng.url + "/v1/completions", json=plain) as resp:
        events = await read_sse(resp)
    assert len(events) == 4 and all("usage" not in e for e in events[:-1])


async def test_streaming_chat_role_then_content(
    make_engine: EngineFactory, http: aiohttp.ClientSession
) -> None:
    eng = await make_engine()
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": words(30)}]
    body = {"messages": messages, "max_tokens": 4, "stream": True, "stream_options": {"include_usage": True}}
    async with http.post(eng.url + "/v1/chat/completions", json=body) as resp:
        events = await read_sse(resp)
    assert events[0]["object"] == "chat.completion.chunk"
    assert events[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    contents = [e["choices"][0]["delta"]["content"] for e in events[1:5]]
    assert all(c.strip() for c in contents)
    assert events[4]["choices"][0]["finish_reason"] == "length"
    # template: "<|system|> be brief <|end|> <|user|> w0..w29 <|end|> <|assistant|>" = 4 + 32 + 1 words
    assert events[5]["usage"]["prompt_tokens"] == 37
    # vLLM's chat also reports what the prefill wrote to the cache: the 2 whole blocks, none of them hits
    assert events[5]["usage"]["prompt_tokens_details"] == {"cached_tokens": 0, "created_cache_tokens": 32}
    async with http.post(eng.url + "/tokenize", json={"messages": messages}) as resp:
        assert (await resp.json())["count"] == 37
    async with http.post(
        eng.url + "/v1/chat/completions", json={"messages": messages, "max_tokens": 2}
    ) as resp:
        full = await resp.json()
    assert full["object"] == "chat.completion"
    assert full["choices"][0]["message"]["role"] == "assistant"
    assert full["usage"]["prompt_tokens_details"] == {"cached_tokens": 32, "created_cache_tokens": 0}


async def test_tokenize_detokenize_round_trip(
    make_engine: EngineFactory, http: aiohttp.ClientSession
) -> None:
    eng = await make_engine()
    async with http.post(eng.url + "/tokenize", json={"prompt": "hello  brave\nnew world hello"}) as resp:
        tok = await resp.json()
    assert tok["count"] == 5 and tok["tokens"][0] == tok["tokens"][4]
    assert tok["max_model_len"] == 4096
    async with http.post(eng.url + "/detokenize", json={"tokens": tok["tokens"]}) as resp:
        assert (await resp.json())["prompt"] == "hello brave new world hello"
    out = await complete(http, eng.url, {"prompt": "hello", "max_tokens": 6})
    async with http.post(eng.url + "/tokenize", json={"prompt": out["choices"][0]["text"]}) as resp:
        again = await resp.json()
    assert again["count"] == 6  # generated text re-tokenizes to one token per generated token
    async with http.post(eng.url + "/detokenize", json={"tokens": [1, 10**9]}) as resp:
        assert resp.status == 400


@pytest.mark.parametrize(
    ("body", "status", "needle"),
    [
        ({"max_tokens": 3}, 400, "prompt"),
        ({"prompt": ""}, 400, "prompt"),
        ({"prompt": words(5000)}, 400, "maximum context length is 4096"),
        (
            {"prompt": words(4000), "max_tokens": 200},
            400,
            "'max_tokens' or 'max_completion_tokens' is too large",
        ),
        ({"prompt": "a", "max_tokens": "many"}, 400, "max_tokens"),
        ({"prompt": "a", "max_tokens": 0}, 400, "max_tokens must be at least 1"),
        ({"prompt": "a", "stream": "yes please"}, 400, "stream"),
        ({"prompt": [1, -2]}, 400, "prompt"),
        ({"prompt": [5, 10**9]}, 400, "out of vocabulary"),
        (
            {"prompt": "a", "vllm_xargs": {"agentic_context": {"program_id": "p"}}},
            400,
            "Input should be a valid string",
        ),
        ({"prompt": "a", "vllm_xargs": "x"}, 400, "vllm_xargs"),
        ({"prompt": "a", "model": "other"}, 404, "does not exist"),
        ({"prompt": "a", "n": 2}, 400, "n must be 1"),
        ({"prompt": "a", "min_tokens": 5, "max_tokens": 2}, 400, "min_tokens"),
        ({"prompt": "a", "stream_options": {"include_usage": True}}, 400, "stream=True"),
    ],
)
async def test_bad_requests_get_vllm_like_errors(
    make_engine: EngineFactory, http: aiohttp.ClientSession, body: dict[str, Any], status: int, needle: str
) -> None:
    eng = await make_engine()
    async with http.post(eng.url + "/v1/completions", json=body) as resp:
        assert resp.status == status
        err = (await resp.json())["error"]
    assert needle in err["message"]
    assert err["code"] == status
    async with http.get(eng.url + "/health") as resp:
        assert resp.status == 200


async def test_malformed_bodies_and_accepted_xargs(
    make_engine: EngineFactory, http: aiohttp.ClientSession
) -> None:
    eng = await make_engine()
    async with http.post(eng.url + "/v1/completions", data=b"{not json") as resp:
        assert resp.status == 400
    async with http.post(eng.url + "/v1/completions", json=[1, 2]) as resp:
        assert resp.status == 400
    async with http.post(eng.url + "/v1/chat/completions", json={"messages": [{"content": "x"}]}) as resp:
        assert resp.status == 400
    xargs = {"agentic_context": '{"program_id": "p1"}', "n": 3, "f": 0.5, "l": ["a", 1, 2.5]}
    out = await complete(
        http,
        eng.url,
        {"prompt": "a b c", "max_tokens": 2, "vllm_xargs": xargs, "model": "progrouter-emulated"},
    )
    assert out["usage"]["completion_tokens"] == 2
    tokens = await complete(http, eng.url, {"prompt": [[5, 6, 7]], "max_tokens": 1})
    assert tokens["usage"]["prompt_tokens"] == 3


async def test_time_scale_runs_faster_and_reports_modelled_seconds(
    make_engine: EngineFactory, http: aiohttp.ClientSession
) -> None:
    eng = await make_engine(time_scale=500.0)
    loop = asyncio.get_running_loop()
    wall0 = loop.time()
    await complete(http, eng.url, {"prompt": words(3000), "max_tokens": 1000})
    wall = loop.time() - wall0
    m = await metrics(http, eng.url)
    e2e = sample(m, "vllm:e2e_request_latency_seconds_sum", 0)
    ttft = sample(m, "vllm:time_to_first_token_seconds_sum", 0)
    decode = eng.config.decode_throughput_model
    expected = PrefillCostModel().prefill_seconds(3000) + sum(
        decode.step_seconds(1, 3000 + i) for i in range(1, 1000)
    )
    assert ttft == pytest.approx(PrefillCostModel().prefill_seconds(3000), rel=1e-6)
    assert e2e == pytest.approx(expected, rel=1e-6)  # ~12 modelled seconds
    assert wall < e2e / 5  # 500x nominal; a loaded 2-core box still clears 5x


async def test_client_disconnect_aborts_and_frees_blocks(
    make_engine: EngineFactory, http: aiohttp.ClientSession
) -> None:
    eng = await make_engine(time_scale=1.0)
    core = eng.server.cores[0]
    body = {"prompt": words(500), "max_tokens": 3000, "stream": True}
    resp = await http.post(eng.url + "/v1/completions", json=body)
    await resp.content.readline()  # the first token has arrived
    assert core.num_running == 1 and core.kv_cache_usage() > 0
    resp.close()
    for _ in range(500):
        if core.num_running == 0:
            break
        await asyncio.sleep(0.01)
    assert core.num_running == 0
    assert core.kv_cache_usage() == 0.0
    assert core.stats.request_success["abort"] == 1


async def test_fault_switches(make_engine: EngineFactory, http: aiohttp.ClientSession) -> None:
    eng = await make_engine(data_parallel_size=2)
    r0 = {"X-data-parallel-rank": "0"}
    async with http.post(eng.url + "/admin/fault", json={"rank": 0, "mode": "refuse"}) as resp:
        assert (await resp.json())["ranks"][0]["mode"] == "refuse"
    async with http.post(eng.url + "/v1/completions", json={"prompt": "a"}, headers=r0) as resp:
        assert resp.status == 503
    await complete(http, eng.url, {"prompt": "a", "max_tokens": 1})  # no header: a healthy Rank serves
    async with http.get(eng.url + "/health") as resp:
        assert resp.status == 200
    async with http.post(eng.url + "/admin/fault", json={"rank": None, "mode": "refuse"}) as resp:
        assert resp.status == 200
    async with http.get(eng.url + "/health") as resp:
        assert resp.status == 503

    async with http.post(eng.url + "/admin/fault", json={"rank": None, "mode": "stall"}) as resp:
        assert resp.status == 200
    stalled = asyncio.ensure_future(complete(http, eng.url, {"prompt": "a b", "max_tokens": 3}, headers=r0))
    while eng.server.cores[0].num_waiting == 0:
        await asyncio.sleep(0.005)
    assert not stalled.done() and eng.server.cores[0].stats.num_steps == 0
    async with http.post(eng.url + "/admin/fault", json={"rank": 0, "mode": "none"}) as resp:
        assert resp.status == 200
    assert (await stalled)["usage"]["completion_tokens"] == 3

    async with http.post(eng.url + "/admin/fault", json={"rank": 0, "mode": "cut_streams"}) as resp:
        assert resp.status == 200
    body = {"prompt": "a b", "max_tokens": 50, "stream": True}
    with pytest.raises(aiohttp.ClientPayloadError):
        async with http.post(eng.url + "/v1/completions", json=body, headers=r0) as resp:
            await read_sse(resp)
    with pytest.raises(aiohttp.ClientConnectionError):
        async with http.post(eng.url + "/v1/completions", json={"prompt": "a b"}, headers=r0) as resp:
            await resp.read()
    assert eng.server.cores[0].num_running == 0

    async with http.post(eng.url + "/admin/fault", json={"mode": "none", "fail_rate": 1.0}) as resp:
        assert resp.status == 200
    async with http.post(eng.url + "/v1/completions", json={"prompt": "a"}) as resp:
        assert resp.status == 500
    async with http.post(eng.url + "/admin/fault", json={"rank": 7, "mode": "stall"}) as resp:
        assert resp.status == 400


async def test_info_endpoints(make_engine: EngineFactory, http: aiohttp.ClientSession) -> None:
    eng = await make_engine(model_name="m1", data_parallel_size=2)
    async with http.get(eng.url + "/v1/models") as resp:
        models = await resp.json()
    assert models["data"][0]["id"] == "m1" and models["data"][0]["max_model_len"] == 4096
    async with http.get(eng.url + "/server_info") as resp:
        info = await resp.json()
    assert info["config"]["data_parallel_size"] == 2 and len(info["ranks"]) == 2
    assert info["config"]["prefill_cost_model"]["intercept_seconds"] == PrefillCostModel().intercept_seconds
