"""Speculative decoding with the checkpoint's MTP layer (issue 35, the MTP half).

One class per cause: checkpoints carrying DeepSeek-V3's MTP layer (and transformers still loading
the main model beside it), the float64 MTP reference (its decoder block against transformers, its
own wiring against planted weights), the exported draft graph against the reference (f32, 1e-5,
OpenVINO and onnxruntime), the method's config and refusals, greedy outputs identical with MTP
drafts on and off (k = 1..3, batch sizes, chunked prefill, prefix-cache hits, preemption, both
runtimes), a planted checkpoint whose draft is the target's next token (acceptance counted), and
LLM(speculative_config=...) and `serve` with the vLLM spec-decode metrics.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from mla_export.checkpoint.writer import RANDOM_WEIGHTS_METADATA, save_safetensors
from mla_export.checkpoint.config import MLAModelConfig
from mla_export.checkpoint.reader import CheckpointReader, SafetensorsFile
from mla_export.checkpoint.presets import make_numpy_checkpoint
from mla_export.ops.reference_mtp import main_forward, mtp_forward
from mla_export.runtime.engine import LLMEngine
from mla_export.runtime.sampling import SamplingParams
from mtp_draft_checks import (RUNTIMES, assert_draft_inputs_refused, assert_drafts_keep_greedy, assert_forced_events,
                              export_notes, llm_greedy_with_and_without_mtp, mtp, run, run_checked_drafts,
                              serve_spec_metrics, tokens)
from mla_export.runtime.spec_decode import SpeculativeConfig

VOCAB = 384


def _export(ckpt: Path, out: Path, *extra: str) -> Path:
    from mla_export.cli import main

    code = main(["export", str(ckpt), "-o", str(out), "--format", "both", "--kv-dtype", "f32", "--block-size", "4",
                 "-q", *extra])
    assert code == 0
    return out


@pytest.fixture(scope="module")
def mtp_model(tmp_path_factory):
    """(checkpoint, export): a tiny V3 checkpoint with its MTP layer, exported as OpenVINO IR and ONNX."""
    root = tmp_path_factory.mktemp("mtp")
    ckpt = make_numpy_checkpoint(root / "ckpt", "deepseek_v3", seed=5, num_nextn_predict_layers=1)
    return ckpt, _export(ckpt, root / "export")


def _planted(src: Path, dst: Path) -> Path:
    """The checkpoint with every layer's output projections zeroed (each hidden state is then its
    token's embedding, so the target's next token is a function F of the current one) and an MTP
    layer that computes the same F of its input token: eh_proj = [I | 0], enorm = 1, the shared
    head = the model's final norm and lm_head. Its drafts are then the target's next tokens."""
    dst.mkdir(parents=True)
    f = SafetensorsFile(src / "model.safetensors")
    tensors = {name: f.array(name) for name in f.entries}
    f.close()
    hidden = tensors["model.embed_tokens.weight"].shape[1]
    for name in tensors:
        if name.endswith(("o_proj.weight", "down_proj.weight")):
            tensors[name] = np.zeros_like(tensors[name])
    mtp = "model.layers.3"
    tensors[f"{mtp}.eh_proj.weight"] = np.concatenate([np.eye(hidden), np.zeros((hidden, hidden))], 1).astype(np.float32)
    tensors[f"{mtp}.enorm.weight"] = np.ones(hidden, np.float32)
    tensors[f"{mtp}.shared_head.norm.weight"] = tensors["model.norm.weight"].copy()
    tensors[f"{mtp}.shared_head.head.weight"] = tensors["lm_head.weight"].copy()
    save_safetensors(dst / "model.safetensors", tensors, RANDOM_WEIGHTS_METADATA)
    for other in src.iterdir():
        if other.name != "model.safetensors":
            (dst / other.name).write_bytes(other.read_bytes())
    return dst


@pytest.fixture(scope="module")
def planted(tmp_path_factory, mtp_model):
    root = tmp_path_factory.mktemp("planted")
    return _export(_planted(mtp_model[0], root / "ckpt"), root / "export")


def prompts_of(rng, count: int) -> list[list[int]]:
    return [rng.integers(2, VOCAB, size=int(rng.integers(2, 30))).tolist() for _ in range(count)]


class TestCheckpointWithMTP:
    def test_tensors_as_deepseek_writes_them(self, mtp_model):
        rd = CheckpointReader(mtp_model[0])
        h, v = 64, VOCAB
        assert rd.shape("model.layers.3.eh_proj.weight") == (h, 2 * h)
        for name in ("enorm.weight", "hnorm.weight", "shared_head.norm.weight"):
            assert rd.shape(f"model.layers.3.{name}") == (h,)
        assert rd.shape("model.layers.3.shared_head.head.weight") == (v, h)
        assert rd.has("model.layers.3.mlp.gate.e_score_correction_bias")  # a V3 MoE layer
        assert rd.has("model.layers.3.self_attn.kv_a_proj_with_mqa.weight")
        assert not rd.has("model.layers.3.embed_tokens.weight")  # the embedding is the model's

    def test_main_weights_same_as_without(self, tmp_path):
        plain = CheckpointReader(make_numpy_checkpoint(tmp_path / "a", "deepseek_v3", seed=5))
        with_mtp = CheckpointReader(make_numpy_checkpoint(tmp_path / "b", "deepseek_v3", seed=5,
                                                          num_nextn_predict_layers=1))
        for name in plain.names():
            assert np.array_equal(plain.get(name), with_mtp.get(name)), name

    def test_make_checkpoint_flag(self):
        from mla_export.bench.checkpoint import CheckpointWriteError, checkpoint_config, tensor_specs

        cfg = checkpoint_config("v3", 2, mtp=True)
        names = {t.name: t.shape for t in tensor_specs(cfg)}
        assert cfg["num_nextn_predict_layers"] == 1
        assert names["model.layers.2.eh_proj.weight"] == (7168, 2 * 7168)
        assert names["model.layers.2.shared_head.head.weight"] == (129280, 7168)
        assert "model.layers.2.mlp.experts.255.down_proj.weight" in names
        assert "model.layers.2.eh_proj.weight" not in {t.name for t in tensor_specs(checkpoint_config("v3", 2))}
        with pytest.raises(CheckpointWriteError, match="--mtp.*no multi-token-prediction"):
            checkpoint_config("v2lite", 2, mtp=True)
        proc = subprocess.run([sys.executable, "tools/make_checkpoint.py", "/nonexistent/x", "--shape", "v3",
                               "--layers", "2", "--mtp", "--dry-run"], capture_output=True, text=True,
                              cwd=Path(__file__).resolve().parent.parent)
        assert proc.returncode == 0, proc.stderr

    def test_transformers_parity_of_the_main_model(self, mtp_model):
        """transformers skips the MTP layer; the export's main graph still equals it (greedy, f32)."""
        from runtime_models import hf_greedy

        ckpt, out = mtp_model
        prompts = [[5, 17, 200, 3, 99], [300, 1, 2, 250, 7, 7, 8, 100, 11]]
        got, _ = run(out, prompts, SamplingParams(max_tokens=12, temperature=0))
        for i, p in enumerate(prompts):
            assert got[str(i)][0] == hf_greedy(ckpt, p, 12)


class TestReference:
    def test_decoder_block_against_transformers(self, mtp_model):
        """The reference's decoder layers run the main model: its logits equal transformers' (f32)."""
        import torch
        from hf_models import load_hf, rel_err

        ckpt = mtp_model[0]
        cfg, rd = MLAModelConfig.from_dir(ckpt), CheckpointReader(ckpt)
        toks = [5, 17, 200, 3, 99, 41, 7, 300, 12]
        _, logits = main_forward(toks, rd.get, cfg)
        with torch.no_grad():
            hf = load_hf(ckpt)(torch.tensor([toks])).logits[0].double().numpy()
        assert rel_err(logits, hf) < 1e-5

    def _weights(self, ckpt, **replace):
        rd = CheckpointReader(ckpt)
        return lambda name: replace[name] if name in replace else rd.get(name)

    def test_concat_order_and_first_position(self, mtp_model):
        """eh_proj = [I | 0] reads only the embedding half (first), [0 | I] only the hidden half;
        at position 0 the embedding is zeroed (vLLM's DeepSeek MTP layer)."""
        ckpt = mtp_model[0]
        cfg = MLAModelConfig.from_dir(ckpt)
        rng = np.random.default_rng(0)
        toks, h = rng.integers(2, VOCAB, 6), rng.standard_normal((6, 64))
        pos = np.arange(6)
        eye, zero = np.eye(64), np.zeros((64, 64))
        emb_only = self._weights(ckpt, **{"model.layers.3.eh_proj.weight": np.concatenate([eye, zero], 1)})
        hid_only = self._weights(ckpt, **{"model.layers.3.eh_proj.weight": np.concatenate([zero, eye], 1)})
        base = mtp_forward(toks, h, pos, emb_only, cfg)[1]
        assert np.allclose(mtp_forward(toks, h + 5.0 * rng.standard_normal(h.shape), pos, emb_only, cfg)[1], base)
        assert not np.allclose(mtp_forward(toks[::-1], h, pos, emb_only, cfg)[1][1:], base[1:])
        base = mtp_forward(toks, h, pos, hid_only, cfg)[1]
        assert np.allclose(mtp_forward(toks[::-1], h, pos, hid_only, cfg)[1], base)
        full = self._weights(ckpt)
        other = toks.copy()
        other[0] = (toks[0] + 1) % VOCAB
        a, b = mtp_forward(toks, h, pos, full, cfg)[1], mtp_forward(other, h, pos, full, cfg)[1]
        assert np.array_equal(a, b)  # only position 0's token changed: masked
        other = toks.copy()
        other[1] = (toks[1] + 1) % VOCAB
        assert not np.allclose(mtp_forward(other, h, pos, full, cfg)[1][1], a[1])


@pytest.mark.parametrize("runtime", RUNTIMES)
class TestDraftGraph:
    """The exported draft graph (f32) against the float64 reference, within 1e-5: a whole
    sequence in one run, the same sequence in two chunks over the paged draft cache, two
    sequences in one batch; and the main graph's hidden_states against the reference's."""

    def _runner(self, out, runtime):
        from mla_export.runtime.backend import MLABackend
        from mla_export.runtime.metadata import MLAMetadataBuilder
        from mla_export.runtime.model_dir import load_model_dir

        contract, _ = load_model_dir(out)
        backend = MLABackend(contract, 16, runtime=runtime, precision="f32", mtp_draft=True)
        builder = MLAMetadataBuilder(4, 16, contract.model["max_position_embeddings"], VOCAB)
        return backend, builder

    def test_against_reference(self, mtp_model, runtime):
        from hf_models import rel_err

        ckpt, out = mtp_model
        cfg, rd = MLAModelConfig.from_dir(ckpt), CheckpointReader(ckpt)
        backend, builder = self._runner(out, runtime)
        rng = np.random.default_rng(1)
        seqs = [rng.integers(2, VOCAB, 11).tolist(), rng.integers(2, VOCAB, 7).tolist()]
        tables = [[9, 2, 5], [1, 14]]
        refs = []
        for s in seqs:
            h, _ = main_forward(s[:-1], rd.get, cfg)
            refs.append((h, *mtp_forward(s[1:], h, np.arange(len(s) - 1), rd.get, cfg)))
        # the main graph's hidden_states: every new token's, before the final norm
        n = [len(s) - 1 for s in seqs]
        backend.execute(n, n, tables, [s[:-1] for s in seqs])
        assert rel_err(backend.hidden_states(), np.concatenate([r[0] for r in refs])) < 1e-5
        # both sequences in one draft run, every row's logits
        meta = builder.build(n, n, tables, [s[1:] for s in seqs], n)
        logits, h2 = backend.draft.run(meta, np.concatenate([r[0] for r in refs]))
        assert rel_err(logits, np.concatenate([r[2] for r in refs])) < 1e-5
        assert rel_err(h2, np.concatenate([r[1] for r in refs])) < 1e-5
        # the first sequence again in two chunks (rows 0..5, then 6..9 reading the first chunk's cache rows)
        backend.draft_cache[...] = 0
        h, ref_h2, ref_logits = refs[0]
        for a, b in ((0, 6), (6, 10)):
            meta = builder.build([b], [b - a], [tables[0]], [seqs[0][a + 1:b + 1]], [b - a])
            logits, h2 = backend.draft.run(meta, h[a:b])
            assert rel_err(logits, ref_logits[a:b]) < 1e-5
            assert rel_err(h2, ref_h2[a:b]) < 1e-5


class TestConfigAndRefusals:
    @pytest.mark.parametrize("alias", ["mtp", "deepseek_mtp"])
    def test_vllm_spellings(self, alias):
        cfg = SpeculativeConfig.parse(json.dumps(mtp(2, alias)))
        assert (cfg.method, cfg.num_speculative_tokens, cfg.prompt_lookup_max) == ("mtp", 2, None)

    @pytest.mark.parametrize("value, words", [
        ({"method": "mtp", "num_speculative_tokens": 1, "prompt_lookup_max": 3}, "apply to method 'ngram' only"),
        ({"method": "mtp", "num_speculative_tokens": 0}, "num_speculative_tokens must be an integer >= 1"),
        ({"method": "mtp"}, "num_speculative_tokens must be an integer >= 1"),
        ({"method": "glm4_moe_mtp", "num_speculative_tokens": 1}, "not built"),
    ])
    def test_refused_naming_the_input(self, value, words):
        with pytest.raises(ValueError, match=words):
            SpeculativeConfig.parse(value)

    def test_export_without_draft_refused(self, exports):
        _, out = exports.model("deepseek_v3")
        with pytest.raises(ValueError, match="method 'mtp' cannot run: .*no MTP draft graph"):
            LLMEngine(out, precision="f32", speculative_config=mtp(1))

    def test_exports_without_mtp_unchanged(self, exports):
        from mla_export.formats.contract import load_contract

        contract = load_contract(exports.model("deepseek_v3")[1])
        assert contract.mtp is None
        assert [o.name for o in contract.outputs()] == ["logits"]

    def test_contract_records_the_draft(self, mtp_model):
        from mla_export.formats.contract import load_contract

        contract = load_contract(mtp_model[1])
        assert contract.mtp["layer_index"] == 3 and contract.mtp["hidden_size"] == 64
        assert [o.name for o in contract.outputs()] == ["logits", "hidden_states"]
        assert contract.mtp_path("openvino_xml").is_file() and contract.mtp_path("onnx").is_file()
        assert [i.name for i in contract.inputs("mtp")][-2:] == ["hidden_states", "kv_cache.3"]

    def test_draft_files_verified(self, mtp_model, tmp_path):
        """The draft's files carry digests like the model's: `mla-export verify` and loading check them."""
        import shutil

        from mla_export.cli import main
        from mla_export.formats.contract_error import ContractError
        from mla_export.formats.contract import load_contract

        out = tmp_path / "copy"
        shutil.copytree(mtp_model[1], out)
        assert main(["verify", str(out)]) == 0
        with open(out / "mtp_draft.onnx.data", "r+b") as f:
            f.seek(100)
            byte = f.read(1)
            f.seek(100)
            f.write(bytes([byte[0] ^ 0xFF]))
        assert main(["verify", str(out)]) != 0
        with pytest.raises(ContractError, match="mtp_draft.onnx.data"):
            load_contract(out, "full")

    def test_declared_but_missing_layer_noted(self, tmp_path):
        """config.json declares an MTP layer whose weights the checkpoint lacks (as the bench
        checkpoints of V3 once were): the model exports, without a draft, and the export says why."""
        from mla_export.formats.contract import load_contract

        ckpt = make_numpy_checkpoint(tmp_path / "ckpt", "deepseek_v3", seed=5)
        cfg = json.loads((ckpt / "config.json").read_text())
        (ckpt / "config.json").write_text(json.dumps(dict(cfg, num_nextn_predict_layers=1)))
        notes = export_notes(ckpt, tmp_path / "out", "openvino")
        assert load_contract(tmp_path / "out").mtp is None
        assert any("no model.layers.3.eh_proj.weight" in n and "no MTP draft" in n for n in notes), notes

    def test_tampered_draft_io_refused(self, mtp_model, tmp_path):
        assert_draft_inputs_refused(mtp_model[1], tmp_path, "kv_cache.3")  # the last input


@pytest.mark.parametrize("runtime", RUNTIMES)
class TestGreedyIdentical:
    @pytest.mark.parametrize("k", [1, 2, 3])
    def test_k_and_batch(self, mtp_model, rng, runtime, k):
        prompts = prompts_of(rng, 6)
        plain, _ = run(mtp_model[1], prompts, runtime=runtime)
        for batch in (1, 6):
            got, stats = run(mtp_model[1], prompts, spec=mtp(k), runtime=runtime, max_num_seqs=batch)
            assert tokens(got) == tokens(plain)
            assert stats["spec_decode_num_draft_tokens"] > 0
            assert stats["kv_blocks_used"] == 0  # every block (drafts' included) given back

    def test_chunked_prefill(self, mtp_model, rng, runtime):
        prompts = prompts_of(rng, 5)
        plain, _ = run(mtp_model[1], prompts, runtime=runtime)
        got, _ = run(mtp_model[1], prompts, spec=mtp(3), runtime=runtime, max_num_batched_tokens=5)
        assert tokens(got) == tokens(plain)

    def test_prefix_cache_hits_and_preemption(self, mtp_model, rng, runtime):
        """20 blocks of 4 rows (80 tokens: every request fits alone) for 8 requests of up to 51
        rows: requests are preempted and recomputed; the second four share whole blocks with the
        first four (prefix hits)."""
        base = [rng.integers(2, VOCAB, size=int(rng.integers(3, 13))).tolist() for _ in range(4)]
        prompts = [p + p for p in base] + [p + p + p[:3] for p in base]
        params = SamplingParams(max_tokens=24, temperature=0, ignore_eos=True)
        plain, _ = run(mtp_model[1], prompts, params, runtime=runtime)
        assert all(len(v[0]) == 24 for v in plain.values())
        got, stats = run(mtp_model[1], prompts, params, mtp(2), runtime=runtime, num_blocks=20)
        assert tokens(got) == tokens(plain)
        assert stats["num_preemptions"] > 0
        hits, hit_stats = run(mtp_model[1], prompts, params, mtp(2), runtime=runtime, max_num_seqs=1)
        assert tokens(hits) == tokens(plain)
        assert hit_stats["prefix_cache_hits"] > 0


class TestDraftsAreTheReferences:
    """Every draft the engine proposes is the float64 reference's: draft 1 the argmax of the MTP
    layer over the whole committed sequence (its cache rows as the catch-up runs wrote them, across
    chunked prefill, prefix-cache hits with their copied blocks, and preemption), draft 2 the
    argmax of the next row fed draft 1 and h'. Near-ties (top-2 gap < 1e-3) are skipped."""

    @pytest.mark.parametrize("kw", [dict(max_num_seqs=1), dict(num_blocks=20), dict(max_num_batched_tokens=5)],
                             ids=["prefix-hits", "preemption", "chunked"])
    def test_drafts(self, mtp_model, rng, kw):
        ckpt, out = mtp_model
        base = [rng.integers(2, VOCAB, size=int(rng.integers(3, 13))).tolist() for _ in range(3)]
        prompts = [p + p for p in base] + [p + p + p[:3] for p in base]
        checked, stats = run_checked_drafts(ckpt, out, prompts, **kw)
        assert len(checked) > 50
        assert_forced_events(stats, kw)


@pytest.mark.parametrize("flags", [("--portable",), ("--weight-format", "int8", "--kv-dtype", "int8")],
                         ids=["portable", "int8"])
def test_other_export_forms(mtp_model, tmp_path, rng, flags):
    """With the portable graph beside it (the draft has none: its variant is left out) and with
    int8 weights (the fused MoE op, the IR's own source graph) and an int8 cache: the draft is
    exported and greedy output with it equals plain, in both runtimes."""
    out = _export(mtp_model[0], tmp_path / "export", *flags)
    prompts = prompts_of(rng, 3)
    assert_drafts_keep_greedy(out, prompts)


class TestPlantedAcceptance:
    """A checkpoint whose MTP layer predicts what the target will say (_planted): nearly every
    draft is accepted, the output still equals plain greedy, and the counters add up."""

    @pytest.mark.parametrize("runtime", RUNTIMES)
    def test_acceptance_counted(self, planted, rng, runtime):
        prompts = prompts_of(rng, 4)
        plain, _ = run(planted, prompts, runtime=runtime)
        got, stats = run(planted, prompts, spec=mtp(3), runtime=runtime)
        assert tokens(got) == tokens(plain)
        drafts, accepted = stats["spec_decode_num_draft_tokens"], stats["spec_decode_num_accepted_tokens"]
        assert accepted >= 0.9 * drafts > 0
        assert sum(stats["spec_decode_num_accepted_tokens_per_pos"]) == accepted
        assert sum(v[1].spec_num_accepted_tokens for v in got.values()) == accepted
        assert sum(v[1].spec_num_draft_tokens for v in got.values()) == drafts
        # 20 tokens each, up to 4 a step once drafting: far fewer steps than tokens
        assert stats["num_steps"] < 4 * 20 / 2

    def test_unplanted_random_weights_accept_little(self, mtp_model, rng):
        """The same counters on random weights: the acceptance above is the planting's, not a
        counter that counts every draft."""
        got, stats = run(mtp_model[1], prompts_of(rng, 4), spec=mtp(3))
        assert stats["spec_decode_num_accepted_tokens"] < 0.5 * stats["spec_decode_num_draft_tokens"]


class TestSampling:
    def test_distribution_kept(self, planted):
        """Sampled requests verify MTP drafts by rejection sampling: 1500 seeded requests of 4
        tokens (top-3 at temperature 1.5, so the planted draft, the argmax, is often but not
        always the token) with and without MTP (k=2); the joint distributions of the 4 tokens
        agree (two-sample chi-square at 0.999; the seeds are fixed, so the result is too)."""
        import collections
        import dataclasses

        from test_spec_decode_ngram import chi2_two_sample

        n, got = 1500, {}
        for spec in (None, mtp(2)):
            params = SamplingParams(max_tokens=4, temperature=1.5, top_k=3, ignore_eos=True)
            engine = LLMEngine(planted, precision="f32", speculative_config=spec, max_num_seqs=64)
            for i in range(n):
                engine.add_request(str(i), [7, 100, 200], dataclasses.replace(params, seed=20_000 + i))
            outs = {}
            while engine.has_unfinished_requests():
                outs.update({o.request_id: tuple(o.token_ids) for o in engine.step() if o.finished})
            got[spec is None] = collections.Counter(outs.values())
            if spec is not None:
                stats = engine.stats()
                assert 0 < stats["spec_decode_num_accepted_tokens"] < stats["spec_decode_num_draft_tokens"]
        stat, limit = chi2_two_sample(got[True], got[False], n)
        assert stat < limit, (stat, limit)

    def test_grammar_request_runs_plain_beside_drafting_ones(self, planted):
        """A structured-output request never drafts (its bitmask follows the grammar token by
        token); it shares the batches of drafting requests and gets its plain output."""
        from mla_export.runtime.sampling import StructuredOutputsParams

        params = [SamplingParams(max_tokens=20, temperature=0, ignore_eos=True),
                  SamplingParams(max_tokens=8, temperature=0,
                                 structured_outputs=StructuredOutputsParams(choice=["yes", "no"]))]
        outs = {}
        for spec in (None, mtp(2)):
            engine = LLMEngine(planted, precision="f32", speculative_config=spec)
            for i, sp in enumerate(params):
                engine.add_request(str(i), [7, 100, 200], sp)
            done = {}
            while engine.has_unfinished_requests():
                done.update({o.request_id: (o.token_ids, o.metrics.spec_num_draft_tokens)
                             for o in engine.step() if o.finished})
            outs[spec is None] = done
        assert {k: v[0] for k, v in outs[True].items()} == {k: v[0] for k, v in outs[False].items()}
        assert outs[False]["1"][1] == 0 and outs[False]["0"][1] > 0


class TestLLMAndServer:
    def test_llm(self, planted, rng):
        prompts = prompts_of(rng, 3)
        plain, spec, stats = llm_greedy_with_and_without_mtp(planted, prompts)
        assert spec == plain and stats["spec_decode_num_accepted_tokens"] > 0

    def test_serve_metrics(self, planted):
        m = serve_spec_metrics(planted, [40, 41, 42, 43])
        name = f'{{model_name="{planted.name}"}}'
        assert m["vllm:spec_decode_num_drafts_total" + name] > 0
        assert m["vllm:spec_decode_num_accepted_tokens_total" + name] > 0
        assert m[f'vllm:spec_decode_num_accepted_tokens_per_pos_total{{model_name="{planted.name}",'
                 f'position="2"}}'] > 0

    def test_serve_refuses_an_export_without_draft(self, exports):
        _, out = exports.model("deepseek_v3")
        proc = subprocess.run([sys.executable, "-m", "mla_export.cli", "serve", str(out), "--port", "0",
                               "--speculative-config", json.dumps(mtp(1))], capture_output=True, text=True,
                              timeout=300)
        assert proc.returncode != 0
        assert "no MTP draft graph" in proc.stderr
