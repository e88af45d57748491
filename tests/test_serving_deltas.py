"""Issue 38 step 5: deltas end to end, metadata written where it is consumed.

- The serving path (engine -> EngineLoop -> the HTTP layer's choice state) hands over only what
  a step added: no step copies the prompt, the output, its text or its logprobs, so a step's
  allocations do not grow with the output or the prompt. (Before: the server asked for
  cumulative outputs, and the engine copied the prompt, output, text and logprobs into every
  step's output, which the HTTP layer copied again.)
- Both engine clients yield one item type: the in-process loop's `Delta` is what the Ray
  replicas send over their output channel, unchanged by the trip.
- The penalties keep their counts as the output grows instead of recounting the whole history.
- A steady decode step's metadata is written once, by the builder, into the arrays the graph
  reads: the executor's input tensors are the builder's arrays (shared memory), and nothing
  checks or copies them again between the two.
"""

from __future__ import annotations

import asyncio
import json
import statistics
import tracemalloc

import numpy as np
import pytest

from mla_export.runtime.engine import LLMEngine


@pytest.fixture(scope="module")
def engine(exports):
    return LLMEngine(exports.tiny(), precision="f32", max_num_seqs=4, max_num_batched_tokens=256)


def _serve_one(engine, prompt: list[int], max_tokens: int, **extra) -> tuple[list[int], list, list[str]]:
    """One completion through the in-process serving path, stepped here (the engine thread's
    work, without the thread, so that every allocation of a step is this thread's): the
    server's own submission (generation.start) on an EngineLoop, the loop's step and delivery,
    and the HTTP layer's next_events. Returns (bytes allocated at the peak of each step,
    every item the loop delivered, the text of each event)."""
    from mla_export.server import protocol as P
    from mla_export.server.engine_client import ModelView
    from mla_export.server.engine_loop import EngineLoop
    from mla_export.server.generation import make_detok, next_events, start
    from mla_export.server.metrics import ServerMetrics
    from mla_export.server.state import ServerState

    async def run():
        loop = EngineLoop(engine, max_num_seqs=4, max_queue=0)
        st = ServerState(loop, ModelView.of_engine(engine), ServerMetrics(), model_name="tiny", api_key=None)
        s = P.parse_completion_request({"prompt": prompt, "max_tokens": max_tokens, "ignore_eos": True,
                                        "temperature": 0, "stream": True, **extra}).sampling
        starting = asyncio.ensure_future(start(st, [prompt], s, "cmpl-t"))
        await asyncio.sleep(0)  # the submission waits on its "add" command: run it as the engine thread would
        loop._handle(loop._cmds.get_nowait())
        q, choices, _ = await starting
        by_id = {c.request_id: c for c in choices}
        detok = make_detok(st.decode, None)
        seen: list = []
        put = q.put_nowait
        q.put_nowait = lambda item: (seen.append(item), put(item))
        step_bytes, texts = [], []
        while not choices[0].finished:
            tracemalloc.reset_peak()
            base = tracemalloc.get_traced_memory()[0]
            loop._step()
            for _ in range(3):  # the loop's delivery (call_soon_threadsafe) runs
                await asyncio.sleep(0)
            if q.empty():  # a prefill chunk that did not finish its prompt: no output
                continue
            events = await next_events(st, detok, q, by_id)
            step_bytes.append(tracemalloc.get_traced_memory()[1] - base)
            texts += [e[1] for e in events]
        return step_bytes, seen, texts

    tracemalloc.start()
    try:
        return asyncio.run(run())
    finally:
        tracemalloc.stop()


class TestAStepsWorkDoesNotGrowWithTheOutput:
    """Cause: cumulative outputs on the serving path (prompt, output, text and logprobs copied
    into every step's output and copied again by the HTTP layer)."""

    N = 480

    def _typical(self, step_bytes: list[int], lo: int, hi: int) -> float:
        return statistics.median(step_bytes[lo:hi])  # the median: a list's occasional regrowth is no trend

    # (logprobs are left out here: a step's peak is then their [vocab] rows, which hides a copy;
    # TestBothClientsYieldTheSameDelta checks that each delta carries only its tokens' logprobs)
    @pytest.mark.parametrize("extra", [{}, {"stop": ["never-in-this-output"]}], ids=["plain", "stop-strings"])
    def test_late_steps_cost_what_early_ones_do(self, engine, extra):
        step_bytes, _, _ = _serve_one(engine, [5, 6, 7, 8], self.N, **extra)
        assert len(step_bytes) == self.N
        early, late = self._typical(step_bytes, 20, 80), self._typical(step_bytes, self.N - 60, self.N)
        # a copy of the output at step 400 is >= 3.2 kB of list alone (and as much again per copy)
        assert late - early < 1500, (early, late)

    def test_a_long_prompt_is_not_copied_per_step(self, engine):
        short, _, _ = _serve_one(engine, [5, 6, 7, 8], 60)
        long, _, _ = _serve_one(engine, [5 + k % 90 for k in range(400)], 60)
        # a copy of a 400-token prompt is 3.2 kB per copy
        assert self._typical(long, 10, 60) - self._typical(short, 10, 60) < 1500


class TestBothClientsYieldTheSameDelta:
    """Cause: the local loop handed out the engine's cumulative outputs while the Ray path sent
    deltas and rebuilt cumulative outputs at the ingress."""

    def test_the_local_loop_yields_deltas_that_cross_the_ray_channel_unchanged(self, engine):
        from mla_export.server.deltas import Delta
        from mla_export.server.ray_serve.wire import from_wire, to_wire

        _, items, texts = _serve_one(engine, [5, 6, 7, 8], 12, logprobs=1)
        assert items and all(isinstance(d, Delta) for d in items)
        assert [len(d.new_token_ids) for d in items] == [1] * 12  # only the step's token, never the output
        assert all(d.text is None for d in items[:-1]) and items[-1].finished
        assert items[-1].text == "".join(texts)  # the final decode equals the streamed text
        assert all(len(d.new_logprobs) == 1 for d in items)
        assert items[0].prompt_logprobs is None and items[-1].num_prompt_tokens == 4
        # the Ray replica sends exactly these items over its output channel (channel.py)
        assert [from_wire(json.loads(json.dumps(to_wire(d)))) for d in items] == items


class TestPenaltiesDoNotReadTheWholeHistoryPerStep:
    """Cause: the repetition, frequency and presence penalties turned the whole prompt and output
    into arrays at every step (np.unique of both, np.bincount of the output)."""

    def test_counts_are_kept_as_the_output_grows(self, engine, monkeypatch):
        from mla_export.runtime.sampling import SamplingParams

        calls = {"bincount": 0, "unique": 0}
        for name in calls:
            real = getattr(np, name)
            monkeypatch.setattr(np, name, lambda *a, _real=real, _name=name, **k: (
                calls.__setitem__(_name, calls[_name] + 1), _real(*a, **k))[1])
        engine.add_request("pen", [5, 6, 7, 8, 9, 5, 6], SamplingParams(
            max_tokens=40, ignore_eos=True, repetition_penalty=1.3, frequency_penalty=0.5, presence_penalty=0.2))
        outs = []
        while engine.has_unfinished_requests():
            outs += engine.step()
        assert outs[-1].finished and len(outs[-1].token_ids) == 40
        assert calls == {"bincount": 1, "unique": 0}  # counted once, then kept per appended token

    def test_kept_counts_give_the_whole_history_values(self, rng):
        from mla_export.runtime.sampling import Sampler, SamplingParams
        from mla_export.runtime.token_counts import OutputTokenIds

        vocab = 50
        for _ in range(50):
            p = SamplingParams(repetition_penalty=float(rng.choice([1.3, 0.7])),
                               frequency_penalty=float(rng.uniform(-1, 1)), presence_penalty=float(rng.uniform(-1, 1)))
            prompt = rng.integers(0, vocab, size=int(rng.integers(1, 20))).tolist()
            kept, plain = OutputTokenIds(), []
            for _ in range(30):
                row = rng.standard_normal(vocab).astype(np.float32)
                want = row.copy()  # the whole-history rule, computed here (vLLM's order: repetition, then the others)
                seen = np.unique(np.array(prompt + plain, np.int64))
                v = want[seen]
                want[seen] = np.where(v > 0, v / p.repetition_penalty, v * p.repetition_penalty)
                if plain:
                    counts = np.bincount(np.array(plain), minlength=vocab).astype(np.float32)
                    want -= p.frequency_penalty * counts + p.presence_penalty * (counts > 0)
                np.testing.assert_array_equal(Sampler.process(row, p, prompt, kept), want)
                t = int(rng.integers(0, vocab))
                kept.append(t)
                plain.append(t)


def _decode_steps(engine, n_steps: int) -> list:
    """Runs a 3-sequence batch into steady decoding; returns the metadata of its last n_steps
    steps as the builder made them."""
    from mla_export.runtime.sampling import SamplingParams

    made = []
    build = engine.builder.build

    def keep(*a, **k):
        md = build(*a, **k)
        made.append(md)
        return md

    engine.builder.build = keep
    try:
        for i in range(3):
            engine.add_request(f"d{i}", [5 + i, 6, 7, 8, 9], SamplingParams(max_tokens=n_steps + 4, ignore_eos=True))
        while engine.has_unfinished_requests():
            engine.step()
    finally:
        del engine.builder.build
    return made[-n_steps:]


@pytest.mark.parametrize("runtime", ["openvino", "onnxruntime"])
class TestOneMetadataCopyPerDecodeStep:
    """Cause: a step's metadata built into fresh arrays, checked again (graph_feeds) and copied
    into the executor's tensors (OpenVINO) or wrapped anew (onnxruntime) every step."""

    @pytest.fixture
    def runtime_engine(self, exports, runtime):
        if runtime == "openvino":
            return LLMEngine(exports.tiny(), precision="f32", max_num_seqs=4)
        _, out = exports.model("deepseek_v3", "f32", 4, "both")
        return LLMEngine(out, runtime="onnxruntime", precision="f32", max_num_seqs=4)

    def _graph_input(self, executor, runtime, name) -> int:
        """Where the graph reads the input `name` from (a data address)."""
        if runtime == "openvino":
            return executor.request.get_tensor(name).data.ctypes.data
        return executor._meta_bound[name][1].data_ptr()

    def test_the_graph_reads_the_builders_arrays(self, runtime_engine, runtime, monkeypatch):
        from mla_export.runtime import executor_common
        from mla_export.runtime.metadata import METADATA_INPUTS

        checked = []
        monkeypatch.setattr(executor_common, "graph_feeds", lambda md: checked.append(md) or None)
        steps = _decode_steps(runtime_engine, 8)
        ex = runtime_engine.executor
        last = steps[-1]
        assert last.num_tokens == 3 == last.num_seqs  # steady decode
        for name in METADATA_INPUTS:
            arr = getattr(last, name)
            assert arr.dtype == np.int32 and self._graph_input(ex, runtime, name) == arr.ctypes.data, name
        # steady steps (the same block-table width: a block holds 4 tokens) hand out the same
        # arrays, so nothing is rebound; and nothing checks them again
        steady = [md for md in steps if md.block_tables.shape == last.block_tables.shape]
        assert len(steady) >= 3
        for md in steady:
            for name in METADATA_INPUTS:
                assert getattr(md, name) is getattr(last, name), name
        assert checked == []
