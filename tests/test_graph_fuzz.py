"""The exported graph, called directly, against thousands of random bad steps: on both runtimes
(OpenVINO IR, and model.onnx in onnxruntime with the custom-op library) every bad step is
rejected by the graph's MlaStepCheck with a message naming the input (zero crashes, zero silent
answers), and not one cache byte changes. Valid steps interleaved with the bad ones are accepted,
give finite logits, and agree between the two runtimes (f32 caches, f32 inference), so a rejected
step cannot have disturbed anything a later step reads.

Each bad step is a random valid step (batches of 1-4 sequences, shuffled block tables, shared
full prefix blocks, chunked prefills and decodes) with one random defect; a pure-Python oracle
of the rule confirms each defect really makes the step invalid (the few random defects that
happen to leave a valid step are counted and skipped).

OpenVINO runs on two threads here, so the graph's own check is what rejects: on one thread the
CPU plugin loses a node's exception (infer() returned stale or zero logits, and a later
single-thread infer() crashed), so the executor runs the same check before infer() there
(test_graph_step_check.py covers that path).

MLA_FUZZ_STEPS sets the number of bad steps per runtime (default 1500: about 1300 rejected
steps per runtime, 40 s in all on this 2-core machine); the seed is printed (MLA_TEST_SEED replays it)."""

from __future__ import annotations

import os

import numpy as np
import pytest

from mla_export.runtime.metadata import METADATA_INPUTS, MLAMetadata, MLAMetadataBuilder
from mla_export.runtime.model_dir import load_model_dir

pytest.importorskip("onnxruntime")

BLOCK_SIZE = 4
NUM_BLOCKS = 40
STEPS = int(os.environ.get("MLA_FUZZ_STEPS", "1500"))
VALID_EVERY = 25

# ------------------------------------------------------------------------------ the rule (oracle)
def step_is_valid(f: dict, num_blocks: int, vocab: int, max_pos: int, bs: int = BLOCK_SIZE) -> bool:
    """The step rule in plain Python, written from the contract (docs/ARCHITECTURE.md), not from
    the C++ check."""
    ids, pos, slots = (f[n].tolist() for n in ("input_ids", "positions", "slot_mapping"))
    qsl, lens, li = (f[n].tolist() for n in ("query_start_loc", "seq_lens", "logits_indices"))
    bt = f["block_tables"]
    t, b = len(ids), len(lens)
    if bt.ndim != 2 or b < 1 or len(pos) != t or len(slots) != t or len(qsl) != b + 1 or len(li) < b:
        return False
    if bt.shape[0] != b or qsl[0] != 0 or qsl[-1] != t:
        return False
    if any(not 0 <= i < vocab for i in ids):
        return False
    if any(not 0 <= x < t for x in li) or any(x <= y for y, x in zip(li, li[1:])):
        return False  # logits rows: strictly increasing, inside the step's tokens
    writers = {}
    for s in range(b):
        lo, hi = qsl[s], qsl[s + 1]
        if hi <= lo or lens[s] < hi - lo or lens[s] > max_pos or lens[s] > bt.shape[1] * bs:
            return False
        used = bt[s, :-(-lens[s] // bs)].tolist()
        if any(not 0 <= x < num_blocks for x in used):
            return False
        if not any(lo <= x < hi for x in li):  # at least one logits row of its own tokens
            return False
        for j, tok in enumerate(range(lo, hi)):
            p = lens[s] - (hi - lo) + j
            if pos[tok] != p or slots[tok] != used[p // bs] * bs + p % bs:
                return False
            if writers.setdefault(used[p // bs], s) != s:
                return False
    for s in range(b):
        for x in bt[s, :-(-lens[s] // bs)].tolist():
            if writers.get(x, s) != s:
                return False
    return True


# ------------------------------------------------------------------------------ random steps
def valid_step(rng, builder: MLAMetadataBuilder, vocab: int) -> dict:
    n = int(rng.integers(1, 5))
    past = rng.integers(0, 25, n)
    qlens = rng.integers(1, 9, n)
    if rng.random() < 0.5:
        qlens[rng.random(n) < 0.6] = 1  # decodes
    lens = past + qlens
    perm = list(rng.permutation(NUM_BLOCKS))
    tables = [[int(perm.pop()) for _ in range(-(-int(s) // BLOCK_SIZE))] for s in lens]
    if n >= 2 and rng.random() < 0.5:  # a full prefix block shared by two sequences, written by neither
        shared = min(int(past[0]), int(past[1])) // BLOCK_SIZE
        if shared:
            tables[1][:shared] = tables[0][:shared]
    ids = [rng.integers(0, vocab, int(q)).tolist() for q in qlens]
    m = builder.build(lens.tolist(), qlens.tolist(), tables, ids)
    return {k: v.copy() for k, v in m.feeds().items()}


def _one(rng, arr, value):
    arr = arr.copy()
    arr.flat[int(rng.integers(arr.size))] = value
    return arr


def _resized(rng, arr):
    if arr.ndim == 2:
        return arr[:-1] if arr.shape[0] > 1 and rng.random() < 0.5 else np.vstack([arr, arr[:1]])
    return arr[:-1] if arr.size > 1 and rng.random() < 0.5 else np.concatenate([arr, arr[:1]])


def mutate(rng, f: dict, vocab: int, max_pos: int) -> tuple[str, dict]:
    """One random defect: (the input it is in, the bad step)."""
    f = {k: v.copy() for k, v in f.items()}
    name = str(rng.choice(METADATA_INPUTS))
    a = f[name]
    kind = int(rng.integers(5))
    big = int(rng.choice([vocab, max_pos, NUM_BLOCKS, NUM_BLOCKS * BLOCK_SIZE, 2**31 - 1, 10**6]))
    if kind == 0:
        f[name] = _resized(rng, a)
    elif kind == 1:
        f[name] = _one(rng, a, -int(rng.integers(1, 3)) if rng.random() < 0.5 else -(2**31))
    elif kind == 2:
        f[name] = _one(rng, a, min(big + int(rng.integers(0, 3)), 2**31 - 1))
    elif kind == 3:  # off by a little
        i = int(rng.integers(a.size))
        g = a.copy()
        g.flat[i] += int(rng.choice([-2, -1, 1, 2, BLOCK_SIZE]))
        f[name] = g
    else:  # structural: another sequence's block, another step's batch size
        if name == "block_tables" and a.shape[0] >= 2:
            g = a.copy()
            g[1, int(rng.integers(g.shape[1]))] = a[0, int(rng.integers(a.shape[1]))]
            f[name] = g
        elif name in ("seq_lens", "query_start_loc", "logits_indices"):
            f[name] = _resized(rng, a)
        else:
            f[name] = a.ravel()[rng.permutation(a.size)].reshape(a.shape) if a.size > 1 else _one(rng, a, big)
    return name, f


# ------------------------------------------------------------------------------ the test
def _caches(contract, rng):
    w = contract.cache["row_width"]
    return [rng.standard_normal((NUM_BLOCKS, BLOCK_SIZE, w)).astype(np.float32)
            for _ in range(contract.model["num_layers"])]


def _executors(out, rng):
    from mla_export.runtime.executor_onnxruntime import OnnxRuntimeMLAExecutor
    from mla_export.runtime.executor_openvino import OpenVINOMLAExecutor

    contract, _ = load_model_dir(out)
    ov_caches = _caches(contract, rng)
    ort_caches = [c.copy() for c in ov_caches]
    return contract, {
        "openvino": (OpenVINOMLAExecutor(contract, ov_caches, precision="f32", num_threads=2), ov_caches),
        "onnxruntime": (OnnxRuntimeMLAExecutor(contract, ort_caches, variant="custom", num_threads=1), ort_caches),
    }


def test_random_bad_steps_are_rejected_whole(exports, rng):
    from mla_export.ops import kernels

    if not kernels.available("onnxruntime"):
        pytest.skip("the onnxruntime custom-op library is not built")
    out = exports.model("deepseek_v3", "f32", BLOCK_SIZE, "both")[1]
    contract, runtimes = _executors(out, rng)
    vocab, max_pos = contract.model["vocab_size"], contract.model["max_position_embeddings"]
    builder = MLAMetadataBuilder(BLOCK_SIZE, NUM_BLOCKS, max_pos, vocab)
    rejected = {k: 0 for k in runtimes}
    still_valid = 0
    for step in range(STEPS):
        good = valid_step(rng, builder, vocab)
        assert step_is_valid(good, NUM_BLOCKS, vocab, max_pos), "the generator made an invalid step"
        if step % VALID_EVERY == 0:  # accepted, finite, and the same on both runtimes
            logits = {k: np.array(ex.execute(MLAMetadata(**good))) for k, (ex, _) in runtimes.items()}
            assert np.isfinite(logits["openvino"]).all()
            np.testing.assert_allclose(logits["onnxruntime"], logits["openvino"], rtol=1e-4, atol=1e-4)
        name, bad = mutate(rng, good, vocab, max_pos)
        if step_is_valid(bad, NUM_BLOCKS, vocab, max_pos):
            still_valid += 1
            continue
        for kind, (ex, caches) in runtimes.items():
            before = [c.copy() for c in caches]
            try:
                ex.execute(MLAMetadata(**bad))
            except Exception as e:  # noqa: BLE001 - both runtimes wrap the op's error in their own type
                msg = str(e)
            else:
                pytest.fail(f"{kind}: a bad step ({name}) gave an answer: "
                            + repr({k: v.tolist() for k, v in bad.items()}))
            assert "MlaStepCheck: input '" in msg, f"{kind}: bad {name} not caught by the step check: {msg[:400]}"
            for i, (b, c) in enumerate(zip(before, caches)):
                assert np.array_equal(b.view(np.uint32), c.view(np.uint32)), \
                    f"{kind}: a rejected step ({name}) changed kv_cache.{i}"
            rejected[kind] += 1
    print(f"rejected {rejected}, {still_valid} mutations left the step valid (skipped)")
    assert min(rejected.values()) >= 0.75 * STEPS  # the rest of the defects happened to be valid steps
