"""`mla-export serve --replicas N` on a local single-node Ray cluster: the Ray Serve application
(mla_export/server/ray_serve) with 2 engine replicas of the tiny export, f32 (exact against the
offline engine), through the official `openai` client and Ray Serve's HTTP proxy.

One cluster for the module (start-up is ~20 s); the fault test runs last because it kills a
replica. Skipped only when ray is not installed (CI installs it with the test extra).
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time

import httpx
import pytest

ray = pytest.importorskip("ray", reason="ray is not installed (pip install -e '.[ray]'; the test extra has it)")
openai = pytest.importorskip("openai")

from ray import serve  # noqa: E402

from server_helpers import free_port, metrics  # noqa: E402

PRECISION = "f32"  # replicas and the offline engine alike: greedy outputs must be equal
WAIT_S = 120.0  # waits for the cluster to converge (restart, stats); not a performance threshold


@pytest.fixture(scope="module")
def model_dir(exports):
    return exports.tiny()


@pytest.fixture(scope="module")
def offline(model_dir):
    from mla_export import LLM

    return LLM(model_dir, precision=PRECISION)


@pytest.fixture(scope="module")
def cluster(model_dir):
    """As `mla-export serve --replicas 2` runs it: direct ingress on `port` (the Serve controller
    reads its flags from the environment the local cluster inherits; flags.py)."""
    from mla_export.server.ray_serve.deployments import RaySettings, build_application
    from mla_export.server.ray_serve.flags import serve_env

    port = free_port()
    env = serve_env(port)
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    ray.init(num_cpus=4, include_dashboard=False, logging_level="ERROR", log_to_driver=False,
             object_store_memory=100 << 20)
    try:
        serve.start(http_options={"host": "127.0.0.1", "port": free_port()})  # Ray Serve's proxy: idle
        settings = RaySettings(out_dir=str(model_dir), model_name="tiny", replicas=2, max_num_seqs=16, max_queue=64,
                               engine_kwargs={"precision": PRECISION, "num_threads": 1,
                                              "max_num_batched_tokens": 256},
                               replica_cpus=1.0, shutdown_timeout_s=10.0, http_port=port)
        serve.run(build_application(settings), name="mla-test", route_prefix="/")
        yield f"http://127.0.0.1:{port}"
        serve.delete("mla-test")
        serve.shutdown()
    finally:
        ray.shutdown()
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def replicas(base: str) -> dict[str, dict[str, float]]:
    """{replica id: {"up", "requests", "prefix_cache_hits", "kv_blocks_used", "pid", ...}} from /metrics."""
    out: dict[str, dict[str, float]] = {}
    for key, v in metrics(base).items():
        if key.startswith("mla_replica_") and '{replica="' in key:
            name, rid = key.split("{replica=\"")
            out.setdefault(rid.rstrip('"}'), {})[name[len("mla_replica_"):].removesuffix("_total")] = v
    return out


async def _stream(c, prompt, max_tokens, **kw):
    """(replica, token ids, text, finish reason) of one streamed completion."""
    raw = await c.completions.with_raw_response.create(model="tiny", prompt=prompt, max_tokens=max_tokens,
                                                       temperature=0, stream=True,
                                                       extra_body={"return_token_ids": True, **kw})
    replica = raw.headers.get("x-mla-replica")
    ids, text, reason = [], "", None
    async for chunk in raw.parse():
        for ch in chunk.choices:
            ids += ch.token_ids
            text += ch.text
            reason = ch.finish_reason or reason
    return replica, ids, text, reason


def aclient(base):
    return openai.AsyncOpenAI(base_url=f"{base}/v1", api_key="unused", max_retries=0, timeout=300)


def test_32_streams_on_2_replicas_equal_offline_greedy(cluster, offline):
    prompts = [f"Stream {i}: the quick brown fox jumps over {i * 7} lazy dogs" for i in range(32)]
    max_tokens = [6 + (i % 5) * 4 for i in range(32)]
    want = {}
    for m in sorted(set(max_tokens)):
        ps = [p for p, k in zip(prompts, max_tokens) if k == m]
        for p, w in zip(ps, offline.generate(ps, max_tokens=m, temperature=0.0)):
            want[p] = w

    async def run():
        c = aclient(cluster)
        return await asyncio.gather(*(_stream(c, p, m) for p, m in zip(prompts, max_tokens)))

    before = {r: s.get("requests", 0) for r, s in replicas(cluster).items()}
    got = asyncio.run(run())
    for p, (_, ids, text, reason) in zip(prompts, got):
        w = want[p]
        assert (ids, text, reason) == (w.token_ids, w.text, w.finish_reason), p
    served = {r for r, *_ in got}
    assert len(served) == 2 and None not in served, served  # both replicas took streams
    after = replicas(cluster)
    assert sum(after[r]["requests"] - before.get(r, 0) for r in served) == 32
    assert all(after[r]["kv_blocks_used"] == 0 for r in served)


def test_openai_errors_are_the_same(cluster):
    c = openai.OpenAI(base_url=f"{cluster}/v1", api_key="unused", max_retries=0, timeout=60)
    with pytest.raises(openai.BadRequestError) as e:
        c.completions.create(model="tiny", prompt="hi", max_tokens=-1)
    assert e.value.status_code == 400
    with pytest.raises(openai.NotFoundError):
        c.completions.create(model="no-such-model", prompt="hi", max_tokens=2)
    assert [m.id for m in c.models.list().data] == ["tiny"]
    assert httpx.get(f"{cluster}/health", timeout=30).json() == {"status": "ok"}


def test_structured_outputs_cross_to_the_replicas(cluster, offline):
    """The grammar travels in the SamplingParams pickled to a replica, which compiles it in its engine."""
    from mla_export import SamplingParams, StructuredOutputsParams

    schema = {"type": "object", "properties": {"id": {"type": "integer", "minimum": 0, "maximum": 99},
                                               "ok": {"type": "boolean"}},
              "required": ["id", "ok"], "additionalProperties": False}
    so = StructuredOutputsParams(json=schema, disable_any_whitespace=True)
    want = offline.generate("Hello", SamplingParams(temperature=0.0, max_tokens=40, structured_outputs=so))[0]
    c = openai.OpenAI(base_url=f"{cluster}/v1", api_key="unused", max_retries=0, timeout=120)
    r = c.completions.create(model="tiny", prompt="Hello", max_tokens=40, temperature=0,
                             extra_body={"guided_json": schema, "structured_outputs": {"disable_any_whitespace": True}})
    assert (r.choices[0].text, r.choices[0].finish_reason) == (want.outputs[0].text, "stop")
    assert json.loads(r.choices[0].text).keys() == {"id", "ok"}
    with pytest.raises(openai.BadRequestError):
        c.completions.create(model="tiny", prompt="Hello", max_tokens=4, extra_body={"guided_regex": "a(b"})


def test_shared_prefix_goes_back_to_the_replica_that_holds_it(cluster):
    prefix = [(7 * i + 3) % 200 + 5 for i in range(96)]  # several whole KV blocks of one "system prompt"
    c = openai.OpenAI(base_url=f"{cluster}/v1", api_key="unused", max_retries=0, timeout=120)

    def ask(suffix):
        raw = c.completions.with_raw_response.create(model="tiny", prompt=prefix + suffix, max_tokens=4, temperature=0)
        raw.parse()
        return raw.headers["x-mla-replica"]

    first = ask([11, 12])
    before = replicas(cluster)
    others = [r for r in before if r != first]
    assert others, before
    served = [ask([20 + k, 30 + k]) for k in range(4)]
    assert served == [first] * 4
    after = replicas(cluster)
    assert after[first]["prefix_cache_hits"] > before[first]["prefix_cache_hits"]  # the prefix was reused there
    for r in others:
        assert after[r]["prefix_cache_hits"] == before[r]["prefix_cache_hits"]


def _wait(cond, what):
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        v = cond()
        if v:
            return v
        time.sleep(0.5)
    raise AssertionError(f"timed out waiting for {what}")


def test_killed_replica_fails_only_its_streams_and_is_replaced(cluster):
    n, max_tokens = 16, 160
    prompts = [[(31 * i + 17 * k) % 250 + 3 for k in range(8 + i)] for i in range(n)]  # no shared prefix

    async def run():
        c = aclient(cluster)
        started: dict[int, str] = {}
        all_started = asyncio.Event()

        async def one(i):
            raw = await c.completions.with_raw_response.create(
                model="tiny", prompt=prompts[i], max_tokens=max_tokens, temperature=0, stream=True,
                extra_body={"ignore_eos": True, "return_token_ids": True})
            started[i] = raw.headers["x-mla-replica"]
            if len(started) == n:
                all_started.set()
            ids = []
            try:
                async for chunk in raw.parse():
                    for ch in chunk.choices:
                        ids += ch.token_ids
            except openai.APIError as e:  # the SSE error event
                return started[i], "error", str(e), len(ids)
            return started[i], "ok", "", len(ids)

        tasks = [asyncio.ensure_future(one(i)) for i in range(n)]
        await asyncio.wait_for(all_started.wait(), WAIT_S)
        by_replica = {}
        for r in started.values():
            by_replica[r] = by_replica.get(r, 0) + 1
        victim = max(by_replica, key=by_replica.get)
        pid = int(replicas(cluster)[victim]["pid"])
        os.kill(pid, signal.SIGKILL)
        return victim, await asyncio.gather(*tasks)

    victim, results = asyncio.run(run())
    on_victim = [r for r in results if r[0] == victim]
    survivors = [r for r in results if r[0] != victim]
    assert on_victim and survivors, results
    for _, status, msg, n_ids in survivors:
        assert status == "ok" and n_ids == max_tokens
    failed = [r for r in on_victim if r[1] == "error"]
    assert failed, on_victim  # 160 tokens each: the kill lands while they run
    for _, _, msg, n_ids in failed:
        assert "engine" in msg.lower() and n_ids < max_tokens, msg

    # New requests succeed (on the survivor, or the replacement once it is up).
    c = openai.OpenAI(base_url=f"{cluster}/v1", api_key="unused", max_retries=0, timeout=120)
    for k in range(4):
        r = c.completions.create(model="tiny", prompt=[5, 6, 7, k + 8], max_tokens=4, temperature=0)
        assert r.choices[0].finish_reason in ("length", "stop")
    # The survivor leaked no block; Ray Serve replaced the dead replica.
    survivor_ids = {r[0] for r in survivors}
    _wait(lambda: all(replicas(cluster).get(s, {}).get("kv_blocks_used", 1) == 0 for s in survivor_ids),
          "the survivor's blocks to be free")
    _wait(lambda: sum(1 for s in replicas(cluster).values() if s.get("up")) == 2 and victim not in
          {r for r, s in replicas(cluster).items() if s.get("up")}, "a replacement replica")
    mt = metrics(cluster)
    assert mt["mla_kv_blocks_used"] == 0


# ---- pieces without a cluster -------------------------------------------------------------------

def test_block_chain_keys_whole_blocks_by_everything_before():
    from mla_export.server.ray_serve.router import block_chain

    a = list(range(40))
    assert len(block_chain(a, 16)) == 2 and block_chain(a[:15], 16) == []  # only whole blocks
    assert block_chain(a + [99], 16) == block_chain(a, 16)  # a longer prompt extends the chain
    b = [1000] + a[1:]
    assert all(x != y for x, y in zip(block_chain(a, 16), block_chain(b, 16)))  # block 2 differs: its prefix did


def test_deltas_carry_only_the_step_over_the_wire():
    from mla_export.runtime.engine import RequestMetrics, RequestOutput
    from mla_export.runtime.sampling import Logprob
    from mla_export.server.ray_serve.wire import delta_of, from_wire, to_wire

    def sent(o):  # as the channel carries it
        return from_wire(json.loads(json.dumps(to_wire(delta_of(o)))))

    m = RequestMetrics(0.0, None, None, 0, 0)
    outs = [RequestOutput("r", [1, 2], [7], [7], "a", False, None, m, new_text="a"),
            RequestOutput("r", [1, 2], [7, 8], [8], "a", False, None, m, new_text=""),
            RequestOutput("r", [1, 2], [7, 8, 9], [9], "abc", True, "length", m, new_text="bc")]
    got = [sent(o) for o in outs]
    assert [(d.new_token_ids, d.new_text, d.finished, d.finish_reason) for d in got] == \
           [([7], "a", False, None), ([8], "", False, None), ([9], "bc", True, "length")]
    assert got[-1].text == "abc" and got[0].text is None  # the whole text on the finishing delta only
    assert got[-1].num_prompt_tokens == 2 and got[0].num_prompt_tokens == 0
    # a "delta" output (what the server asks for) gives the same delta; its final text travels apart
    last = RequestOutput("r", [1, 2], [9], [9], "bc", True, "length", m, new_text="bc", final_text="abc")
    assert sent(last) == got[-1]
    assert sent(RequestOutput("s", [1], [5], [5], None, False, None, m)).new_text is None  # no tokenizer: no text
    # logprobs (cumulative in a cumulative output) travel as the new tokens' only
    lps = [{7: Logprob(-0.5, 1, "a")}, {8: Logprob(-1.5, 2, "b"), 3: Logprob(-0.2, 1, "c")}]
    outs = [RequestOutput("q", [1], [7], [7], "a", False, None, m, new_text="a", logprobs=lps[:1]),
            RequestOutput("q", [1], [7, 8], [8], "ab", True, "length", m, new_text="b", logprobs=lps)]
    got = [sent(o) for o in outs]
    assert got[0].new_logprobs == lps[:1] and got[1].new_logprobs == lps[1:]
    # prompt logprobs (on every cumulative output) travel once, with the first tokens
    plp = [None, {4: Logprob(-2.0, 3, "x"), 9: Logprob(-0.1, 1, "y")}]
    outs = [RequestOutput("p", [1, 4], [7], [7], "a", False, None, m, new_text="a", prompt_logprobs=plp),
            RequestOutput("p", [1, 4], [7, 8], [8], "ab", True, "length", m, new_text="b", prompt_logprobs=plp)]
    got = [sent(o) for o in outs]
    assert got[0].prompt_logprobs == plp and got[1].prompt_logprobs is None


# ---- the output channel (channel.py), on this machine's loopback ---------------------------------

def _out(rid, ids, new, fin=False):
    from mla_export.runtime.engine import RequestMetrics, RequestOutput

    return RequestOutput(rid, [1, 2, 3], list(ids), [new], None, fin, "length" if fin else None,
                         RequestMetrics(0.0, None, None, 0, 0))


async def _channel_pair(interval_s=0.0, token="t" * 32):
    from mla_export.server.ray_serve.channel import ChannelServer

    server = ChannelServer(interval_s)
    await server.start("127.0.0.1")
    return server, server.outbox(token)


def _reader(address, token):
    from mla_export.server.ray_serve.channel import ChannelReader

    frames, closed = [], asyncio.get_running_loop().create_future()
    reader = ChannelReader(address, token, frames.append,
                           lambda reason: closed.done() or closed.set_result(reason))
    return reader, frames, closed


async def _until(cond, what):
    for _ in range(500):
        if cond():
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"timed out waiting for {what}")


def test_channel_sends_one_frame_per_engine_step_for_all_calls():
    from mla_export.server.engine_loop import Aborted
    from mla_export.server.ray_serve.channel import CallSink
    from mla_export.server.ray_serve.wire import Delta

    async def run():
        server, box = await _channel_pair()
        a, b = CallSink(box, ["a0", "a1"]), CallSink(box, ["b0"])
        loop = asyncio.get_running_loop()
        # Outputs put before the ingress connects wait in the outbox.
        loop.call_soon(lambda: [a.put_nowait(_out("a0", [7], 7)), b.put_nowait(_out("b0", [5], 5))])
        await asyncio.sleep(0.05)
        reader, frames, closed = _reader(server.address, "t" * 32)
        await _until(lambda: len(frames) == 1, "the buffered frame")
        assert [(d.request_id, d.new_token_ids) for d in frames[0]] == [("a0", [7]), ("b0", [5])]
        # One engine step's hand-over (one callback, as EngineLoop._deliver does) is one frame.
        loop.call_soon(lambda: [a.put_nowait(_out("a0", [7, 8], 8, fin=True)),
                                a.put_nowait(Aborted("a1", "error", "boom")),
                                b.put_nowait(_out("b0", [5, 6], 6))])
        await _until(lambda: len(frames) == 2, "the step's frame")
        step = frames[1]
        assert isinstance(step[0], Delta) and step[0].finished and step[0].text is None and step[0].num_prompt_tokens == 3
        assert isinstance(step[1], Aborted) and (step[1].request_id, step[1].error) == ("a1", "boom")
        assert a.done.is_set() and not b.done.is_set() and b.pending == {"b0"}
        server.close()  # the replica goes away: the ingress hears it
        assert await asyncio.wait_for(closed, 10) == "closed by the replica"
        assert len(frames) == 2

    asyncio.run(run())


def test_channel_sends_nothing_to_a_wrong_token():
    async def run():
        server, box = await _channel_pair(token="right" * 8)
        asyncio.get_running_loop().call_soon(lambda: box.put(_out("x", [1], 1)))
        _, frames, closed = _reader(server.address, "wrong" * 8)
        assert await asyncio.wait_for(closed, 10) == "closed by the replica"
        assert frames == [] and not box.connected
        _, frames, _ = _reader(server.address, "right" * 8)
        await _until(lambda: frames, "the right token's frame")
        assert frames[0][0].request_id == "x"
        server.close()

    asyncio.run(run())


def test_channel_interval_holds_middle_steps_but_never_a_first_or_last_output():
    async def run():
        server, box = await _channel_pair(interval_s=60.0)  # far longer than the test: only urgency flushes
        _, frames, _ = _reader(server.address, "t" * 32)
        await _until(lambda: box.connected, "the connection")
        loop = asyncio.get_running_loop()
        loop.call_soon(box.put, _out("s", [1], 1))  # first output: at once
        await _until(lambda: len(frames) == 1, "the first token")
        for k in (2, 3):  # middle steps: held
            loop.call_soon(box.put, _out("s", list(range(1, k + 1)), k))
        await asyncio.sleep(0.2)
        assert len(frames) == 1
        loop.call_soon(box.put, _out("s", [1, 2, 3, 4], 4, fin=True))  # the last: flushes all held
        await _until(lambda: len(frames) == 2, "the held steps")
        assert [d.new_token_ids for d in frames[1]] == [[2], [3], [4]] and frames[1][-1].finished
        server.close()

    asyncio.run(run())


def test_wire_items_round_trip_and_malformed_ones_are_named():
    from mla_export.server.engine_loop import Aborted
    from mla_export.server.ray_serve.wire import delta_of, from_wire, to_wire

    d = delta_of(_out("r", [4, 5], 5, fin=True))
    assert from_wire(json.loads(json.dumps(to_wire(d)))) == d
    ab = Aborted("r", "error", "x")
    assert from_wire(to_wire(ab)) == ab
    for bad in (["z", 1], ["d", "r"], "d", ["d", "r", ["x"], None, False, None, None, None, 0, None, None],
                ["d", "r", [1], None, False, None, None, None, 0, [[["x", 0.1, 1, "a"]]], None],
                ["d", "r", [1], None, False, None, None, None, 0, None, [None, [[1, "y", 1, "a"]]]],
                ["d", "r", [1], None, False, None, None, None, 0, None]):
        with pytest.raises(ValueError, match="output channel"):
            from_wire(bad)


def test_channel_keeps_a_short_calls_outputs_until_its_ingress_connects():
    from mla_export.server.ray_serve.channel import CallSink

    async def run():
        server, box = await _channel_pair()
        sink = CallSink(box, ["s"])
        box.calls += 1
        asyncio.get_running_loop().call_soon(sink.put_nowait, _out("s", [3], 3, fin=True))
        await sink.done.wait()
        box.calls -= 1  # the call ended on the replica before the ingress connected
        server.release("t" * 32)
        _, frames, _ = _reader(server.address, "t" * 32)
        await _until(lambda: frames, "the short call's outputs")
        assert frames[0][0].finished
        server.close()

    asyncio.run(run())


def test_router_load_counts_running_calls_and_picks_not_yet_accepted(monkeypatch):
    from mla_export.server.ray_serve import registry

    monkeypatch.setattr(registry, "_RUNNING", {})
    monkeypatch.setattr(registry, "_PICKS", {})
    for key, rep in (("q1", "A"), ("q2", "B"), ("q3", "A"), ("q1", "B")):  # q1 again: counted once
        registry.picked(key, rep)
    assert (registry.load("A"), registry.load("B")) == (2, 1)
    registry.call_started("A")  # accepted: a pick of A becomes a running call there
    assert registry.load("A") == 2 and len(registry._PICKS) == 2
    registry.call_ended("A")
    assert registry.load("A") == 1
    monkeypatch.setattr(registry, "PICK_TTL_S", -1.0)  # picks never accepted (rejected, cancelled) stop counting
    assert (registry.load("A"), registry.load("B")) == (0, 0) and registry._PICKS == {}


def test_channel_to_an_address_nobody_serves_reports_why():
    async def run():
        import socket

        with socket.socket() as s:  # a port that was free a moment ago: connection refused
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        _, frames, closed = _reader(f"127.0.0.1:{port}", "t" * 32)
        reason = await asyncio.wait_for(closed, 20)
        assert "ConnectionRefusedError" in reason and frames == []

    asyncio.run(run())
