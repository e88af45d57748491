"""Static decode graphs (runtime/decode_graphs.py): a pure decode step of a batch size in the list
runs on a graph compiled with static shapes, its block tables padded to one width; everything
else runs on the dynamic graph. f32 throughout, tiny DeepSeek-V3 export, block size 4, OpenVINO
on 2 threads, on the CPU at hand (whatever ISA the kernels pick).

What must hold: the static graph's logits equal the dynamic graph's for the same step (random
caches, NaN in every slot no sequence owns, shuffled block tables, varied lengths); it really
runs (the request that ran is the static graph's); a bad step is refused there too, naming the
input, with no cache byte moved; the engine's tokens do not change; the options are checked."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from mla_export.runtime import LLMEngine, SamplingParams
from mla_export.runtime.backend import MLABackend
from mla_export.runtime.decode_graphs import default_batches, parse_batches
from mla_export.runtime.metadata import MLAMetadata
from mla_export.runtime.model_dir import load_model_dir

BS, NB, MAX_LEN = 4, 48, 80  # table width min(48, 80 / 4) = 20


@pytest.fixture(scope="module")
def backend(exports):
    contract, _ = load_model_dir(exports.model("deepseek_v3", "f32", BS)[1])
    be = MLABackend(contract, NB, precision="f32", num_threads=2, decode_graph_batches=(1, 3), verify_tokens=2,
                    max_model_len=MAX_LEN)
    return be


def _poisoned_step(backend, rng, seq_lens):
    """Shuffled distinct blocks per sequence; every cache row NaN except the rows the sequences own
    before this step (random)."""
    needed = [-(-s // BS) for s in seq_lens]
    order = rng.permutation(NB)
    tables, at = [], 0
    for n in needed:
        tables.append(order[at:at + n].tolist())
        at += n
    for cache in backend.kv_caches:
        cache[...] = np.nan
        for table, s in zip(tables, seq_lens):
            for pos in range(s - 1):  # the cached rows; the new token's row is written by the step
                cache[table[pos // BS], pos % BS] = rng.standard_normal(cache.shape[2]).astype(np.float32)
    ids = rng.integers(0, backend.builder.vocab_size, size=len(seq_lens)).reshape(-1, 1).tolist()
    return tables, ids


@pytest.mark.parametrize("seq_lens", [[1], [13], [MAX_LEN - BS], [5, 1, 22], [40, 33, 2]])
def test_a_decode_step_on_its_static_graph_equals_the_dynamic_graph(backend, rng, seq_lens):
    ex = backend.executor
    tables, ids = _poisoned_step(backend, rng, seq_lens)
    b = len(seq_lens)
    static = np.array(backend.execute(seq_lens, [1] * b, tables, ids), copy=True)
    graph = ex.decode_graphs.decode_graph(b)
    assert ex.request is graph.request, "the decode step ran on the dynamic graph"
    padded = ex.metadata_tensors.array("block_tables", (b, ex.decode_graphs.width))
    for row, table in zip(padded, tables):  # the builder wrote the padded width in place: 0 past each table
        assert row[:len(table)].tolist() == table and not row[len(table):].any()
    # The same step in fresh arrays (each table only as wide as needed): the dynamic graph.
    dynamic = np.array(ex.execute(backend.build(seq_lens, [1] * b, tables, ids)), copy=True)
    assert ex.request is not graph.request
    assert np.isfinite(static).all()
    np.testing.assert_allclose(static, dynamic, rtol=0, atol=1e-5)


@pytest.mark.parametrize("query_lens", [[2, 2, 2], [1, 3, 2], [2]])
def test_a_verify_step_on_its_static_graph_equals_the_dynamic_graph(backend, rng, query_lens):
    """Speculative decoding's verify step, every new token's logits: its shape (B, T, L) is all the
    static graph fixes ((3, 6, 6) and (1, 2, 2) here), so [1, 3, 2] runs on it too."""
    ex = backend.executor
    seq_lens = [9, 17, 4][:len(query_lens)]
    tables, _ = _poisoned_step(backend, rng, seq_lens)
    for cache in backend.kv_caches:  # the rows of each sequence's other new tokens are written by the step
        for table, s, q in zip(tables, seq_lens, query_lens):
            for pos in range(s - q, s - 1):
                cache[table[pos // BS], pos % BS] = np.nan
    ids = [rng.integers(0, backend.builder.vocab_size, size=q).tolist() for q in query_lens]
    b, t = len(query_lens), sum(query_lens)
    static = np.array(backend.execute(seq_lens, query_lens, tables, ids, num_logits=query_lens), copy=True)
    assert ex.request is ex.decode_graphs.graphs[(b, t, t)].request
    dynamic = np.array(ex.execute(backend.build(seq_lens, query_lens, tables, ids, num_logits=query_lens)), copy=True)
    assert ex.request not in {g.request for g in ex.decode_graphs.graphs.values()}  # fresh arrays: as wide as needed
    assert static.shape == (t, backend.builder.vocab_size) and np.isfinite(static).all()
    np.testing.assert_allclose(static, dynamic, rtol=0, atol=1e-5)


def test_other_steps_run_on_the_dynamic_graph(backend, rng):
    ex = backend.executor
    statics = {g.request for g in ex.decode_graphs.graphs.values()}
    tables, ids = _poisoned_step(backend, rng, [9, 6])
    backend.execute([9, 6], [1, 1], tables, ids)  # batch 2: no static graph of its size
    assert ex.request not in statics
    backend.execute([9], [4], tables[:1], [[1, 2, 3, 4]])  # a prefill chunk
    assert ex.request not in statics
    assert ex.metadata_tensors.array("block_tables", (1, 3)).shape == (1, 3)  # as wide as needed


def test_a_bad_step_on_the_static_graph_is_refused_and_moves_no_cache_byte(backend, rng):
    ex = backend.executor
    tables, ids = _poisoned_step(backend, rng, [7, 3, 11])
    good = backend.build([7, 3, 11], [1, 1, 1], tables, ids).feeds()
    width = ex.decode_graphs.width
    good["block_tables"] = np.pad(good["block_tables"], ((0, 0), (0, width - good["block_tables"].shape[1])))
    unused = sorted(set(range(NB)) - {blk for t in tables for blk in t})
    bad_cases = {
        "block_tables": dict(block_tables=np.where(good["block_tables"] == tables[1][0], NB + 3, good["block_tables"])),
        "slot_mapping": dict(slot_mapping=good["slot_mapping"] + np.array([0, BS * (unused[0] - tables[1][0]), 0])),
        "input_ids": dict(input_ids=np.array([0, backend.builder.vocab_size, 1])),
    }
    for name, change in bad_cases.items():
        before = [c.copy() for c in backend.kv_caches]
        bad = {k: np.ascontiguousarray(change.get(k, v), dtype=np.int32) for k, v in good.items()}
        with pytest.raises(Exception) as e:
            ex.execute(MLAMetadata(**bad))
        assert ex.request is ex.decode_graphs.decode_graph(3).request  # it was the static graph that refused it
        assert "MlaStepCheck" in str(e.value) and name in str(e.value), str(e.value)[-400:]
        assert all(np.array_equal(b.view(np.uint32), c.view(np.uint32)) for b, c in zip(before, backend.kv_caches))
    assert np.isfinite(np.array(ex.execute(MLAMetadata(**good)))).all()  # and the good step still runs


def test_the_engine_decodes_on_static_graphs_with_the_same_tokens(exports):
    out = exports.model("deepseek_v3", "f32", BS)[1]
    params = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)
    prompts = {"a": list(range(3, 12)), "b": list(range(20, 41)), "c": [5, 6], "d": list(range(7, 14))}
    tokens, ran = {}, {}
    for eager in (True, False):
        eng = LLMEngine(out, precision="f32", num_threads=2, max_num_seqs=4, enforce_eager=eager)
        ex = eng.executor
        assert (ex.decode_graphs is None) == eager and ("static decode graphs for batch 1,2,4" in ex.describe()) != eager
        picked = []
        if not eager:
            pick = ex.decode_graphs.pick
            ex.decode_graphs.pick = lambda feeds: picked.append(pick(feeds)) or picked[-1]
        for rid, p in prompts.items():
            eng.add_request(rid, p, params)
        done = {}
        while len(done) < len(prompts):
            for o in eng.step():
                if o.finished:
                    done[o.request_id] = o.token_ids
        tokens[eager], ran[eager] = done, [g for g in picked if g is not None]
    assert tokens[False] == tokens[True]
    assert len(ran[False]) >= 10  # the steady decode steps ran on the static graphs


def test_options_are_checked(exports):
    assert default_batches(64) == (1, 2, 4, 8) and default_batches(2) == (1, 2) and default_batches(7) == (1, 2, 4)
    assert parse_batches("4, 1,2") == (1, 2, 4) and parse_batches("") == () and parse_batches(None) is None
    for bad in ("1,x", [0], [1.5], [True], 3):
        with pytest.raises(ValueError, match="decode_graph_batches"):
            parse_batches(bad)
    out = exports.model("deepseek_v3", "f32", BS)[1]
    with pytest.raises(ValueError, match="contradict"):
        LLMEngine(out, precision="f32", enforce_eager=True, decode_graph_batches=[1])
    with pytest.raises(ValueError, match="enforce_eager must be True or False"):
        LLMEngine(out, precision="f32", enforce_eager="yes")
    with pytest.raises(ValueError, match="OpenVINO's"):
        LLMEngine(out, runtime="onnxruntime", precision="f32", decode_graph_batches=[1])
    with pytest.raises(ValueError, match="batch-invariant"):
        LLMEngine(out, precision="f32", batch_invariant=True, decode_graph_batches=[1])


def test_static_graphs_that_would_copy_the_matmul_weights_are_left_out_unless_asked_for(exports, monkeypatch):
    """The plugin repacks its own MatMul nodes' weights into every compiled model: an export whose
    projections are MatMuls (this f32 one) would hold a copy per static graph. Here the allowance
    is set to nothing, as if the model were large."""
    from mla_export.ops import memory_plan
    from mla_export.ops.libraries import ov_core
    from mla_export.runtime import decode_graphs
    from mla_export.runtime.decode_graphs import matmul_weight_bytes

    out = exports.model("deepseek_v3", "f32", BS)[1]
    copied, total = matmul_weight_bytes(ov_core().read_model(str(out / "openvino_model.xml")))
    assert 0.5 * total < copied < total  # the projections and experts are MatMuls; the embedding is a Gather
    monkeypatch.setattr(decode_graphs, "MAX_COPIED_BYTES", 0)
    eng = LLMEngine(out, precision="f32", num_threads=2, max_num_seqs=2)
    assert eng.executor.decode_graphs is None and "its own copy of the" in eng.executor.describe()
    eng = LLMEngine(out, precision="f32", num_threads=2, max_num_seqs=2, decode_graph_batches=[2])
    assert list(eng.executor.decode_graphs.graphs) == [(2, 2, 2)]
    # 1000 bytes free when the static graphs are checked (the main graph's own check is left as it is)
    monkeypatch.setattr(decode_graphs, "memory_plan", SimpleNamespace(
        available_bytes=lambda: 1000, SKIP_ENV=memory_plan.SKIP_ENV, InsufficientMemoryError=memory_plan.InsufficientMemoryError))
    with pytest.raises(memory_plan.InsufficientMemoryError, match="decode_graph_batches: 1 static decode graphs"):
        LLMEngine(out, precision="f32", num_threads=2, decode_graph_batches=[1])
    monkeypatch.setattr(decode_graphs, "MAX_COPIED_BYTES", 256 << 20)  # the copies allowed again; memory still short
    eng = LLMEngine(out, precision="f32", num_threads=2, max_num_seqs=2)  # the default: left out, said so
    assert eng.executor.decode_graphs is None and "but only 0.0 GiB is available" in eng.executor.describe()
