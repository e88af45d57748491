"""`export_model`: a checkpoint directory in, an export directory out, all or nothing.

Everything is written into a temporary sibling of OUT_DIR and renamed into place at the end, so
a failure (bad config, missing or misshapen weights, conversion error, Ctrl-C) leaves OUT_DIR as
it was. The OpenVINO IR is converted from a custom-op ONNX graph: model.onnx itself when the IR's
MoE form is the grouped one (the default), else a separate `openvino_source.onnx` on the same
weights file; a graph that was only the IR's source is deleted after the conversion.
"""

from __future__ import annotations

import json
import resource
import secrets
import shutil
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

from ..version import __version__
from ..formats import kv_formats
from ..checkpoint.config import MLAModelConfig
from ..checkpoint.config_values import MAX_ROPE_TABLE_BYTES, rope_table_bytes
from ..formats.contract import CONTRACT_FILE, make_contract
from ..formats.export_files import describe_files
from .graph import WEIGHT_DTYPES, WeightFormat
from .quantize import CODE_FORMATS, INT_FORMATS, WEIGHT_FORMATS
from .model import LAYOUTS, ONNX_DATA, ONNX_FILES, build_onnx, plan_weights
from .mtp import MTP_FILES, build_mtp_onnx, mtp_layer
from .moe import MOE_FORMS, fused_form_problem
from .progress import IR_SHARE, ExportProgress
from .output_lock import OutputBusy, OutputLock, clean_stale, remove_owner, write_owner
from .signals import signals_held
from .recipes import RECIPES
from .tensor_formats import TensorFormatError, parse_tensor_formats
from .safety import commit
from .tokenizer_files import copy_tokenizer_files
from .weight_bounds import check_weights_hold
from ..checkpoint.reader import CheckpointReader

__all__ = ["ExportError", "ExportResult", "export_model", "FORMATS"]

FORMATS = ("openvino", "onnx", "both")
# Cache formats (mla_export/formats/kv_formats.py's registry) and the bytes per value of a per-head cache
# in each, for the summary's comparison (the latent rows' exact sizes come from kv_formats.row_bytes).
KV_DTYPES = {name: f.storage.itemsize for name, f in kv_formats.FORMATS.items()}


class ExportError(ValueError):
    """The export was asked for something impossible (arguments, output directory)."""


@dataclass
class ExportResult:
    out_dir: Path
    contract: dict
    seconds: float
    files: dict = field(default_factory=dict)  # file name -> bytes
    peak_rss_mb: float = 0.0
    cleaned: list = field(default_factory=list)  # stale partial exports of dead exporters removed first


def _checkpoint_dtype(cfg: MLAModelConfig) -> str:
    saved = str(cfg.raw.get("dtype") or cfg.raw.get("torch_dtype") or "float32")
    return {"bfloat16": "bf16", "float16": "f16"}.get(saved, "f32")


def _weight_format(requested: str, group_size: int, ratio: float, cfg: MLAModelConfig,
                   all_layers: bool = False, tensor_formats=(), recipe_rules=()) -> WeightFormat:
    """auto = the checkpoint's float dtype; int formats keep the non-matmul weights in it. The
    user's rules come before a recipe's (the first match decides); a recipe's rule may match
    nothing in a checkpoint (a model without shared experts), the user's may not."""
    try:
        overrides = parse_tensor_formats(tensor_formats) + parse_tensor_formats(list(recipe_rules), required=False)
    except TensorFormatError as e:
        raise ExportError(str(e)) from None
    if overrides and requested != "int4":
        raise ExportError(f"--tensor-format applies to --weight-format int4 only (got --weight-format {requested})")
    if overrides and ratio != 1.0:
        raise ExportError("--tensor-format and --ratio cannot be combined: --ratio's plan would choose among weights "
                          "the --tensor-format rules already fix; give the int8 weights by --tensor-format instead")
    if all_layers and requested != "int4":
        raise ExportError(f"--all-layers applies to --weight-format int4 only (got --weight-format {requested})")
    if isinstance(ratio, bool) or not isinstance(ratio, (int, float)) or not 0.0 <= ratio <= 1.0:
        raise ExportError(f"--ratio must be a number from 0 to 1 (the share of matmul weights in int4), got {ratio!r}")
    if ratio != 1.0 and requested != "int4":
        raise ExportError(f"--ratio applies to --weight-format int4 only (got --weight-format {requested})")
    if requested != "auto" and requested not in WEIGHT_FORMATS:
        raise ExportError(f"--weight-format must be auto, {', '.join(WEIGHT_FORMATS)}; got {requested!r}")
    if isinstance(group_size, bool) or not isinstance(group_size, int) or not (group_size == -1 or group_size >= 1):
        raise ExportError(f"--group-size must be a positive integer or -1 (one group per output channel), "
                          f"got {group_size!r}")
    if requested in CODE_FORMATS:
        return WeightFormat(requested, _checkpoint_dtype(cfg), group_size, ratio=float(ratio), all_layers=all_layers,
                            overrides=overrides)
    return WeightFormat(_checkpoint_dtype(cfg) if requested == "auto" else requested)


_BYTES_PER_PARAM = {"f32": 4.0, "f16": 2.0, "bf16": 2.0, "int8": 1.02, "int4": 0.62,  # int4: embedding/lm_head int8
                    "fp8": 1.04}


def _check_disk(out_dir: Path, reader: CheckpointReader, wformat: WeightFormat, portable: bool) -> int:
    """The bytes the export will write (one weights file: the IR shares the ONNX data), checked
    against the free space where OUT_DIR goes before anything is written."""
    need = int(reader.num_params() * _BYTES_PER_PARAM[wformat.fmt] * 1.03) + (64 << 20)
    if portable:
        need += 32 << 20  # the portable graph shares the weights file; its own proto is small
    free = shutil.disk_usage(out_dir.parent).free
    if need > free:
        gib = 1 << 30
        raise ExportError(f"the export needs about {need / gib:.1f} GiB on {out_dir.parent} but only {free / gib:.1f} GiB "
                          "is free (a smaller --weight-format such as int4 needs less)")
    return need


def _check_out_dir(out_dir: Path, overwrite: bool) -> None:
    if out_dir.exists() and not out_dir.is_dir():
        raise ExportError(f"{out_dir} exists and is not a directory")
    if out_dir.is_dir() and any(out_dir.iterdir()):
        if not overwrite:
            raise ExportError(f"{out_dir} is not empty; pass --overwrite to replace a previous export")
        if not (out_dir / CONTRACT_FILE).is_file():
            raise ExportError(f"{out_dir} is not empty and holds no {CONTRACT_FILE}: refusing to replace "
                              "a directory that is not an mla-export output")


def _positions(cfg: MLAModelConfig, max_model_len: int | None) -> MLAModelConfig:
    """The config with the positions the export holds: its RoPE tables have one row per position
    (and MlaStepCheck and the runtime refuse any beyond), so they are sized by what the export is
    asked to run (--max-model-len), not only by config.json's maximum, and refused above
    MAX_ROPE_TABLE_BYTES before anything is computed. The RoPE math (YaRN's factor) keeps the
    config's own max_position_embeddings."""
    if max_model_len is not None:
        if isinstance(max_model_len, bool) or not isinstance(max_model_len, int) or not \
                1 <= max_model_len <= cfg.max_position_embeddings:
            raise ExportError(f"--max-model-len must be an integer from 1 to the model's max_position_embeddings "
                              f"({cfg.max_position_embeddings}), got {max_model_len!r}")
        cfg = replace(cfg, max_position_embeddings=max_model_len)
    table = rope_table_bytes(cfg.max_position_embeddings, cfg.qk_rope_head_dim)
    if table > MAX_ROPE_TABLE_BYTES:
        raise ExportError(f"{cfg.max_position_embeddings} positions at qk_rope_head_dim {cfg.qk_rope_head_dim} need "
                          f"RoPE tables of {table / 2**30:.1f} GiB in the graph (at most "
                          f"{MAX_ROPE_TABLE_BYTES / 2**30:.0f} GiB are exported): pass a shorter --max-model-len "
                          f"(config.json's max_position_embeddings is {cfg.max_position_embeddings})")
    return cfg


def _with_recipe(recipe, weight_format: str, group_size, ratio) -> tuple[str, int, tuple]:
    """(weight format, group size, the recipe's rules) once the named recipe, if any, is applied."""
    if recipe is None:
        return weight_format, 128 if group_size is None else group_size, ()
    if recipe not in RECIPES:
        raise ExportError(f"--recipe must be one of {', '.join(RECIPES)}, got {recipe!r}")
    if weight_format not in ("auto", "int4"):
        raise ExportError(f"--recipe {recipe} is an int4 recipe: it cannot be combined with --weight-format "
                          f"{weight_format}")
    if ratio != 1.0:
        raise ExportError(f"--recipe {recipe} fixes which weights are int8: it cannot be combined with --ratio")
    r = RECIPES[recipe]
    return "int4", r.group_size if group_size is None else group_size, r.tensor_formats


def _check_rules_name_tensors(wformat: WeightFormat, reader: CheckpointReader) -> None:
    """Up front, from the checkpoint's tensor names: each --tensor-format pattern names some tensor."""
    names = list(reader.names())
    for rule in wformat.overrides:
        if rule.required and not any(rule.pattern.search(n) for n in names):
            example = next((n for n in names if n.endswith("down_proj.weight")), names[0] if names else "")
            raise ExportError(f"--tensor-format {rule.text!r}: the pattern matches no tensor of the checkpoint "
                              f"(names look like {example})")


def _check_rules_decided(wformat: WeightFormat, reader: CheckpointReader) -> None:
    """After the graph is built (before anything is converted or written in place): each rule
    decided the format of some stored weight; one that matched only weights kept float did nothing."""
    for rule in wformat.overrides:
        if rule.required and not wformat.matched.get(rule.text):
            hits = [n for n in reader.names() if rule.pattern.search(n)][:3]
            raise ExportError(f"--tensor-format {rule.text!r}: the pattern matches only weights kept float in every "
                              f"format ({', '.join(hits)}: norms, routers and kv_b_proj, whose absorbed halves the "
                              "attention op reads, take no int format), or a tied lm_head (the embedding table's "
                              "format serves)")


def _moe_form(requested: str, cfg, wformat: WeightFormat) -> str:
    """The MoE form written: auto picks fused where the op can hold the experts, else grouped."""
    has_moe = any(cfg.is_moe_layer(i) for i in range(cfg.num_layers))
    problem = fused_form_problem(cfg, wformat) if has_moe else "no MoE layers"
    if requested == "auto":
        return "fused" if problem is None else "grouped"
    if requested == "fused" and problem is not None and has_moe:
        raise ExportError(f"--moe-form fused: {problem}; use --moe-form grouped (or auto)")
    return requested


def export_model(model_dir, out_dir, *, fmt: str = "openvino", portable: bool = False, block_size: int = 16,
                 kv_dtype: str = "f16", weight_format: str = "auto", group_size: int | None = None, ratio: float = 1.0,
                 overwrite: bool = False, progress: ExportProgress | None = None,
                 weight_dtype: str | None = None, moe_form: str = "auto", all_layers: bool = False,
                 max_model_len: int | None = None, tensor_formats=(), recipe: str | None = None) -> ExportResult:
    """weight_format: auto | f32 | f16 | bf16 | int8 | int4 | fp8 (weight_dtype: its older name).
    moe_form: auto | fused | grouped | gather_matmul (see moe.py). auto = fused (our MlaMoeExperts op,
    IR and model.onnx) for int8/int4 weights it can hold, else grouped. gather_matmul applies to the
    IR only; the portable ONNX is always grouped. all_layers (int4 only): the embedding table and
    lm_head in int4 too (optimum-cli's --all-layers), else int8. max_model_len: the positions the
    export holds (RoPE table rows; the contract's max_position_embeddings), default config.json's.
    tensor_formats (int4 only): PATTERN=FORMAT rules, int8 or int4 for the weights whose checkpoint
    names PATTERN matches (tensor_formats.py); the contract records which weights each decided.
    recipe: a named int4 recipe (recipes.py): its group size unless group_size is given (default
    128 without a recipe), its rules after tensor_formats' (the first matching rule decides).
    `progress` (an `ExportProgress`, e.g. `TqdmProgress()`) is told every phase."""
    start = time.time()
    progress = progress or ExportProgress()
    model_dir, out_dir = Path(model_dir), Path(out_dir)
    if out_dir.is_symlink():  # --overwrite through a link replaces the export it points at
        out_dir = out_dir.resolve()
    if fmt not in FORMATS:
        raise ExportError(f"--format must be one of {', '.join(FORMATS)}, got {fmt!r}")
    if kv_dtype not in KV_DTYPES:
        raise ExportError(f"--kv-dtype must be one of {', '.join(KV_DTYPES)}, got {kv_dtype!r}")
    if portable and kv_formats.FORMATS[kv_dtype].quantised:
        raise ExportError(f"--portable cannot hold an {kv_dtype} cache (standard ONNX has no bit-cast to read the f32 "
                          f"scale stored in each byte row); use --kv-dtype {', '.join(kv_formats.FLOAT_FORMATS)} with --portable")
    if moe_form not in MOE_FORMS + ("auto",):
        raise ExportError(f"--moe-form must be one of auto, {', '.join(f.replace('_', '-') for f in MOE_FORMS)}, "
                          f"got {moe_form!r}")
    if not isinstance(block_size, int) or block_size < 1:
        raise ExportError(f"--block-size must be a positive integer, got {block_size!r}")
    if not model_dir.is_dir():
        raise ExportError(f"{model_dir}: no such checkpoint directory")
    if not out_dir.name or out_dir.name in (".", ".."):
        raise ExportError(f"-o {out_dir}: name the export directory itself")
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    # One exporter per output path, from here to the end (a second one fails at once instead of
    # replacing this one's output); under the lock, partials left by killed exporters go first.
    lock = OutputLock(out_dir)
    try:
        with signals_held():  # taken and recorded whole, or not at all
            lock.acquire()
    except OutputBusy as e:
        raise ExportError(str(e)) from None
    try:
        cleaned = clean_stale(out_dir)
        for line in cleaned:
            progress.note(line)
        result = _export_locked(model_dir, out_dir, start=start, fmt=fmt, portable=portable, block_size=block_size,
                                kv_dtype=kv_dtype, weight_format=weight_format, group_size=group_size, ratio=ratio,
                                overwrite=overwrite, progress=progress, weight_dtype=weight_dtype, moe_form=moe_form,
                                all_layers=all_layers, max_model_len=max_model_len, tensor_formats=tensor_formats,
                                recipe=recipe)
    finally:
        with signals_held():
            lock.release()
    result.cleaned = cleaned
    return result


def _partial_dir(out_dir: Path) -> Path:
    """A new `.NAME.partial-*` directory beside out_dir, its owner recorded before it exists (a
    SIGKILL at any moment leaves nothing the next export cannot judge: output_lock.py)."""
    while True:
        tmp = out_dir.parent / f".{out_dir.name}.partial-{secrets.token_hex(4)}"
        write_owner(tmp)
        try:
            tmp.mkdir()  # the umask's mode: the export is an ordinary directory
            return tmp
        except FileExistsError:
            continue


def _export_locked(model_dir: Path, out_dir: Path, *, start: float, fmt, portable, block_size, kv_dtype,
                   weight_format, group_size, ratio, overwrite, progress, weight_dtype, moe_form,
                   all_layers, max_model_len, tensor_formats, recipe) -> ExportResult:
    _check_out_dir(out_dir, overwrite)
    if weight_dtype is not None:
        weight_format = weight_dtype
    weight_format, group_size, recipe_rules = _with_recipe(recipe, weight_format, group_size, ratio)
    cfg = _positions(MLAModelConfig.from_dir(model_dir), max_model_len)
    if portable and cfg.sparse:
        raise ExportError(f"--portable cannot hold {cfg.model_type}'s DeepSeek Sparse Attention (the indexer's top-k "
                          "over a paged key cache has no standard-ONNX form here); export it without --portable: "
                          "model.onnx runs in onnxruntime with the mla-export ops")
    wformat = _weight_format(weight_format, group_size, ratio, cfg, all_layers, tensor_formats, recipe_rules)
    moe_form = _moe_form(moe_form, cfg, wformat)
    reader = CheckpointReader(model_dir, fp8_block=cfg.fp8_block, prefixes=cfg.weight_prefixes)
    # A multimodal checkpoint's vision tower and projector, not exported (text only): the summary says so
    left_out = reader.left_out() if cfg.weight_prefixes else None
    check_weights_hold(cfg, reader, LAYOUTS[cfg.block["layout"]][1])  # before any loop over the config's layers
    _check_rules_name_tensors(wformat, reader)
    random_weights = reader.random_weights()  # recorded so that generate can say its text is noise
    # The checkpoint's MTP layer, exported as a speculative-decoding draft beside the model (mtp.py)
    mtp_index, mtp_note = mtp_layer(cfg, reader)
    if mtp_note:
        progress.note(mtp_note)
    # Phase weights in checkpoint bytes (see progress.py): layers, then head + save, then the IR.
    layer_bytes = [reader.nbytes(f"model.layers.{i}.") for i in range(cfg.num_layers)]
    rest_bytes = max(reader.nbytes() - sum(layer_bytes), 0)  # embedding, final norm, lm_head
    ir_bytes = IR_SHARE * (sum(layer_bytes) + rest_bytes) if fmt in ("openvino", "both") else 0
    progress.plan(sum(layer_bytes) + rest_bytes + ir_bytes)
    progress.phase(f"layer 1/{cfg.num_layers}")

    def layer_done(done: int, total: int) -> None:
        progress.advance(layer_bytes[done - 1], f"layer {min(done + 1, total)}/{total}" if done < total
                         else "lm_head, writing the ONNX graph")

    _check_disk(out_dir, reader, wformat, portable)
    tmp = None
    try:
        # Signals held while the directory is made and named: an interrupt in between would leave
        # it behind (the handlers run as soon as they are released, inside this try).
        with signals_held():
            tmp = _partial_dir(out_dir)
        want_ir, want_onnx = fmt in ("openvino", "both"), fmt in ("onnx", "both")
        # The IR's source graph: model.onnx itself, or its own graph where the IR differs from it:
        # the gather_matmul MoE form (only OpenVINO runs it), and lm_head next to the fused MoE op,
        # which model.onnx holds as our MlaQLinear (onnxruntime would fold a dequantised Gemm to an
        # f32 copy) and the IR as the plugin's compressed MatMul (as fast or faster here, measured:
        # docs/WEIGHTS.md). The fused op runs in both runtimes; portable is grouped.
        ir_source = "openvino" if want_ir and moe_form in ("gather_matmul", "fused") else "custom"
        variants = (["custom"] if want_onnx or ir_source == "custom" else []) + \
            (["openvino"] if ir_source == "openvino" else []) + (["portable"] if portable else [])
        moe_forms = {v: "grouped" if v == "portable" or (v == "custom" and moe_form == "gather_matmul") else moe_form
                     for v in variants}
        if wformat.ratio < 1.0:  # mixed int4/int8: one reading pass to rank the weights first
            progress.phase("ranking the weights for int4/int8")
            plan_weights(cfg, reader, wformat, moe_form=moe_forms[ir_source])
        try:
            onnx_paths = build_onnx(cfg, reader, tmp, variants=variants, block_size=block_size, kv_dtype=kv_dtype,
                                    weight_format=wformat, moe_forms=moe_forms, progress=layer_done,
                                    hidden_output=mtp_index is not None)
            mtp_paths = {}
            if mtp_index is not None:
                progress.phase("the MTP draft graph")
                mtp_paths = build_mtp_onnx(cfg, reader, tmp, mtp_index, variants=variants, block_size=block_size,
                                           kv_dtype=kv_dtype, weight_format=replace(wformat, stats={}),
                                           moe_forms=moe_forms)
        except TensorFormatError as e:
            raise ExportError(str(e)) from None
        _check_rules_decided(wformat, reader)
        reader.close()
        progress.advance(rest_bytes)
        files = dict(openvino_xml=None, openvino_bin=None, onnx=None, onnx_portable=None, onnx_data=None)
        if fmt in ("onnx", "both"):
            files.update(onnx=ONNX_FILES["custom"], onnx_data=ONNX_DATA)
        if portable:
            files.update(onnx_portable=ONNX_FILES["portable"], onnx_data=ONNX_DATA)
        if fmt in ("openvino", "both"):
            from .openvino_ir import IR_BIN, IR_XML, convert_to_ir

            progress.phase("converting to OpenVINO IR")
            # The IR's .bin is the ONNX data file itself (renamed, or hard-linked when ONNX is kept).
            ir_model = convert_to_ir(onnx_paths[ir_source], tmp, tmp / ONNX_DATA,
                                     keep_data_file=files["onnx_data"] is not None)
            progress.advance(ir_bytes)
            files.update(openvino_xml=IR_XML, openvino_bin=IR_BIN)
        mtp_files = None
        if mtp_paths:
            mtp_files = dict(openvino_xml=None, openvino_bin=None, onnx=None, onnx_data=None)
            if want_onnx:
                mtp_files.update(onnx=MTP_FILES["onnx"], onnx_data=MTP_FILES["onnx_data"])
            if want_ir:
                convert_to_ir(mtp_paths[ir_source], tmp, tmp / MTP_FILES["onnx_data"], keep_data_file=want_onnx,
                              xml_name=MTP_FILES["openvino_xml"], bin_name=MTP_FILES["openvino_bin"])
                mtp_files.update(openvino_xml=MTP_FILES["openvino_xml"], openvino_bin=MTP_FILES["openvino_bin"])
        for paths in (onnx_paths, mtp_paths):
            for variant in ("custom", "openvino"):
                if variant in paths and not (variant == "custom" and want_onnx):
                    paths[variant].unlink()  # only the IR's source
        if files["onnx_data"] is None and (tmp / ONNX_DATA).exists():
            (tmp / ONNX_DATA).unlink()
        progress.phase("tokenizer, contract, checks")
        tokenizer, chat_template = copy_tokenizer_files(model_dir, tmp)
        tied = [f for f in files.values() if f] + ([tokenizer["file"]] if tokenizer else []) + \
            [f for f in (mtp_files or {}).values() if f]
        contract = make_contract(
            model=cfg.facts(), block_size=block_size, kv_dtype=kv_dtype, files=files, tokenizer=tokenizer,
            chat_template=chat_template,
            export=dict(weight_dtype=wformat.float_dtype, weight_format=wformat.fmt,
                        weight_params=wformat.stats.get("params", {}),
                        int4_group_sizes=sorted(wformat.stats.get("int4_group_sizes", []), reverse=True),
                        int4_ratio=wformat.ratio if wformat.fmt == "int4" else None,
                        int4_all_layers=wformat.all_layers if wformat.fmt == "int4" else None,
                        # every weight stored in another format than the int4 default rule's (--ratio's
                        # plan, --tensor-format), and what each rule decided: bytes_per_token.py reads them
                        int4_weight_formats=dict(sorted(wformat.stats.get("formats", {}).items()))
                        if wformat.fmt == "int4" else None,
                        tensor_formats=[dict(rule=r.text, weights=sorted(wformat.matched.get(r.text, ())))
                                        for r in wformat.overrides],
                        recipe=recipe, moe_form=moe_form, left_out=left_out, random_weights=random_weights,
                        exporter_version=__version__, source=str(model_dir.resolve()),
                        seconds=round(time.time() - start, 3), files=describe_files(tmp, tied)),
            mtp=None if mtp_files is None else dict(layer_index=mtp_index, files=mtp_files))
        (tmp / CONTRACT_FILE).write_text(json.dumps(contract, indent=2) + "\n")
        if files["openvino_xml"]:
            from ..formats.contract import Contract

            Contract(contract, tmp).validate_openvino_model(ir_model)  # the IR's real I/O, checked once here
        sizes = {p.name: p.stat().st_size for p in sorted(tmp.iterdir()) if p.is_file()}
        _check_out_dir(out_dir, overwrite)  # again: something other than an exporter may have written there
        commit(tmp, out_dir)  # never a moment with neither the old nor the new export
    except BaseException:
        if tmp is not None:
            with signals_held():  # a signal now must not leave half a partial behind
                shutil.rmtree(tmp, ignore_errors=True)
                remove_owner(tmp)
        raise
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return ExportResult(out_dir, contract, time.time() - start, sizes, peak_mb)
