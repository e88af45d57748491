"""Speculative decoding with the MTP layer of the DeepSeek Sparse Attention families (issue 35):
DeepSeek-V3.2 (`deepseek_v32`) and GLM-5 (`glm_moe_dsa`).

Their MTP layer is a decoder layer of the model's own kind: MLA whose lightning indexer picks the
index_topk cache rows each token attends to, with its own indexer weights
(model.layers.<N>.self_attn.indexer.*) and so its own indexer-key cache beside its latent cache.
The tiny checkpoints are transformers' own (make_checkpoint: 16 indexer heads of 32 values, top-16;
GLM-5's layer 1 shares layer 0's pick) with the MTP layer appended as the released checkpoints
hold it. One class per cause: the checkpoint and the float64 reference (its sparse block against
transformers), the export (a draft now, its contract IO, a checkpoint missing the MTP layer's
indexer), the draft graph against the float64 reference (f32, 1e-5, both runtimes, sequences far
longer than the top-k so that the pick matters), greedy output identical with drafts on and off,
a planted checkpoint whose drafts are accepted, and LLM / `serve`."""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from mla_export.checkpoint.config import MLAModelConfig
from mla_export.checkpoint.reader import CheckpointReader, SafetensorsFile
from mla_export.checkpoint.writer import save_safetensors
from mla_export.ops.reference_mtp import main_forward, mtp_forward
from mla_export.runtime.engine import LLMEngine
from mla_export.runtime.sampling import SamplingParams
from mtp_draft_checks import (RUNTIMES, assert_draft_inputs_refused, assert_drafts_keep_greedy, assert_forced_events,
                              export_notes, llm_greedy_with_and_without_mtp, mtp, run, run_checked_drafts,
                              serve_spec_metrics, tokens)

MODELS = ("deepseek_v32", "glm_moe_dsa")
VOCAB, HIDDEN, TOPK = 384, 64, 16
SEEDS = {"deepseek_v32": 31, "glm_moe_dsa": 32}


def _export(ckpt: Path, out: Path, *extra: str) -> Path:
    from mla_export.cli import main

    assert main(["export", str(ckpt), "-o", str(out), "--format", "both", "--kv-dtype", "f32", "--block-size", "4",
                 "-q", *extra]) == 0
    return out


@pytest.fixture(scope="module", params=MODELS)
def dsa(request, tmp_path_factory):
    """(model type, checkpoint, export): transformers' tiny model with an MTP layer, exported."""
    from mla_export.checkpoint.presets import make_checkpoint

    root = tmp_path_factory.mktemp(f"mtp_{request.param}")
    ckpt = make_checkpoint(root / "ckpt", request.param, seed=SEEDS[request.param], num_nextn_predict_layers=1)
    return request.param, ckpt, _export(ckpt, root / "export")


def _planted(src: Path, dst: Path) -> Path:
    """As test_spec_decode_mtp's: every o_proj / down_proj zeroed (each hidden state is its token's
    embedding: the target's next token is a function F of the current one) and an MTP layer computing
    the same F (eh_proj = [I | 0], enorm = 1, shared head = final norm and lm_head): its drafts are the
    target's next tokens, whatever the indexers pick."""
    shutil.copytree(src, dst)
    f = SafetensorsFile(dst / "model.safetensors")
    tensors, metadata = {name: f.array(name) for name in f.entries}, f.metadata
    f.close()
    for name in tensors:
        if name.endswith(("o_proj.weight", "down_proj.weight")):
            tensors[name] = np.zeros_like(tensors[name])
    mtp = "model.layers.3"
    eye = np.concatenate([np.eye(HIDDEN), np.zeros((HIDDEN, HIDDEN))], 1)
    tensors[f"{mtp}.eh_proj.weight"] = eye.astype(np.float32)
    tensors[f"{mtp}.enorm.weight"] = np.ones(HIDDEN, np.float32)
    tensors[f"{mtp}.shared_head.norm.weight"] = tensors["model.norm.weight"].copy()
    tensors[f"{mtp}.shared_head.head.weight"] = tensors["lm_head.weight"].copy()
    save_safetensors(dst / "model.safetensors", tensors, metadata)
    return dst


@pytest.fixture(scope="module")
def planted(dsa, tmp_path_factory):
    model_type, ckpt, _ = dsa
    root = tmp_path_factory.mktemp(f"planted_{model_type}")
    return _export(_planted(ckpt, root / "ckpt"), root / "export")


def prompts_of(rng, count: int, lo: int = 2, hi: int = 30) -> list[list[int]]:
    return [rng.integers(2, VOCAB, size=int(rng.integers(lo, hi))).tolist() for _ in range(count)]


def _dense(cfg: MLAModelConfig) -> MLAModelConfig:
    """The same config with a top-k no sequence here reaches: attention to every position."""
    return dataclasses.replace(cfg, sparse=dataclasses.replace(cfg.sparse, index_topk=10 ** 6))


class TestCheckpointAndReference:
    def test_mtp_layer_as_released_checkpoints_hold_it(self, dsa):
        """Layer N = num_hidden_layers: V3's MTP tensors plus the layer's own indexer (GLM-5's too,
        though its main layers' indexer_types end in whatever pattern)."""
        model_type, ckpt, _ = dsa
        rd = CheckpointReader(ckpt)
        assert json.loads((ckpt / "config.json").read_text())["num_nextn_predict_layers"] == 1
        assert rd.shape("model.layers.3.eh_proj.weight") == (HIDDEN, 2 * HIDDEN)
        assert rd.shape("model.layers.3.shared_head.head.weight") == (VOCAB, HIDDEN)
        for name in ("wq_b.weight", "wk.weight", "weights_proj.weight", "k_norm.weight", "k_norm.bias"):
            assert rd.has(f"model.layers.3.self_attn.indexer.{name}"), name
        assert rd.has("model.layers.3.mlp.gate.e_score_correction_bias")
        if model_type == "glm_moe_dsa":  # the main model's shared layer keeps no indexer
            assert not rd.has("model.layers.1.self_attn.indexer.wk.weight")

    def test_main_weights_same_as_without(self, dsa, tmp_path):
        from mla_export.checkpoint.presets import make_checkpoint

        model_type, ckpt, _ = dsa
        plain = CheckpointReader(make_checkpoint(tmp_path / "plain", model_type, seed=SEEDS[model_type]))
        with_mtp = CheckpointReader(ckpt)
        assert set(plain.names()) == {n for n in with_mtp.names() if not n.startswith("model.layers.3.")}
        for name in plain.names():
            assert np.array_equal(plain.get(name), with_mtp.get(name)), name

    def test_sparse_block_against_transformers(self, dsa):
        """The reference's sparse layers (indexer top-16, GLM-5's shared layer) run the main model over
        60 positions: its logits equal transformers' (f32), and differ from dense attention's."""
        import torch
        from hf_models import load_hf, rel_err

        _, ckpt, _ = dsa
        cfg, rd = MLAModelConfig.from_dir(ckpt), CheckpointReader(ckpt)
        toks = np.random.default_rng(3).integers(2, VOCAB, 60).tolist()
        _, logits = main_forward(toks, rd.get, cfg)
        with torch.no_grad():
            hf = load_hf(ckpt)(torch.tensor([toks])).logits[0].double().numpy()
        assert rel_err(logits, hf) < 1e-5
        assert rel_err(main_forward(toks, rd.get, _dense(cfg))[1], hf) > 1e-3


class TestExport:
    def test_draft_exported(self, dsa):
        """On main the export refused the draft of a sparse-attention model (`cfg.sparse`): no mtp entry."""
        from mla_export.formats.contract import load_contract

        _, _, out = dsa
        contract = load_contract(out)
        assert contract.mtp is not None and contract.mtp["layer_index"] == 3
        assert contract.mtp_path("openvino_xml").is_file() and contract.mtp_path("onnx").is_file()
        assert [o.name for o in contract.outputs()] == ["logits", "hidden_states"]

    def test_draft_io_has_its_own_index_cache(self, dsa):
        """kv_cache.3 and index_cache.3 (rows of D = 32, the main indexer caches' shape)."""
        from mla_export.formats.contract import load_contract

        _, _, out = dsa
        contract = load_contract(out)
        inputs = {s.name: s for s in contract.inputs("mtp")}
        assert [s.name for s in contract.inputs("mtp")][-3:] == ["hidden_states", "kv_cache.3", "index_cache.3"]
        main_index = next(s for s in contract.inputs() if s.name == "index_cache.0")
        assert (inputs["index_cache.3"].shape, inputs["index_cache.3"].dtype) == (main_index.shape, main_index.dtype)

    def test_no_refusal_note(self, dsa, tmp_path):
        notes = export_notes(dsa[1], tmp_path / "out", "onnx")
        assert not [n for n in notes if "MTP" in n], notes

    def test_mtp_layer_without_indexer_noted(self, dsa, tmp_path):
        """An MTP layer lacking its indexer's weights: the model exports without a draft, saying why."""
        from mla_export.formats.contract import load_contract

        ckpt = tmp_path / "ckpt"
        shutil.copytree(dsa[1], ckpt)
        f = SafetensorsFile(ckpt / "model.safetensors")
        tensors = {n: f.array(n) for n in f.entries if not n.startswith("model.layers.3.self_attn.indexer.")}
        f.close()
        save_safetensors(ckpt / "model.safetensors", tensors)
        notes = export_notes(ckpt, tmp_path / "out", "onnx")
        assert load_contract(tmp_path / "out").mtp is None
        assert any("model.layers.3.self_attn.indexer.wk.weight" in n and "no MTP draft" in n for n in notes), notes

    def test_tampered_draft_io_refused(self, dsa, tmp_path):
        """A contract whose draft lost its index cache input does not load."""
        assert_draft_inputs_refused(dsa[2], tmp_path, "index_cache.3")


@pytest.mark.parametrize("runtime", RUNTIMES)
class TestDraftGraph:
    """The exported draft graph (f32) against the float64 reference within 1e-5: two sequences of 41
    and 30 positions (top-16) in one run, then the first in three chunks over the paged draft caches
    (each chunk's indexer reads the keys the earlier chunks wrote to index_cache.3); and the
    reference's sparse answer is not the dense one (the pick matters at these lengths)."""

    def test_against_reference(self, dsa, runtime):
        from hf_models import rel_err
        from mla_export.runtime.backend import MLABackend
        from mla_export.runtime.metadata import MLAMetadataBuilder
        from mla_export.runtime.model_dir import load_model_dir

        _, ckpt, out = dsa
        cfg, rd = MLAModelConfig.from_dir(ckpt), CheckpointReader(ckpt)
        contract, _ = load_model_dir(out)
        backend = MLABackend(contract, 40, runtime=runtime, precision="f32", mtp_draft=True)
        assert [c.shape for c in backend.draft_caches] == [(40, 4, 48), (40, 4, 32)]
        builder = MLAMetadataBuilder(4, 40, contract.model["max_position_embeddings"], VOCAB)
        rng = np.random.default_rng(1)
        seqs = [rng.integers(2, VOCAB, 42).tolist(), rng.integers(2, VOCAB, 31).tolist()]
        order = rng.permutation(40).tolist()
        tables = [order[:11], order[11:19]]
        refs = []
        for s in seqs:
            h, _ = main_forward(s[:-1], rd.get, cfg)
            refs.append((h, *mtp_forward(s[1:], h, np.arange(len(s) - 1), rd.get, cfg)))
        dense = mtp_forward(seqs[0][1:], refs[0][0], np.arange(41), rd.get, _dense(cfg))[1]
        assert rel_err(dense, refs[0][2]) > 1e-3
        n = [len(s) - 1 for s in seqs]
        backend.execute(n, n, tables, [s[:-1] for s in seqs])
        assert rel_err(backend.hidden_states(), np.concatenate([r[0] for r in refs])) < 1e-5
        meta = builder.build(n, n, tables, [s[1:] for s in seqs], n)
        logits, h2 = backend.draft.run(meta, np.concatenate([r[0] for r in refs]))
        assert rel_err(logits, np.concatenate([r[2] for r in refs])) < 1e-5
        assert rel_err(h2, np.concatenate([r[1] for r in refs])) < 1e-5
        for c in backend.draft_caches:
            c[...] = 0
        h, ref_h2, ref_logits = refs[0]
        for a, b in ((0, 13), (13, 30), (30, 41)):
            meta = builder.build([b], [b - a], [tables[0]], [seqs[0][a + 1:b + 1]], [b - a])
            logits, h2 = backend.draft.run(meta, h[a:b])
            assert rel_err(logits, ref_logits[a:b]) < 1e-5, (a, b)
            assert rel_err(h2, ref_h2[a:b]) < 1e-5, (a, b)


class TestDraftCaches:
    def test_memory_budget_counts_both_draft_caches(self, dsa):
        """kv_cache_memory holds the main caches and the draft's two per block: one more latent layer
        (48 f32 = 192 B a row) and one more indexer layer (32 f32 = 128 B a row)."""
        _, _, out = dsa
        engine = LLMEngine(out, precision="f32", speculative_config=mtp(1), kv_cache_memory=1 << 20)
        index_layers = engine.contract.cache["index"]["num_layers"]
        per_block = 4 * ((3 + 1) * 192 + (index_layers + 1) * 128)
        assert engine.kv_cache.num_blocks == (1 << 20) // per_block
        assert [c.shape[0] for c in engine.backend.draft_caches] == [engine.kv_cache.num_blocks] * 2

    def test_runner_refuses_the_latent_cache_alone(self, dsa):
        """A caller that binds only kv_cache.3 (as for a V3 draft) is told what the draft binds."""
        from mla_export.runtime.mtp_draft import MTPDraftRunner
        from mla_export.runtime.model_dir import load_model_dir

        contract, _ = load_model_dir(dsa[2])
        with pytest.raises(ValueError, match=r"binds 2 cache array\(s\) \(kv_cache.3, index_cache.3\), got one array"):
            MTPDraftRunner(contract, np.zeros((8, 4, 48), np.float32), runtime="openvino", precision="f32")
        with pytest.raises(ValueError, match=r"index_cache.3 is f32 \['NB', 4, 32\]; "
                                             r"the cache binds float32 \[8, 4, 48\]"):
            MTPDraftRunner(contract, [np.zeros((8, 4, 48), np.float32)] * 2, runtime="openvino", precision="f32")


@pytest.mark.parametrize("runtime", RUNTIMES)
class TestGreedyIdentical:
    @pytest.mark.parametrize("k", [1, 2, 3])
    def test_k_and_batch(self, dsa, rng, runtime, k):
        """Prompts of 2..40 tokens, 20 new ones: sequences past the top-16 in prefill and decode."""
        out = dsa[2]
        prompts = prompts_of(rng, 5, hi=40)
        plain, _ = run(out, prompts, runtime=runtime)
        for batch in (1, 5):
            got, stats = run(out, prompts, spec=mtp(k), runtime=runtime, max_num_seqs=batch)
            assert tokens(got) == tokens(plain)
            assert stats["spec_decode_num_draft_tokens"] > 0
            assert stats["kv_blocks_used"] == 0

    def test_chunked_prefill_prefix_hits_and_preemption(self, dsa, rng, runtime):
        """Chunks of 7 tokens; then 24 blocks of 4 rows for requests of up to 60 rows sharing prefixes:
        preempted and recomputed, prefix-cache hits (the draft's index cache rides the same blocks)."""
        out = dsa[2]
        base = [rng.integers(2, VOCAB, size=int(rng.integers(8, 16))).tolist() for _ in range(3)]
        prompts = [p + p for p in base] + [p + p + p[:3] for p in base]
        params = SamplingParams(max_tokens=24, temperature=0, ignore_eos=True)
        plain, _ = run(out, prompts, params, runtime=runtime)
        got, _ = run(out, prompts, params, mtp(3), runtime=runtime, max_num_batched_tokens=7)
        assert tokens(got) == tokens(plain)
        got, stats = run(out, prompts, params, mtp(2), runtime=runtime, num_blocks=24)
        assert tokens(got) == tokens(plain)
        assert stats["num_preemptions"] > 0
        got, stats = run(out, prompts, params, mtp(2), runtime=runtime, max_num_seqs=1)
        assert tokens(got) == tokens(plain)
        assert stats["prefix_cache_hits"] > 0


def test_int8_weights_and_cache(dsa, tmp_path, rng):
    """int8 weights (the fused MoE op, the IR's own source graph) and an int8 cache: the draft's
    indexer-key cache is bound as bytes like the main ones; greedy output with drafts equals plain."""
    out = _export(dsa[1], tmp_path / "export", "--weight-format", "int8", "--kv-dtype", "int8")
    prompts = prompts_of(rng, 3, hi=40)
    assert_drafts_keep_greedy(out, prompts)


class TestDraftsAreTheReferences:
    """Every draft the engine proposes is the float64 reference's (as test_spec_decode_mtp's class of
    that name): draft 1 the argmax of the MTP layer over the whole committed sequence, read from its
    latent and index-key rows as the catch-up runs wrote them across chunked prefill, prefix-cache
    hits (copied blocks) and preemption; draft 2 the next row fed draft 1 and h'. Sequences run past
    the top-16. Near-ties (top-2 gap < 1e-3) are skipped."""

    @pytest.mark.parametrize("kw", [dict(max_num_seqs=1), dict(num_blocks=24), dict(max_num_batched_tokens=7)],
                             ids=["prefix-hits", "preemption", "chunked"])
    def test_drafts(self, dsa, rng, kw):
        _, ckpt, out = dsa
        base = [rng.integers(2, VOCAB, size=int(rng.integers(8, 14))).tolist() for _ in range(2)]
        prompts = [p + p for p in base] + [p + p + p[:3] for p in base]
        checked, stats = run_checked_drafts(ckpt, out, prompts, **kw)
        # many of the checked drafts come where the indexer picks TOPK of more cached positions
        assert len(checked) > 30 and sum(c > TOPK for c in checked) > 10
        assert_forced_events(stats, kw)


class TestPlantedAcceptance:
    @pytest.mark.parametrize("runtime", RUNTIMES)
    def test_acceptance_counted(self, planted, rng, runtime):
        prompts = prompts_of(rng, 4, hi=40)
        plain, _ = run(planted, prompts, runtime=runtime)
        got, stats = run(planted, prompts, spec=mtp(3), runtime=runtime)
        assert tokens(got) == tokens(plain)
        drafts, accepted = stats["spec_decode_num_draft_tokens"], stats["spec_decode_num_accepted_tokens"]
        assert accepted >= 0.9 * drafts > 0
        assert sum(v[1].spec_num_accepted_tokens for v in got.values()) == accepted
        assert stats["num_steps"] < 4 * 20 / 2

    def test_unplanted_random_weights_accept_little(self, dsa, rng):
        _, stats = run(dsa[2], prompts_of(rng, 4), spec=mtp(3))
        assert stats["spec_decode_num_accepted_tokens"] < 0.5 * stats["spec_decode_num_draft_tokens"]


class TestLLMAndServer:
    def test_llm(self, planted, rng):
        prompts = prompts_of(rng, 3, hi=40)
        plain, spec, stats = llm_greedy_with_and_without_mtp(planted, prompts)
        assert spec == plain and stats["spec_decode_num_accepted_tokens"] > 0

    def test_serve_metrics(self, planted):
        m = serve_spec_metrics(planted, list(range(40, 70)))
        name = f'{{model_name="{planted.name}"}}'
        assert m["vllm:spec_decode_num_drafts_total" + name] > 0
        assert m["vllm:spec_decode_num_accepted_tokens_total" + name] > 0
