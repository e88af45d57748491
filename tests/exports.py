"""Every export the tests share, made once per test session (the `exports` fixture in conftest):
tiny random checkpoints exported with the CLI, keyed by what differs between them."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SEEDS = {"deepseek_v3": 11, "deepseek_v2": 12, "deepseek_v32": 13, "glm_moe_dsa": 14}  # checkpoint weights per model type


class Exports:
    def __init__(self, tmp_path_factory):
        self._tmp = tmp_path_factory
        self._ckpts: dict[str, Path] = {}
        self._exports: dict[tuple, Path] = {}
        self._tiny: Path | None = None

    def checkpoint(self, model_type: str = "deepseek_v3") -> Path:
        """A tiny random checkpoint of `model_type` in transformers' layout (one per type)."""
        if model_type not in self._ckpts:
            from mla_export.checkpoint.presets import make_checkpoint

            root = self._tmp.mktemp(f"ckpt_{model_type}")
            self._ckpts[model_type] = make_checkpoint(root / "ckpt", model_type, seed=SEEDS[model_type])
        return self._ckpts[model_type]

    def model(self, model_type: str = "deepseek_v3", kv_dtype: str = "f32", block_size: int = 4,
              fmt: str = "openvino", portable: bool = False) -> tuple[Path, Path]:
        """(checkpoint dir, export dir): the checkpoint exported as `fmt` (openvino | onnx | both)."""
        key = (model_type, kv_dtype, block_size, fmt, portable)
        if key not in self._exports:
            from mla_export.cli import main

            out = self._tmp.mktemp(f"export_{model_type}_{kv_dtype}_{block_size}_{fmt}{'_portable' if portable else ''}")
            args = ["export", str(self.checkpoint(model_type)), "-o", str(out), "--format", fmt,
                    "--block-size", str(block_size), "--kv-dtype", kv_dtype, "-q"]
            code = main(args + (["--portable"] if portable else []))
            assert code == 0, f"export of {model_type} ({' '.join(args[3:])}) failed with exit code {code}"
            self._exports[key] = out
        return self.checkpoint(model_type), self._exports[key]

    def tiny(self) -> Path:
        """`mla-export export --preset tiny -o DIR` run as the command (a subprocess), once."""
        if self._tiny is None:
            out = self._tmp.mktemp("tiny") / "tiny-export"
            proc = subprocess.run([sys.executable, "-m", "mla_export.cli", "export", "--preset", "tiny", "-o", str(out)],
                                  cwd=REPO, capture_output=True, text=True)
            if proc.returncode != 0:
                raise RuntimeError(f"tiny export failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
            self._tiny = out
        return self._tiny
