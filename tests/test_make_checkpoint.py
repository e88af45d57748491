"""tools/make_checkpoint.py's writer (mla_export.bench.checkpoint) at tiny dimensions.

The streamed checkpoint must hold exactly the tensors (names, shapes, dtypes) that transformers
5.24's save_pretrained writes for the same config, load in transformers without missing or
unexpected keys, and export with `mla-export export`: the exported graph's logits equal
transformers' at f32 (weights bf16 in the file, widened exactly; compute f32, tolerance 1e-4
max relative error as in test_export_models). The real dimensions are the same code with other
numbers (V2-Lite 3 layers: tools/make_checkpoint.py, checked by the benchmark, not here).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from mla_export.bench.checkpoint import (CheckpointWriteError, checkpoint_config, size_bytes, tensor_specs,
                                         write_checkpoint)

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from hf_models import PagedSession, drive_and_compare, load_hf  # noqa: E402
from test_export_models import BLOCK, NUM_BLOCKS, SCHEDULE, openvino_runner  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
SEED = 11


def _headers(d: Path) -> dict:
    from safetensors import safe_open

    out = {}
    for f in sorted(d.glob("*.safetensors")):
        h = safe_open(str(f), "pt")
        for k in h.keys():
            s = h.get_slice(k)
            out[k] = (tuple(s.get_shape()), s.get_dtype())
    return out


@pytest.fixture(scope="module", params=["tiny-v2", "tiny-v3"])
def written(request, tmp_path_factory):
    base = tmp_path_factory.mktemp(request.param)
    # a small shard limit: several shards and an index, as at real size
    ckpt = write_checkpoint(base / "ckpt", request.param, seed=SEED, max_shard_bytes=200_000)
    return request.param, ckpt, base


def test_same_tensors_as_transformers_save_pretrained(written):
    shape, ckpt, base = written
    from transformers import AutoConfig, AutoModelForCausalLM

    ref = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(ckpt)).to(torch.bfloat16)
    ref.save_pretrained(base / "ref")
    ours = _headers(ckpt)
    assert ours == _headers(base / "ref")
    index = json.loads((ckpt / "model.safetensors.index.json").read_text())
    assert len(set(index["weight_map"].values())) > 1 and set(index["weight_map"]) == set(ours)
    assert index["metadata"]["total_size"] == size_bytes(checkpoint_config(shape))
    model, info = AutoModelForCausalLM.from_pretrained(ckpt, dtype=torch.float32, output_loading_info=True)
    assert not any(info.values()), info
    assert model.config.rope_parameters["rope_type"] == "yarn"


def test_values_seeded_and_perturbed(written, tmp_path):
    shape, ckpt, _ = written
    from safetensors.numpy import load_file

    again = write_checkpoint(tmp_path / "again", shape, seed=SEED)  # one shard: values must not depend on it
    other = write_checkpoint(tmp_path / "other", shape, seed=SEED + 1, tokenizer=False)
    a = {}
    for f in ckpt.glob("*.safetensors"):
        a.update(load_file(str(f)))
    b = load_file(str(next(again.glob("*.safetensors"))))
    c = load_file(str(next(other.glob("*.safetensors"))))
    assert a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)
    assert not np.array_equal(a["lm_head.weight"], c["lm_head.weight"])
    norm = a["model.norm.weight"].astype(np.float32)
    assert 0.05 < norm.std() < 0.4 and abs(norm.mean() - 1) < 0.2  # 1 + 0.2 N(0, 1), not all ones
    w = a["model.layers.0.self_attn.kv_b_proj.weight"].astype(np.float32)
    assert abs(w.std() - 0.08) < 0.01
    if shape == "tiny-v3":
        bias = a["model.layers.1.mlp.gate.e_score_correction_bias"].astype(np.float32)
        assert np.abs(bias).max() > 0


def test_tokenizer_fills_the_vocabulary(written):
    _, ckpt, _ = written
    from transformers import AutoTokenizer

    cfg = json.loads((ckpt / "config.json").read_text())
    tok = AutoTokenizer.from_pretrained(ckpt)
    assert len(tok) == cfg["vocab_size"]
    assert tok.bos_token_id == cfg["bos_token_id"] and tok.eos_token_id == cfg["eos_token_id"]
    text = "Hello wörld, 1234!"
    assert tok.decode(tok(text, add_special_tokens=False).input_ids) == text


def test_export_matches_transformers_f32(written, tmp_path):
    shape, ckpt, _ = written
    from mla_export.export import export_model

    export_model(ckpt, tmp_path / "out", fmt="openvino", block_size=BLOCK, kv_dtype="f32", weight_dtype="f32")
    hf = load_hf(ckpt)
    c = hf.config
    run, _ = openvino_runner(tmp_path / "out" / "openvino_model.xml", c.num_hidden_layers,
                             c.kv_lora_rank + c.qk_rope_head_dim)
    rng = np.random.default_rng(SEED)
    prompts = {s: rng.integers(2, c.vocab_size, n) for s, n in dict(a=9, b=11, c=1).items()}
    res = drive_and_compare(run, hf, PagedSession(BLOCK, NUM_BLOCKS, rng), prompts, SCHEDULE, tol=1e-4)
    assert res["agree"] == res["total"] and res["worst"] <= 1e-4


def test_real_dimension_tensor_list():
    cfg = checkpoint_config("v2lite", 3)
    specs = {t.name: t.shape for t in tensor_specs(cfg)}
    assert specs["model.layers.0.self_attn.q_proj.weight"] == (16 * 192, 2048)
    assert specs["model.layers.0.self_attn.kv_a_proj_with_mqa.weight"] == (576, 2048)
    assert specs["model.layers.0.mlp.gate_proj.weight"] == (10944, 2048)
    assert specs["model.layers.2.mlp.experts.63.down_proj.weight"] == (2048, 1408)
    assert specs["model.layers.2.mlp.shared_experts.up_proj.weight"] == (2 * 1408, 2048)
    assert "model.layers.3.input_layernorm.weight" not in specs
    assert size_bytes(checkpoint_config("v2lite")) == 2 * 15_706_484_224  # V2-Lite: 15.7B parameters
    v3 = checkpoint_config("v3", 4)
    assert v3["first_k_dense_replace"] == 3 and v3["q_lora_rank"] == 1536


def test_v3_structure_at_v2lite_dimensions():
    """v3-at-v2lite (for peers whose transformers has deepseek_v3 only): V2-Lite's tensors plus each MoE
    layer's router correction bias, under model type deepseek_v3 with V2-Lite's routing numbers."""
    v2 = {t.name: t.shape for t in tensor_specs(checkpoint_config("v2lite", 3))}
    cfg = checkpoint_config("v3-at-v2lite", 3)
    v3 = {t.name: t.shape for t in tensor_specs(cfg)}
    biases = {f"model.layers.{i}.mlp.gate.e_score_correction_bias": (64,) for i in (1, 2)}
    assert v3 == {**v2, **biases}
    assert cfg["model_type"] == "deepseek_v3" and cfg["q_lora_rank"] is None
    assert (cfg["n_routed_experts"], cfg["num_experts_per_tok"], cfg["n_group"], cfg["topk_group"]) == (64, 6, 1, 1)
    assert cfg["scoring_func"] == "sigmoid" and cfg["vocab_size"] == 102400


def test_invalid_requests(tmp_path):
    with pytest.raises(CheckpointWriteError, match="shape must be one of"):
        checkpoint_config("v4")
    with pytest.raises(CheckpointWriteError, match="--layers must be a positive"):
        checkpoint_config("v2lite", 0)
    with pytest.raises(CheckpointWriteError, match="--dense-layers"):
        checkpoint_config("v2lite", 3, 4)
    (tmp_path / "x").mkdir()
    with pytest.raises(CheckpointWriteError, match="exists"):
        write_checkpoint(tmp_path / "x", "tiny-v2")
    r = subprocess.run([sys.executable, str(REPO / "tools/make_checkpoint.py"), str(tmp_path / "y"), "--shape", "v3",
                        "--layers", "4", "--dry-run"], capture_output=True, text=True)
    assert r.returncode == 0 and "30.22 GB bf16" in r.stdout and not (tmp_path / "y").exists()
