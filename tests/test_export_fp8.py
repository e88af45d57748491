"""FP8 checkpoints as DeepSeek-V3 / R1 / Kimi K2 ship them (e4m3 codes, a float32
`weight_scale_inv` per block, `quantization_config.quant_method: fp8`), read directly.

The tiny checkpoints are transformers' own (f32), rewritten by `write_fp8_checkpoint` the way
DeepSeek writes its releases, with 32 x 32 blocks so that most projections end in partial
blocks. The oracle is transformers' model with every quantized weight replaced by its
dequantised value (codes x block scale, float32): logits within 1e-5, greedy tokens equal (f32).
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from hf_models import PagedSession, drive_and_compare, load_hf
from mla_export.checkpoint.fp8 import quantize_fp8_blocks, write_fp8_checkpoint
from mla_export.checkpoint.writer import save_safetensors
from mla_export.export import export_model
from mla_export.checkpoint.reader import CheckpointReader, WeightError, dequantize_fp8_blocks
from mla_export.checkpoint.presets import make_checkpoint
from test_export_models import BLOCK, NUM_BLOCKS, SCHEDULE, _prompts, openvino_runner

BLOCKS = (32, 32)


@pytest.fixture(scope="module")
def fp8_ckpt(tmp_path_factory):
    """(the FP8 checkpoint, a float32 checkpoint of its dequantised weights)."""
    base = tmp_path_factory.mktemp("fp8")
    src = make_checkpoint(base / "f32", "kimi_k2", seed=4)
    fp8 = write_fp8_checkpoint(src, base / "fp8", BLOCKS)
    reader = CheckpointReader(fp8, fp8_block=BLOCKS)
    names = [n for n in reader._where if not n.endswith("_scale_inv")]
    assert sum(reader.has(n + "_scale_inv") for n in names) > 20, "every projection should be quantized"
    deq = base / "dequantised"
    deq.mkdir()
    save_safetensors(deq / "model.safetensors", {n: reader.get(n) for n in names})
    cfg = json.loads((fp8 / "config.json").read_text())
    del cfg["quantization_config"]
    (deq / "config.json").write_text(json.dumps(cfg))
    return fp8, deq


def test_quantize_round_trip_and_partial_blocks(rng):
    w = rng.standard_normal((70, 45)).astype(np.float32)
    codes, scale = quantize_fp8_blocks(w, (32, 32))
    assert codes.dtype.name == "float8_e4m3fn" and scale.shape == (3, 2)
    back = dequantize_fp8_blocks(codes, scale, (32, 32))
    # e4m3 keeps 3 mantissa bits: every value within 2^-4 relative of its block's scale x 448
    assert np.abs(back - w).max() <= np.abs(w).max() / 16
    # each block's largest magnitude is exactly representable (it maps to +-448)
    assert np.isclose(np.abs(back[:32, :32]).max(), np.abs(w[:32, :32]).max(), rtol=1e-6)


def test_fp8_checkpoint_matches_transformers_on_dequantised_weights(fp8_ckpt, tmp_path, rng):
    fp8, deq = fp8_ckpt
    raw = json.loads((fp8 / "config.json").read_text())
    assert raw["quantization_config"]["weight_block_size"] == list(BLOCKS) and raw["model_type"] == "kimi_k2"
    out = tmp_path / "out"
    export_model(fp8, out, fmt="openvino", block_size=BLOCK, kv_dtype="f32", weight_dtype="f32")
    hf = load_hf(deq)  # transformers on the dequantised weights
    cfg = hf.config
    run, _ = openvino_runner(out / "openvino_model.xml", cfg.num_hidden_layers, cfg.kv_lora_rank + cfg.qk_rope_head_dim)
    stats = drive_and_compare(run, hf, PagedSession(BLOCK, NUM_BLOCKS, rng), _prompts(7, cfg.vocab_size), SCHEDULE, 1e-5)
    assert stats["agree"] == stats["total"]


@pytest.mark.parametrize("weight_format", ["int8", "int4", "bf16"])
def test_fp8_exports_as_its_dequantised_float_checkpoint(fp8_ckpt, tmp_path, weight_format):
    """Every weight format from the FP8 file: byte for byte the export of a float32 checkpoint
    holding the dequantised values (the reader's output is the only input the export sees)."""
    fp8, deq = fp8_ckpt
    bins = []
    for ckpt in (fp8, deq):
        out = tmp_path / f"out-{ckpt.name}"
        export_model(ckpt, out, fmt="openvino", block_size=BLOCK, kv_dtype="f32", weight_format=weight_format)
        bins.append((out / "openvino_model.bin").read_bytes())
    assert bins[0] == bins[1]


def test_fp8_errors(fp8_ckpt, tmp_path):
    fp8, _ = fp8_ckpt
    name = "model.layers.0.self_attn.q_a_proj.weight"
    with pytest.raises(WeightError, match="no quantization_config"):
        CheckpointReader(fp8).get(name)
    reader = CheckpointReader(fp8, fp8_block=(16, 16))  # scales laid out for 32 x 32 blocks
    with pytest.raises(WeightError, match="_scale_inv' has shape"):
        reader.get(name)
    from mla_export.checkpoint.reader import SafetensorsFile

    f = SafetensorsFile(fp8 / "model.safetensors")
    tensors = {n: f.array(n) for n in f.entries if n != name + "_scale_inv"}
    broken = tmp_path / "broken"
    broken.mkdir()
    save_safetensors(broken / "model.safetensors", tensors)
    (broken / "config.json").write_text((fp8 / "config.json").read_text())
    with pytest.raises(WeightError, match="needs a 2-D shape and its"):
        CheckpointReader(broken, fp8_block=BLOCKS).get(name)


def _with_int8_table_and_head(hf):
    """transformers' model with the embedding and lm_head replaced by their int8 values (what
    --weight-format fp8 stores for them, as int4 does)."""
    import torch

    from mla_export.export.quantize import dequantize, quantize

    with torch.no_grad():
        for p in (hf.model.embed_tokens.weight, hf.lm_head.weight):
            p.copy_(torch.from_numpy(dequantize(quantize(p.numpy(), 8))))
    hf.__dict__.pop("_last_logits_memo", None)
    return hf


@pytest.mark.parametrize("file", ["openvino_model.xml", "model.onnx"])
def test_fp8_weight_format_keeps_the_checkpoint_codes(fp8_ckpt, tmp_path, rng, file):
    """--weight-format fp8 from an FP8 checkpoint: every projection and expert in its own e4m3 codes
    and block scales, read by our ops: transformers' logits on the dequantised weights (f32)."""
    fp8, deq = fp8_ckpt
    out = tmp_path / "out"
    result = export_model(fp8, out, fmt="both", block_size=BLOCK, kv_dtype="f32", weight_format="fp8")
    params = result.contract["export"]["weight_params"]
    # projections and experts fp8; table and head int8; projections our ops cannot take (48 rows here) float
    assert params["fp8"] > params["int8"] > 0 and set(params) == {"fp8", "int8", "f32"}, params
    hf = _with_int8_table_and_head(load_hf(deq))
    cfg = hf.config
    run, _ = openvino_runner(out / file, cfg.num_hidden_layers, cfg.kv_lora_rank + cfg.qk_rope_head_dim)
    stats = drive_and_compare(run, hf, PagedSession(BLOCK, NUM_BLOCKS, rng), _prompts(7, cfg.vocab_size), SCHEDULE, 1e-5)
    assert stats["agree"] == stats["total"]


def test_fp8_weight_format_from_a_float_checkpoint(tmp_path, rng):
    """--weight-format fp8 from a float checkpoint: each matmul weight's rows quantized to e4m3 with
    a scale per 32 inputs (this checkpoint's sizes; 128 where they allow): transformers on exactly
    those values."""
    import torch

    from mla_export.export.quantize import fp8_dequantize, fp8_group, fp8_operands

    src = make_checkpoint(tmp_path / "ckpt", "deepseek_v2", seed=8, q_lora_rank=None)
    out = tmp_path / "out"
    export_model(src, out, fmt="openvino", block_size=BLOCK, kv_dtype="f32", weight_format="fp8")
    hf = _with_int8_table_and_head(load_hf(src))
    with torch.no_grad():
        for name, p in hf.named_parameters():
            # what the export stores as fp8: the projections our ops read (kv_b_proj becomes the
            # attention op's float operands; the router stays f32; kv_a_proj_with_mqa's 48 rows
            # here are not a multiple of 32, so it stays float too)
            ours = "proj" in name and "kv_b_proj" not in name and p.ndim >= 2 and p.shape[-2] % 32 == 0
            if ours:
                w = p.detach().numpy()
                codes, scales, _ = fp8_operands(w, fp8_group(w.shape[-1]))
                p.copy_(torch.from_numpy(fp8_dequantize(codes, scales)))
    hf.__dict__.pop("_last_logits_memo", None)
    cfg = hf.config
    run, _ = openvino_runner(out / "openvino_model.xml", cfg.num_hidden_layers, cfg.kv_lora_rank + cfg.qk_rope_head_dim)
    stats = drive_and_compare(run, hf, PagedSession(BLOCK, NUM_BLOCKS, rng), _prompts(7, cfg.vocab_size), SCHEDULE, 1e-5)
    assert stats["agree"] == stats["total"]


def test_fp8_rows_refuses_nan_codes(fp8_ckpt, tmp_path):
    """The codes --weight-format fp8 keeps are checked as the dequantised read is: a NaN code is refused."""
    from mla_export.checkpoint.reader import SafetensorsFile

    fp8, _ = fp8_ckpt
    name = "model.layers.0.self_attn.q_a_proj.weight"
    f = SafetensorsFile(fp8 / "model.safetensors")
    tensors = {n: f.array(n) for n in f.entries}
    codes = tensors[name].view(np.uint8).copy()
    codes[3, 5] = 0x7F  # e4m3fn NaN
    tensors[name] = codes.view(tensors[name].dtype)
    bad = tmp_path / "nan"
    bad.mkdir()
    save_safetensors(bad / "model.safetensors", tensors)
    reader = CheckpointReader(bad, fp8_block=BLOCKS)
    shape = tuple(codes.shape)
    with pytest.raises(WeightError, match="NaN or Inf"):
        reader.fp8_rows(name, shape)
    with pytest.raises(WeightError, match="NaN or Inf"):
        reader.get(name, shape)
