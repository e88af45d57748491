"""Every MLA family beyond DeepSeek-V2/V3 against transformers' own implementation (f32).

Each family's tiny checkpoint is made by transformers' own classes (`make_checkpoint`, random
weights; Kimi K2 with DeepSeek-V3's classes under its own model_type, as its release does) and
exported once with --format both --portable. Then, in the OpenVINO IR, model.onnx in OpenVINO
and the portable ONNX in onnxruntime: the paged schedule of test_export_models (a full prefill, a
chunk and a one-token prompt, shuffled block tables, NaN in unowned cache rows) and 32 greedy
decode tokens, every row's logits within 1e-5 (max relative error) of transformers' and every
greedy token equal. The families and their differences: mla_export/families/.
"""

from __future__ import annotations

import numpy as np
import pytest

from hf_models import PagedSession, drive_and_compare, load_hf
from mla_export.export import export_model
from mla_export.checkpoint.presets import make_checkpoint
from test_export_models import BLOCK, NUM_BLOCKS, SCHEDULE, _prompts, openvino_runner, portable_runner

TOL = 1e-5
FAMILIES = ["kimi_k2", "glm4_moe_lite", "sarvam_mla", "youtu", "axk1", "minicpm3", "mistral4", "longcat_flash",
            "mistral3"]  # mistral3: Mistral Small 4 as released, a mistral4 text tower beside a vision tower
BACKENDS = {"openvino-ir": (openvino_runner, "openvino_model.xml"),
            "onnx-in-openvino": (openvino_runner, "model.onnx"),
            "portable-onnxruntime": (portable_runner, "model_portable.onnx")}


@pytest.fixture(scope="module", params=FAMILIES)
def exported(request, tmp_path_factory):
    base = tmp_path_factory.mktemp(request.param)
    ckpt = make_checkpoint(base / "ckpt", request.param, seed=3)
    out = base / "out"
    export_model(ckpt, out, fmt="both", portable=True, block_size=BLOCK, kv_dtype="f32", weight_dtype="f32")
    return ckpt, out, load_hf(ckpt)


def _runner(backend, out, hf):
    cfg = hf.config.get_text_config()  # a multimodal model's text tower
    maker, file = BACKENDS[backend]
    return maker(out / file, cfg.num_hidden_layers, cfg.kv_lora_rank + cfg.qk_rope_head_dim)[0]


@pytest.mark.parametrize("backend", list(BACKENDS))
def test_paged_schedule_matches_transformers(exported, backend, rng):
    ckpt, out, hf = exported
    session = PagedSession(BLOCK, NUM_BLOCKS, rng)
    stats = drive_and_compare(_runner(backend, out, hf), hf, session, _prompts(7, hf.config.get_text_config().vocab_size), SCHEDULE, TOL)
    assert stats["agree"] == stats["total"], f"greedy tokens differ: {stats}"


@pytest.mark.parametrize("backend", ["openvino-ir", "portable-onnxruntime"])
def test_32_greedy_tokens(exported, backend, rng):
    ckpt, out, hf = exported
    session = PagedSession(BLOCK, NUM_BLOCKS, rng)
    prompt = {"a": np.random.default_rng(5).integers(2, hf.config.get_text_config().vocab_size, 9)}
    steps = [[("a", 9)]] + [[("a", None)] for _ in range(32)]
    stats = drive_and_compare(_runner(backend, out, hf), hf, session, prompt, steps, TOL)
    assert stats["agree"] == stats["total"] == 33, f"greedy tokens differ: {stats}"
    assert len(session.tokens["a"]) == 9 + 33
