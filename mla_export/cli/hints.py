"""What to tell a user who types another tool's habits (optimum-cli, vllm serve, llama.cpp).

Flags that map to something real here are aliases in the commands' own parsers; this module
covers the rest: for an option the command does not know, the nearest equivalent here (or a
close spelling of one of its options), and for a Hugging Face Hub id where a directory is
expected, how to download it first. Only unknown options reach `unknown_option_lines` (a
known one never does), so a flag a command gains later simply stops being hinted.
"""

from __future__ import annotations

import argparse
import difflib
import re
from pathlib import Path

from ..formats.kv_formats import KV_DTYPES

__all__ = ["unknown_option_lines", "hub_id_message", "looks_like_hub_id", "add_foreign_flags"]

_CPU_ONLY = "this runs on the CPU only (OpenVINO's CPU plugin); drop it"
_CONTEXT = "the context length is the export's (config.json's max_position_embeddings)"

# command -> {foreign option: the nearest equivalent here}
HINTS: dict[str, dict[str, str]] = {
    "export": {
        "--sym": "int8/int4 weights here have a zero point per channel/group: --weight-format int8|int4 [--group-size N]",
        "--awq": "no data-aware compression here: --weight-format int4 --ratio R keeps the most int4-sensitive weights int8",
        "--dataset": "no data-aware compression here: --weight-format int4 --ratio R keeps the most int4-sensitive weights int8",
        "--tensor-type": "llama-quantize's per-tensor types: --weight-format int4 --tensor-format PATTERN=int8|int4 "
                         "(or --recipe int4-mixed)",
        "--framework": "the exporter reads safetensors checkpoints directly; drop it",
        "--library": "the exporter reads DeepSeek-V2/V3 checkpoints directly; drop it",
        "--device": _CPU_ONLY,
        "--dtype": "use --weight-format {auto,f32,f16,bf16,int8,int4} for the stored weights, --kv-dtype "
                   f"{{{','.join(KV_DTYPES)}}} for the cache",
        "--kv-cache-dtype": f"use --kv-dtype {{{','.join(KV_DTYPES)}}} (the cache format is fixed at export)",
        "--cache_dir": "the Hub is not used: download with `hf download ID --local-dir DIR` and pass DIR",
        "--cache-dir": "the Hub is not used: download with `hf download ID --local-dir DIR` and pass DIR",
        "--revision": "the Hub is not used: `hf download ID --revision REV --local-dir DIR`, then pass DIR",
    },
    "serve": {
        "--tensor-parallel-size": "one CPU process: use --threads N for the inference threads",
        "-tp": "one CPU process: use --threads N for the inference threads",
        "--pipeline-parallel-size": "one CPU process: use --threads N for the inference threads",
        "-pp": "one CPU process: use --threads N for the inference threads",
        "--data-parallel-size": "one CPU process: use --threads N for the inference threads",
        "--gpu-memory-utilization": "size the KV cache with --kv-cache-memory SIZE (e.g. 2GiB) or --num-blocks N",
        "--device": _CPU_ONLY,
        "--tokenizer": "the tokenizer is the one copied into the export directory at export time",
        "--quantization": "weights are compressed at export: `mla-export export --weight-format {int8,int4,bf16,...}`",
        "-q": "weights are compressed at export: `mla-export export --weight-format {int8,int4,bf16,...}`",
        "--block-size": "the cache block size is fixed at export: `mla-export export --block-size N`",
        "--swap-space": "preempted requests are recomputed, nothing is swapped; drop it",
        "--seed": "pass 'seed' in each request instead",
        "--max-logprobs": "logprobs are not returned by this server",
        "--load-format": "the model is the export directory's OpenVINO IR; drop it",
        "--download-dir": "the Hub is not used: `hf download ID --local-dir DIR`, export DIR, serve the export",
        "--revision": "the Hub is not used: `hf download ID --revision REV --local-dir DIR`",
        "--generation-config": "sampling defaults come from each request",
        "--max-model-len": _CONTEXT + "; size the KV cache with --kv-cache-memory or --num-blocks",
    },
    "generate": {
        "-c": _CONTEXT,
        "--ctx-size": _CONTEXT,
        "-ngl": _CPU_ONLY,
        "-fa": "attention is the MLA kernels' own (flash-style, on the CPU); drop it",
        "-sm": _CPU_ONLY,
        "-ts": _CPU_ONLY,
        "--n-gpu-layers": _CPU_ONLY,
        "--gpu-layers": _CPU_ONLY,
        "--device": _CPU_ONLY,
        "-i": "for a conversation in the terminal: `mla-export chat OUT_DIR`; --chat is one turn",
        "--interactive": "for a conversation in the terminal: `mla-export chat OUT_DIR`; --chat is one turn",
        "--repeat-penalty": "no repetition penalty here; use --temperature / --top-p / --top-k",
        "--min-p": "no min-p sampling here; use --top-p / --top-k",
        "--mlock": "drop it (the weights are memory-mapped by OpenVINO)",
        "--no-mmap": "drop it (the weights are memory-mapped by OpenVINO)",
        "--tokenizer": "the tokenizer is the one copied into the export directory at export time",
    },
}

# `chat` takes generate's llama.cpp habits (it is llama-cli's conversation mode)
HINTS["chat"] = {flag: hint for flag, hint in HINTS["generate"].items() if flag not in ("-i", "--interactive")}

# A Hub id: "org/name" (one slash, no path-like start). Only said when no such path exists.
_HUB_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*")


def looks_like_hub_id(text: str) -> bool:
    return bool(_HUB_ID.fullmatch(text)) and not Path(text).exists()


def hub_id_message(text: str, command: str) -> str:
    """One message for a missing directory whose name has a Hub id's shape (org/name)."""
    local = text.split("/")[-1]
    if command == "export":
        return (f"{text}: no such directory; if it is a Hugging Face Hub id, note that mla-export does not "
                f"download models: download it first with `hf download {text} --local-dir {local}`, "
                f"then pass the directory: `mla-export export {local} -o out/{local}`")
    return (f"{text}: no such directory; if it is a Hugging Face Hub id, note that `mla-export {command}` runs "
            f"an export directory: download the checkpoint first with `hf download {text} "
            f"--local-dir {local}`, export it with `mla-export export {local} -o out/{local}`, then pass out/{local}")


class ForeignFlag(argparse.Action):
    """A short flag of another tool that argparse would otherwise misread as one of ours with
    an attached value (llama.cpp's `-ngl 99` as `-n gl`): it stops with its hint."""

    def __init__(self, option_strings, dest, hint: str = "", **kwargs):
        kwargs.update(nargs="?", help=argparse.SUPPRESS, default=argparse.SUPPRESS)
        super().__init__(option_strings, dest, **kwargs)
        self.hint = hint

    def __call__(self, parser, namespace, values, option_string=None):
        parser.error(f"{option_string} is not an option of `{parser.prog}`: {self.hint}")


def add_foreign_flags(parser: argparse.ArgumentParser, command: str, flags: tuple[str, ...]) -> None:
    """Register `flags` (keys of HINTS[command]) as ForeignFlag options of `parser`."""
    for flag in flags:
        parser.add_argument(flag, action=ForeignFlag, dest=f"_foreign{flag.replace('-', '_')}",
                            hint=HINTS[command][flag])


def unknown_option_lines(command: str, extras: list[str], known: list[str]) -> list[str]:
    """One line per unknown option in `extras` (values after an option are skipped): the
    nearest equivalent from HINTS, else close spellings among `known`, else 'not an option'."""
    lines = []
    hints = HINTS.get(command, {})
    for arg in extras:
        if not arg.startswith("-") or arg == "-" or _is_number(arg):
            continue  # a value of an unknown option, or a stray positional (reported by the caller)
        flag = arg.split("=", 1)[0]
        if flag in hints:
            lines.append(f"{flag} is not an option of `mla-export {command}`: {hints[flag]}")
            continue
        close = difflib.get_close_matches(flag, known, n=2, cutoff=0.7)
        if close:
            lines.append(f"{flag} is not an option of `mla-export {command}`; did you mean {' or '.join(close)}?")
        else:
            lines.append(f"{flag} is not an option of `mla-export {command}` (see `mla-export {command} --help`)")
    return lines


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True
