"""`mla-export export MODEL_DIR -o OUT_DIR` (or `MODEL_DIR OUT_DIR`): a DeepSeek-V2/V3 checkpoint to OpenVINO IR / ONNX
with the paged latent KV cache (or `--preset tiny` for a built-in random-weight model)."""

from __future__ import annotations

import argparse
import sys
import tempfile

# User errors (bad arguments, config, weights, output directory) exit with 2 and one message.
EXIT_USAGE = 2


def add_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser("export", help="export a DeepSeek-V2/V3 checkpoint with the paged latent cache",
                              description=__doc__.splitlines()[0])
    p.add_argument("model_dir", nargs="?", metavar="MODEL_DIR",
                   help="Hugging Face checkpoint directory (config.json, *.safetensors, tokenizer files)")
    _add_output_arguments(p)
    p.add_argument("--preset", choices=("tiny", "tiny-mtp"),
                   help="export a built-in tiny random-weight DeepseekV3 instead (tiny-mtp: with its MTP layer, "
                        "exported as a speculative-decoding draft)")
    p.add_argument("--format", dest="fmt", choices=("openvino", "onnx", "both"), default="openvino",
                   help="openvino: IR (the runtime's fast path); onnx: model.onnx with the mla_export ops")
    p.add_argument("--portable", action="store_true",
                   help="also write model_portable.onnx (standard ops only, runs in plain onnxruntime)")
    p.add_argument("--block-size", type=int, default=16, help="cache block size in tokens (default 16)")
    from ...formats.kv_formats import KV_DTYPES, QUANTISED, describe

    p.add_argument("--kv-dtype", choices=KV_DTYPES, default="f16",
                   help="latent cache row format (default f16: bf16's size, ~10x closer to f32); bytes per 512+64 "
                        f"row: {describe(512, 64)} ({'/'.join(QUANTISED)}: codes + f32 group scales, k_pe bf16); a "
                        "sparse-attention model's indexer-key cache takes the same format (all its values codes); "
                        "see docs/KV_CACHE.md")
    p.add_argument("--weight-format", "--weight-dtype", dest="weight_format",
                   choices=("auto", "f32", "f16", "bf16", "int8", "int4", "fp8"), default="auto",
                   help="how weights are stored (optimum-cli's spelling): auto = the checkpoint's float dtype; "
                        "int8 = per output channel; int4 = per group of --group-size inputs, embedding and "
                        "lm_head int8; fp8 = e4m3 codes with a scale per 128 inputs (an FP8 checkpoint's own codes "
                        "and block scales, unchanged), read by our ops, embedding and lm_head int8. "
                        "OpenVINO decompresses int8/int4 on the fly (1 / 0.5 byte per weight "
                        "resident); on CPUs without native bf16/f16 it widens bf16/f16 weights to f32 at compile")
    p.add_argument("--group-size", type=int, default=None,
                   help="int4 inputs per scale (default 128, or the --recipe's; -1 = one per output channel); a size that does not "
                        "divide a weight's inputs falls back to the largest halving that does (10944 -> 64)")
    p.add_argument("--ratio", type=float, default=1.0,
                   help="int4 only: share of the matmul weights (by parameters) kept int4, the rest int8, the most "
                        "int4-sensitive first (default 1.0; below 1 costs one more pass over the checkpoint)")
    p.add_argument("--all-layers", action="store_true",
                   help="int4 only (optimum-cli's flag): the embedding table and lm_head in int4 too, not int8. "
                        "lm_head is the largest weight a decode step reads; in int4 it reads half the bytes, "
                        "at a larger logits error (docs/WEIGHTS.md)")
    p.add_argument("--tensor-format", dest="tensor_formats", action="append", default=None,
                   metavar="PATTERN=FORMAT",
                   help="int4 only, repeatable (llama-quantize's --tensor-type): weights whose checkpoint name the "
                        "regular expression PATTERN matches are stored as FORMAT (int8 or int4), e.g. "
                        "'down_proj=int8', 'lm_head=int4'; routed experts per projection (gate/up together, down). "
                        "The first matching PATTERN decides; the contract records which weights each one took "
                        "(docs/WEIGHTS.md)")
    from ...export.recipes import RECIPES

    p.add_argument("--recipe", choices=tuple(RECIPES), default=None,
                   help="a named int4 recipe (implies --weight-format int4): "
                        + "; ".join(f"{n}: {r.about}" for n, r in RECIPES.items())
                        + ". Measured against llama.cpp's Q4_K_M in docs/WEIGHTS.md. --group-size and "
                          "--tensor-format given with it take precedence")
    p.add_argument("--moe-form", choices=("auto", "fused", "grouped", "gather-matmul"), default="auto",
                   help="routed experts: fused (one MlaMoeExperts op per layer reading the int8/int4 codes of the "
                        "selected experts; IR and model.onnx), grouped (one dispatch, per-expert GEMMs on each "
                        "expert's rows) or gather-matmul (OpenVINO's GatherMatmul, IR only; batches an expert's "
                        "tokens only with AMX). Default auto: fused for int8/int4 weights, else grouped. The "
                        "portable ONNX is always grouped")
    p.add_argument("--max-model-len", type=int, default=None, metavar="N",
                   help="positions the export holds (its RoPE tables have a row for each; the runtime refuses "
                        "longer sequences); default and maximum config.json's max_position_embeddings")
    p.add_argument("--overwrite", action="store_true", help="replace a previous export in OUT_DIR")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress display")
    # optimum-cli habits that mean something here (the rest get a hint: mla_export/cli/hints.py).
    p.add_argument("-m", "--model", dest="model_opt", metavar="MODEL_DIR",
                   help="same as the MODEL_DIR argument (optimum-cli's spelling)")
    p.add_argument("--task", choices=TASKS,
                   help="accepted for optimum-cli compatibility: the export is always text generation with a (paged) cache")
    p.add_argument("--trust-remote-code", action="store_true",
                   help="accepted and ignored: the exporter reads config.json and safetensors, it never runs model code")
    return p


def _add_output_arguments(p: argparse.ArgumentParser) -> None:
    # optimum-cli's form `export MODEL OUT_DIR` (and `--model MODEL OUT_DIR`) besides -o OUT_DIR
    p.add_argument("out_pos", nargs="?", metavar="OUT_DIR",
                   help="export directory, as the second argument (optimum-cli's form) or with -o")
    p.add_argument("-o", "--output", dest="out_dir", default=None, metavar="OUT_DIR",
                   help="export directory (created; written all at once at the end)")


def finish_parsing(args, extras: list[str]) -> list[str]:
    """Called by the CLI after parsing: OUT_DIR after options (`export MODEL --weight-format int8
    OUT_DIR`, left over by argparse) is claimed, and args.out_dir settled from -o or OUT_DIR."""
    if len(extras) == 1 and not extras[0].startswith("-") and args.out_pos is None:
        args.out_pos, extras = extras[0], []
    if not extras:  # with other unknown arguments the CLI reports those first
        args.out_dir = _output_dir(args)
    return extras


def _output_dir(args) -> str:
    """The export directory from -o or the positional OUT_DIR. With --model or --preset, a single
    positional is OUT_DIR (`optimum-cli export openvino --model M OUT_DIR`)."""
    if args.out_pos is None and args.model_dir is not None and (args.model_opt is not None or args.preset):
        args.model_dir, args.out_pos = None, args.model_dir
    if args.out_pos is not None and args.out_dir is not None and args.out_pos != args.out_dir:
        raise ValueError(f"give the export directory once: OUT_DIR ({args.out_pos}) or -o ({args.out_dir})")
    out = args.out_dir or args.out_pos
    if out is None:
        raise ValueError("give the export directory: mla-export export MODEL_DIR -o OUT_DIR (or MODEL_DIR OUT_DIR)")
    return out


# optimum-cli's tasks that this export is (it always has the cache, i.e. "with past").
TASKS = ("auto", "text-generation", "text-generation-with-past")


def run(args) -> int:
    """Every exit of the command: 0 (the export is in place, even when a signal arrived after it
    was), 2 (a user error, one line), 1 (an OS error, one line), 130/143 (SIGINT/SIGTERM before
    the export was in place: one line, the partial output removed). The signal handlers go in
    before anything slow is imported (mla_export/export/signals.py)."""
    from mla_export.export.signals import export_signals

    with export_signals(final=getattr(args, "whole_process", False)) as signals:
        try:
            try:
                signals.armed = True
                if signals.first is not None:  # arrived while the arguments were parsed
                    signals.raised = True
                    raise KeyboardInterrupt
                code = _run(args, signals)
            finally:
                signals.armed = False
        except BaseException as e:  # a signal raised while the error above was being handled
            return _failed(e, args, signals, None)
        if signals.first is not None and signals.complete and code == 0:
            name = "SIGTERM" if signals.fired else "SIGINT"
            print(f"mla-export export: {name} arrived after the export was complete; {args.out_dir} is in place",
                  file=sys.stderr)
        return code


def _failed(e: BaseException, args, signals, progress) -> int:
    """The exit code and one line for an export that ended with `e` (its partial output removed)."""
    if progress is not None:
        progress.close()
    if signals.complete and isinstance(e, OSError):  # e.g. stdout closed during the summary: the export is in place
        if isinstance(e, BrokenPipeError):
            import os

            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no second error at exit
        print(f"mla-export export: {e.strerror or e} after the export was complete; {args.out_dir} is in place",
              file=sys.stderr)
        return 0
    if signals.first is not None and not signals.complete:
        if signals.fired:
            print("mla-export export: terminated (SIGTERM); nothing was written (the partial output was removed)",
                  file=sys.stderr)
            return 143
        print("mla-export export: interrupted; nothing was written (the partial output was removed)", file=sys.stderr)
        return 130
    from mla_export.checkpoint.config import ConfigError
    from mla_export.formats.contract_error import ContractError
    from mla_export.export import ExportError
    from mla_export.checkpoint.reader import WeightError

    if isinstance(e, (ConfigError, WeightError, ExportError, ContractError)):
        print(f"mla-export export: {e}", file=sys.stderr)
        return EXIT_USAGE
    if isinstance(e, KeyboardInterrupt):  # raised by something else than our handler
        print("mla-export export: interrupted; nothing was written (the partial output was removed)", file=sys.stderr)
        return 130
    if isinstance(e, OSError):  # disk full, permissions, ...
        print(f"mla-export export: {e.strerror or e} ({e.filename or args.out_dir}); nothing was written",
              file=sys.stderr)
        return 1
    raise e


def _run(args, signals) -> int:
    if args.model_opt is not None:
        if args.model_dir is not None and args.model_dir != args.model_opt:
            print("mla-export export: give the checkpoint once (MODEL_DIR or --model)", file=sys.stderr)
            return EXIT_USAGE
        args.model_dir = args.model_opt
    if (args.model_dir is None) == (args.preset is None):
        print("mla-export export: give either MODEL_DIR or --preset tiny", file=sys.stderr)
        return EXIT_USAGE
    from mla_export.cli.hints import hub_id_message, looks_like_hub_id

    if args.model_dir is not None and looks_like_hub_id(args.model_dir):
        print(f"mla-export export: {hub_id_message(args.model_dir, 'export')}", file=sys.stderr)
        return EXIT_USAGE
    progress = None
    try:
        from mla_export.export import export_model
        from mla_export.export.progress import ExportProgress, TqdmProgress
        from mla_export.export.summary import summary_lines

        progress = ExportProgress() if args.quiet else TqdmProgress()
        with tempfile.TemporaryDirectory(prefix="mla-export-preset-") as preset_dir:
            model_dir = args.model_dir
            if args.preset:
                from mla_export.checkpoint.presets import PRESETS

                progress.phase(f"writing the {args.preset} preset checkpoint")
                model_dir = PRESETS[args.preset](preset_dir)
            result = export_model(model_dir, args.out_dir, fmt=args.fmt, portable=args.portable,
                                  block_size=args.block_size, kv_dtype=args.kv_dtype, weight_format=args.weight_format,
                                  group_size=args.group_size, ratio=args.ratio, all_layers=args.all_layers, overwrite=args.overwrite,
                                  progress=progress, moe_form=args.moe_form.replace("-", "_"),
                                  max_model_len=args.max_model_len, tensor_formats=args.tensor_formats or (),
                                  recipe=args.recipe)
        signals.armed = False  # done: from here a signal changes nothing
        progress.phase("done")
        progress.close()
        # The time the user waited: from the process's start (imports and the preset included).
        from mla_export.cli.main import waited_seconds

        for line in summary_lines(result, wall_seconds=waited_seconds()):
            print(line)
        sys.stdout.flush()
    except BaseException as e:  # the exporter removed its partial output before this runs
        return _failed(e, args, signals, progress)
    return 0
