"""The tiny preset without torch: written with numpy in transformers' layout (transformers loads
it with no missing or unexpected tensor, and the export generates what transformers generates,
f32), and `mla-export export --preset tiny` + `generate` run with torch and transformers
unimportable, as in a venv that has only the `export` extra."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from runtime_models import hf_greedy

REPO = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize("model_type, overrides", [("deepseek_v3", {}), ("deepseek_v2", {}),
                                                   ("deepseek_v3", {"q_lora_rank": None}),
                                                   ("deepseek_v3", {"dtype": "bfloat16"})])
def test_numpy_checkpoint_loads_in_transformers_and_exports_exactly(tmp_path, model_type, overrides):
    # bf16: the stored weights are bf16 on both sides, computed at f32 on both sides.
    import torch
    from transformers import AutoModelForCausalLM

    from mla_export import LLM
    from mla_export.cli import main
    from mla_export.checkpoint.presets import make_numpy_checkpoint

    ckpt = make_numpy_checkpoint(tmp_path / "ckpt", model_type, seed=7, **overrides)
    _, info = AutoModelForCausalLM.from_pretrained(ckpt, dtype=torch.float32, output_loading_info=True)
    assert not any(info[k] for k in ("missing_keys", "unexpected_keys", "mismatched_keys", "error_msgs")), info
    out = tmp_path / "out"
    assert main(["export", str(ckpt), "-o", str(out), "--kv-dtype", "f32", "--block-size", "4", "-q"]) == 0
    prompt = [0, 5, 9, 17, 33, 2, 80]
    ours = LLM(out, precision="f32").generate([prompt], max_tokens=12, temperature=0.0)[0].token_ids
    assert ours == hf_greedy(ckpt, prompt, 12)  # f32 greedy, token for token


def test_export_extra_declares_no_torch():
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    names = [d.split("[")[0].split(">")[0].split("=")[0].split("<")[0].strip().lower() for d in extras["export"]]
    assert "torch" not in names and "transformers" not in names, extras["export"]
    base = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    assert not any(d.lower().startswith(("torch", "transformers")) for d in base)


_NO_TORCH = """
import importlib.abc, sys

class Block(importlib.abc.MetaPathFinder):
    # torch, transformers and safetensors behave as if not installed.
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("torch", "transformers", "safetensors"):
            raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
        return None

sys.meta_path.insert(0, Block())
from mla_export.cli import main
assert main(["export", "--preset", "tiny", "-o", {out!r}, "-q"]) == 0
assert main(["generate", {out!r}, "--prompt", "The quick brown fox", "--max-tokens", "8"]) == 0
# A checkpoint directory as downloaded (bf16 safetensors, config.json, tokenizer files).
from mla_export.checkpoint.presets import make_numpy_checkpoint
ckpt = make_numpy_checkpoint({out!r} + "-ckpt", "deepseek_v2", seed=4, dtype="bfloat16")
assert main(["export", str(ckpt), "-o", {out!r} + "-v2", "-q"]) == 0
assert main(["generate", {out!r} + "-v2", "--prompt", "Once upon a time", "--max-tokens", "8"]) == 0
leaked = sorted(m for m in sys.modules if m.split(".")[0] in ("torch", "transformers", "safetensors"))
assert not leaked, leaked
print("ok")
"""


def test_preset_export_and_generate_without_torch(tmp_path):
    script = textwrap.dedent(_NO_TORCH.format(out=str(tmp_path / "tiny")))
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=600, cwd=REPO)
    assert run.returncode == 0 and run.stdout.strip().endswith("ok"), (run.stdout, run.stderr)
