"""The graph contract: `mla_graph.json` in every export directory (schema version 1).

The exporter writes it; the runtime loads and checks it before it compiles anything:

    from mla_export.formats.contract import load_contract, ContractError
    contract = load_contract(out_dir)            # parse + validate, or ContractError with the reason
    contract.graph_path("openvino_xml")          # Path of a graph file, or None when not exported
    contract.validate_openvino_model(ov_model)   # the graph's real inputs/outputs vs the contract
    contract.validate_model_io(inputs, outputs)  # the same from (name, shape, dtype) triples
    contract.model["num_layers"], contract.cache["block_size"], contract.cache["dtype"], ...
    contract.tokenizer_path()                    # Path of tokenizer.json, or None

The schema itself is `graphs/mla_graph.schema.json` (JSON Schema; this module validates the
subset of keywords it uses, so the runtime needs no jsonschema package), followed by the checks a
schema cannot state (input list consistent with num_layers and the cache geometry, files exist).
`graph_io()` is the one definition of the graphs' inputs and outputs: the exporter declares its
graph inputs from it and the validator compares against it.

Caches (`cache.dtype`, the export's --kv-dtype): the formats of mla_export/formats/kv_formats.py's
registry (FORMATS), from which every rule here is derived. f32 rows are declared `kv_cache.<i>: f32
[NB, BS, W]`; every other format as raw bytes `u8 [NB, BS, row bytes]` in the custom-op graphs
(the CPU plugin would copy a bf16/f16 input, see docs/ARCHITECTURE.md): 16-bit rows 2 * W bytes,
quantised rows r + 4 * G + 2 * dr bytes = [r codes | G f32 group scales | dr bf16 k_pe], G the
format's scale groups (`cache.row_layout` says it in words). The portable ONNX graph declares
caches in their logical dtype `[NB, BS, W]` (float formats only: standard ONNX has no bit-cast
to read an f32 scale out of a byte row) and returns the updated ones as `kv_cache_out.<i>`.
Besides the standard library only that registry (numpy, ml_dtypes) is imported here.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from pathlib import Path

from .json_file import show
from .export_paths import inside
from .json_file import read_json
from .kv_formats import FLOAT_FORMATS, FORMATS, KV_DTYPES
from .contract_error import ContractError

__all__ = ["CONTRACT_FILE", "CONTRACT_VERSION", "Contract", "TensorSpec", "graph_io", "cache_layout",
           "mtp_graph_io", "MTP_FILE_KEYS",
           "index_cache_layout",
           "CACHE_DTYPES",
           "load_contract", "read_contract", "validate_contract", "schema", "normalize_dtype"]

CONTRACT_FILE = "mla_graph.json"
CONTRACT_VERSION = 1
# The schema lives in the repository's graphs/; a wheel may ship it inside the package instead.
_SCHEMA_CANDIDATES = (Path(__file__).resolve().parent.parent / "graphs" / "mla_graph.schema.json",
                      Path(__file__).resolve().parent.parent.parent / "graphs" / "mla_graph.schema.json")
SCHEMA_PATH = next((p for p in _SCHEMA_CANDIDATES if p.is_file()), _SCHEMA_CANDIDATES[-1])


@dataclass(frozen=True)
class TensorSpec:
    name: str
    shape: tuple  # ints are static dims, strings name dynamic dims
    dtype: str  # f32, bf16, f16, i32, i64, u8
    meaning: str = ""

    def to_json(self) -> dict:
        return dict(name=self.name, shape=list(self.shape), dtype=self.dtype, meaning=self.meaning)


_METADATA = [
    ("input_ids", ("T",), "new tokens of all sequences of the step, packed"),
    ("positions", ("T",), "position of each new token in its sequence (RoPE)"),
    ("slot_mapping", ("T",), "cache slot of each new token: block_id * block_size + offset; < 0 = do not write"),
    ("query_start_loc", ("B+1",), "prefix sums of the query lengths: sequence b owns rows [qsl[b], qsl[b+1])"),
    ("seq_lens", ("B",), "tokens of each sequence in the cache after this step (new ones included)"),
    ("block_tables", ("B", "M"), "cache block ids of each sequence, in order; padding past its blocks"),
    ("logits_indices", ("L",), "rows of the packed T axis whose logits are returned, strictly increasing, "
     "at least one of each sequence's new tokens (its last: the one it samples from; every new "
     "token of a sequence whose prompt logprobs are wanted)"),
]


CACHE_DTYPES = KV_DTYPES
PORTABLE_CACHE_DTYPES = FLOAT_FORMATS


def cache_layout(kv_dtype: str, row_width: int, kv_lora_rank: int | None = None) -> tuple[str, int, str]:
    """(graph dtype, graph row width, row layout in words) of a cache format in the custom-op
    graphs. kv_lora_rank (r) is needed for quantised formats. (kv_formats.row_bytes is the same rule.)"""
    f = FORMATS.get(kv_dtype) if isinstance(kv_dtype, str) else None
    if f is None:
        raise ContractError(f"cache dtype must be one of {', '.join(CACHE_DTYPES)}, got {kv_dtype!r}")
    if not f.quantised:
        if f.graph_dtype == "f32":
            return "f32", row_width, f"{kv_dtype}[{row_width}]"
        return f.graph_dtype, f.row_bytes(row_width, 0), f"{kv_dtype}[{row_width}] as bytes"
    if kv_lora_rank is None or not 0 < kv_lora_rank <= row_width:
        raise ContractError(f"an {kv_dtype} cache needs kv_lora_rank in [1, {row_width}], got {kv_lora_rank!r}")
    dr = row_width - kv_lora_rank  # 0: an indexer-key row, all codes
    groups = f.groups
    if kv_lora_rank % groups:
        raise ContractError(f"an {kv_dtype} cache quantises kv_c in {groups} equal groups: kv_lora_rank "
                            f"{kv_lora_rank} is not a multiple of {groups}")
    kpe = f" | bf16[{dr}] k_pe" if dr else ""
    size = f.row_bytes(kv_lora_rank, dr)
    if groups == 1:
        return "u8", size, f"{f.code}[{kv_lora_rank}] codes | f32 scale{kpe} (value = code * scale)"
    return ("u8", size,
            f"{f.code}[{kv_lora_rank}] codes | f32[{groups}] scales, one per {kv_lora_rank // groups} codes{kpe} "
            f"(value = code * its group's scale)")


def index_cache_layout(kv_dtype: str, index_dim: int) -> tuple[str, int, str]:
    """cache_layout of an indexer-key cache: rows of D values, every one of them quantised for
    quantised formats (no k_pe part)."""
    return cache_layout(kv_dtype, index_dim, index_dim)


def graph_io(num_layers: int, block_size: int, row_width: int, kv_dtype: str,
             variant: str = "custom", kv_lora_rank: int | None = None,
             index: tuple[int, int] | None = None, hidden: int | None = None) -> tuple[list[TensorSpec], list[TensorSpec]]:
    """Inputs and outputs of a graph: variant "custom" (openvino / onnx with the MLA ops) or
    "portable" (standard ONNX ops, caches returned). kv_lora_rank is needed for quantised caches.
    index: (indexer layers, D) of a sparse-attention model: its `index_cache.<j>` inputs follow
    the latent caches (custom graphs only). hidden: hidden_size of an export with an MTP draft
    (the main graph then also returns every new token's last hidden state, which the draft reads)."""
    graph_dtype, graph_width, layout = cache_layout(kv_dtype, row_width, kv_lora_rank)
    if variant not in ("custom", "portable"):
        raise ContractError(f"graph variant must be custom or portable, got {variant!r}")
    if variant == "portable" and index:
        raise ContractError("the portable ONNX graph has no sparse-attention ops (the indexer's top-k over a paged "
                            "key cache); export DeepSeek Sparse Attention models without --portable")
    if variant == "portable" and kv_dtype not in PORTABLE_CACHE_DTYPES:
        raise ContractError(f"the portable ONNX graph cannot hold an {kv_dtype} cache (standard ONNX has no bit-cast "
                            f"to read the f32 scale stored in each byte row); use {', '.join(PORTABLE_CACHE_DTYPES)}")
    inputs = [TensorSpec(n, s, "i32", m) for n, s, m in _METADATA]
    if variant == "custom" and graph_dtype == "u8":
        cache_dtype, width = "u8", graph_width
        meaning = "latent cache of layer {i}: rows " + layout + " ([kv_c | k_pe]) as raw bytes, written in place"
    else:
        cache_dtype, width, meaning = kv_dtype, row_width, "latent cache of layer {i}: rows [kv_c | k_pe]"
        if variant == "custom":
            meaning += ", written in place"
    for i in range(num_layers):
        inputs.append(TensorSpec(f"kv_cache.{i}", ("NB", block_size, width), cache_dtype, meaning.format(i=i)))
    if index:
        n_index, dim = index
        i_dtype, i_width, i_layout = index_cache_layout(kv_dtype, dim)
        for j in range(n_index):
            inputs.append(TensorSpec(f"index_cache.{j}", ("NB", block_size, i_width), i_dtype,
                                     f"indexer keys of indexer layer {j}: rows {i_layout}"
                                     f"{' as raw bytes' if i_dtype == 'u8' else ''}, written in place"))
    outputs = [TensorSpec("logits", ("L", "vocab"), "f32", "next-token logits of the rows logits_indices picks")]
    if hidden:
        outputs.append(TensorSpec("hidden_states", ("T", hidden), "f32",
                                  "every new token's hidden state after the last decoder layer, before the final "
                                  "norm (the MTP draft's input)"))
    if variant == "portable":
        for i in range(num_layers):
            outputs.append(TensorSpec(f"kv_cache_out.{i}", ("NB", block_size, row_width), kv_dtype,
                                      f"layer {i}'s cache after this step's writes"))
    return inputs, outputs


def mtp_graph_io(block_size: int, row_width: int, kv_dtype: str, kv_lora_rank: int | None, hidden: int,
                 layer_index: int, index_dim: int | None = None) -> tuple[list[TensorSpec], list[TensorSpec]]:
    """Inputs and outputs of the MTP draft graph (custom ops only): the metadata of a step, the
    main model's hidden state of each new token's previous position, and the draft layer's own
    cache, `kv_cache.<layer_index>` (its rows at the main cache's slots). Row t of a step is the
    MTP layer at position positions[t]: input_ids[t] is the token after that position.
    index_dim: D of a sparse-attention model (DeepSeek-V3.2, GLM-5), whose MTP layer runs its own
    lightning indexer: its key cache `index_cache.<layer_index>` follows (rows at the same slots)."""
    inputs, _ = graph_io(1, block_size, row_width, kv_dtype, "custom", kv_lora_rank,
                         (1, index_dim) if index_dim else None)
    metadata, cache = inputs[:len(_METADATA)], inputs[len(_METADATA)]
    caches = [TensorSpec(f"kv_cache.{layer_index}", cache.shape, cache.dtype,
                         cache.meaning.replace("layer 0", f"the MTP layer ({layer_index})"))]
    if index_dim:
        index = inputs[len(_METADATA) + 1]
        caches.append(TensorSpec(f"index_cache.{layer_index}", index.shape, index.dtype,
                                 index.meaning.replace("indexer layer 0", f"the MTP layer ({layer_index})")))
    hidden_in = TensorSpec("hidden_states", ("T", hidden), "f32",
                           "the main model's last hidden state (before the final norm) at each row's position, or "
                           "the draft's own mtp_hidden_states for a further draft step")
    outputs = [TensorSpec("logits", ("L", "vocab"), "f32", "draft logits (of the token two positions on) of the rows "
                          "logits_indices picks"),
               TensorSpec("mtp_hidden_states", ("L", hidden), "f32",
                          "the MTP layer's output at those rows, before shared_head.norm (the next draft step's input)")]
    return [*metadata, hidden_in, *caches], outputs


MTP_FILE_KEYS = ("openvino_xml", "openvino_bin", "onnx", "onnx_data")


# ------------------------------------------------------------------------------- validation
def schema() -> dict:
    try:
        return json.loads(SCHEMA_PATH.read_text())
    except OSError as e:
        raise ContractError(f"the contract schema {SCHEMA_PATH} is not readable: {e}") from e


_JSON_TYPES = {"object": dict, "array": list, "string": str, "boolean": bool, "null": type(None)}


def _type_ok(value, type_name: str) -> bool:
    if type_name == "integer":
        return isinstance(value, int) and not isinstance(value, bool)
    if type_name == "number":  # JSON has no NaN or Infinity (Python's parser takes them)
        if isinstance(value, float):
            return math.isfinite(value)
        return isinstance(value, int) and not isinstance(value, bool)
    return isinstance(value, _JSON_TYPES[type_name])


def _same(value, wanted) -> bool:
    """JSON equality for a const / enum: 1 is not true, 1.0 is not the string "1"."""
    return type(value) is type(wanted) and value == wanted


def _check(value, sch: dict, root: dict, where: str) -> None:
    """The JSON Schema keywords graphs/mla_graph.schema.json uses."""
    if "$ref" in sch:
        ref = sch["$ref"]
        if not ref.startswith("#/$defs/"):
            raise ContractError(f"schema: unsupported $ref {ref}")
        sch = root["$defs"][ref.split("/")[-1]]
    if "type" in sch:
        types = sch["type"] if isinstance(sch["type"], list) else [sch["type"]]
        if not any(_type_ok(value, t) for t in types):
            raise ContractError(f"{where}: expected {' or '.join(types)}, got {show(value)}")
    if "const" in sch and not _same(value, sch["const"]):
        raise ContractError(f"{where}: must be {json.dumps(sch['const'])}, got {show(value)}")
    if "enum" in sch and not any(_same(value, e) for e in sch["enum"]):
        raise ContractError(f"{where}: must be one of {sch['enum']}, got {show(value)}")
    if "minimum" in sch and _type_ok(value, "number") and value < sch["minimum"]:
        raise ContractError(f"{where}: must be >= {sch['minimum']}, got {show(value)}")
    if "maximum" in sch and _type_ok(value, "number") and value > sch["maximum"]:
        raise ContractError(f"{where}: must be <= {sch['maximum']}, got {show(value)}")
    if "minLength" in sch and isinstance(value, str) and len(value) < sch["minLength"]:
        raise ContractError(f"{where}: must not be empty")
    if isinstance(value, dict):
        for key in sch.get("required", []):
            if key not in value:
                raise ContractError(f"{where}: missing key {key!r}")
        props = sch.get("properties", {})
        for key, item in value.items():
            if key in props:
                _check(item, props[key], root, f"{where}.{key}")
            elif sch.get("additionalProperties") is False:
                raise ContractError(f"{where}: unknown key {key!r}")
            elif isinstance(sch.get("additionalProperties"), dict):
                _check(item, sch["additionalProperties"], root, f"{where}.{key}")
    if isinstance(value, list):
        if len(value) < sch.get("minItems", 0):
            raise ContractError(f"{where}: needs at least {sch['minItems']} items, has {len(value)}")
        if len(value) > sch.get("maxItems", len(value)):
            raise ContractError(f"{where}: holds at most {sch['maxItems']} items, has {len(value)}")
        if "items" in sch:
            for i, item in enumerate(value):
                _check(item, sch["items"], root, f"{where}[{i}]")


# Exports written before logits_indices could return more rows than sequences named its dim (and
# the logits' rows) "B"; the graphs are the same, only the symbol changed: they load as they are.
_OLD_DIM_NAMES = {("logits_indices", ("B",)): ["L"], ("logits", ("B", "vocab")): ["L", "vocab"]}


def _renamed_dims(name: str, shape: list) -> list:
    return _OLD_DIM_NAMES.get((name, tuple(shape)), shape)


class _key:
    """Re-raises a helper's ContractError (cache_layout, graph_io, check_files) as one that names
    the contract key whose value it was checking."""

    def __init__(self, key: str):
        self.key = key

    def __enter__(self):
        return self

    def __exit__(self, kind, e, tb):
        if isinstance(e, ContractError) and not str(e).startswith("mla_graph.json"):
            raise ContractError(f"mla_graph.json: {self.key}: {e}") from None
        return False


def validate_contract(raw: dict, out_dir: str | Path | None = None, verify: str | None = None) -> None:
    """Schema check, then consistency: I/O lists as graph_io() defines them, files present and,
    with out_dir, each one's size and digest as recorded (verify: sampled | full | none, default
    $MLA_EXPORT_VERIFY or sampled; see export_files.py)."""
    root = schema()
    _check(raw, root, root, "mla_graph.json")
    cache, model = raw["cache"], raw["model"]
    vocab = model["vocab_size"]
    for key, ids in (("bos_token_id", [] if model["bos_token_id"] is None else [model["bos_token_id"]]),
                     ("eos_token_ids", model["eos_token_ids"])):
        bad = next((i for i in ids if not 0 <= i < vocab), None)
        if bad is not None:  # an id the graph can never produce: generation would never stop at it
            raise ContractError(f"mla_graph.json: model.{key} holds {show(bad)}, outside the vocabulary "
                                f"(model.vocab_size {vocab})")
    if cache["row_width"] != model["kv_lora_rank"] + model["qk_rope_head_dim"]:
        raise ContractError(f"mla_graph.json: cache.row_width {cache['row_width']} != kv_lora_rank + "
                            f"qk_rope_head_dim ({model['kv_lora_rank']} + {model['qk_rope_head_dim']})")
    if cache["num_layers"] != model["num_layers"]:
        raise ContractError("mla_graph.json: cache.num_layers differs from model.num_layers")
    with _key("cache.dtype"):
        graph_dtype, graph_width, layout = cache_layout(cache["dtype"], cache["row_width"], model["kv_lora_rank"])
    if cache.get("row_layout", layout) != layout:
        raise ContractError(f"mla_graph.json: cache.row_layout {cache['row_layout']!r}, a {cache['dtype']} cache "
                            f"has {layout!r}")
    if (cache["graph_dtype"], cache["graph_row_width"]) != (graph_dtype, graph_width):
        raise ContractError(f"mla_graph.json: a {cache['dtype']} cache is declared {graph_dtype} [.., {graph_width}] "
                            f"in the graphs, the file says {cache['graph_dtype']} [.., {cache['graph_row_width']}]")
    index = cache.get("index")
    if index:
        sparse = model.get("sparse_attention")
        if not sparse:
            raise ContractError("mla_graph.json: cache.index is given but model.sparse_attention is not")
        if index["row_width"] != sparse["index_head_dim"]:
            raise ContractError(f"mla_graph.json: cache.index.row_width {index['row_width']} != "
                                f"model.sparse_attention.index_head_dim {sparse['index_head_dim']}")
        if index["num_layers"] != sparse["indexer_types"].count("full"):
            raise ContractError(f"mla_graph.json: cache.index.num_layers {index['num_layers']} != the "
                                f"{sparse['indexer_types'].count('full')} 'full' layers of model.sparse_attention")
        with _key("cache.index"):
            i_dtype, i_width, i_layout = index_cache_layout(cache["dtype"], index["row_width"])
        if (index["graph_dtype"], index["graph_row_width"]) != (i_dtype, i_width):
            raise ContractError(f"mla_graph.json: a {cache['dtype']} indexer cache is declared {i_dtype} [.., {i_width}] "
                                f"in the graphs, the file says {index['graph_dtype']} [.., {index['graph_row_width']}]")
        if len(sparse["indexer_types"]) != model["num_layers"]:
            raise ContractError(f"mla_graph.json: model.sparse_attention.indexer_types has "
                                f"{len(sparse['indexer_types'])} entries, model.num_layers is {model['num_layers']}")
    elif model.get("sparse_attention"):
        raise ContractError("mla_graph.json: model.sparse_attention is given but cache.index is not")
    index_io = (index["num_layers"], index["row_width"]) if index else None
    mtp = raw.get("mtp")
    hidden = None
    if mtp is not None:
        hidden = model["hidden_size"]
        if mtp["hidden_size"] != hidden:
            raise ContractError(f"mla_graph.json: mtp.hidden_size {mtp['hidden_size']} != model.hidden_size {hidden}")
        with _key("mtp"):
            want_in, want_out = mtp_graph_io(cache["block_size"], cache["row_width"], cache["dtype"],
                                             model["kv_lora_rank"], hidden, mtp["layer_index"],
                                             index["row_width"] if index else None)
        for label, got, want in (("inputs", mtp["inputs"], want_in), ("outputs", mtp["outputs"], want_out)):
            got_key = [(t["name"], list(t["shape"]), t["dtype"]) for t in got]
            want_key = [(t.name, list(t.shape), t.dtype) for t in want]
            if got_key != want_key:
                raise ContractError(f"mla_graph.json: mtp.{label} differ from contract version {CONTRACT_VERSION}: "
                                    f"{_first_difference(got_key, want_key)}")
        if not (mtp["files"]["openvino_xml"] or mtp["files"]["onnx"]):
            raise ContractError("mla_graph.json: mtp.files: no draft graph file is listed (openvino_xml and onnx are null)")
    variants = [("custom", raw["inputs"], raw["outputs"])]
    if raw["portable"] is not None:
        variants.append(("portable", raw["portable"]["inputs"], raw["portable"]["outputs"]))
    for variant, inputs, outputs in variants:
        with _key(variant if variant == "portable" else "cache"):
            want_in, want_out = graph_io(model["num_layers"], cache["block_size"], cache["row_width"], cache["dtype"],
                                         variant, model["kv_lora_rank"], index_io, hidden)
        for label, got, want in (("inputs", inputs, want_in), ("outputs", outputs, want_out)):
            got_key = [(t["name"], _renamed_dims(t["name"], list(t["shape"])), t["dtype"]) for t in got]
            want_key = [(t.name, list(t.shape), t.dtype) for t in want]
            if got_key != want_key:
                key = f"portable.{label}" if variant == "portable" else label
                raise ContractError(f"mla_graph.json: {key}: {variant} {label} differ from contract version "
                                    f"{CONTRACT_VERSION}: {_first_difference(got_key, want_key)}")
    files = raw["files"]
    if not (files["openvino_xml"] or files["onnx"] or files["onnx_portable"]):
        raise ContractError("mla_graph.json: files: no graph file is listed (openvino_xml, onnx and onnx_portable "
                            "are all null)")
    if (files["onnx_portable"] is None) != (raw["portable"] is None):
        raise ContractError("mla_graph.json: portable, files.onnx_portable: 'portable' I/O must be given exactly "
                            "when onnx_portable is")
    if out_dir is not None:
        listed = [f for f in files.values() if f] + ([raw["tokenizer"]["file"]] if raw["tokenizer"] else [])
        named = [(f"files.{k}", v) for k, v in files.items() if v]
        if mtp is not None:
            mtp_files = [(f"mtp.files.{k}", v) for k, v in mtp["files"].items() if v]
            named += mtp_files
            listed += [v for _, v in mtp_files]
        if raw["tokenizer"]:
            named.append(("tokenizer.file", raw["tokenizer"]["file"]))
        for key, f in named:
            inside(out_dir, f, key)  # nothing an export names may lie outside it
        missing = [(key, f) for key, f in named if not (Path(out_dir) / f).is_file()]
        if missing:
            raise ContractError(f"mla_graph.json: {', '.join(k for k, _ in missing)}: file(s) listed are missing: "
                                f"{', '.join(f for _, f in missing)} (not in {out_dir})")
        from .export_files import check_files

        # Every listed file must be recorded: a contract without export.files is refused, not
        # loaded unchecked (unless verify is "none").
        with _key("export.files"):
            check_files(out_dir, raw["export"].get("files"), listed, verify)


def _first_difference(got: list, want: list) -> str:
    for i, (g, w) in enumerate(zip(got, want)):
        if g != w:
            return f"item {i} is {g}, expected {w}"
    return f"{len(got)} items, expected {len(want)}"


# ---------------------------------------------------------------------------- the contract
_DTYPE_ALIASES = {
    "f32": "f32", "float32": "f32", "float": "f32", "tensor(float)": "f32",
    "bf16": "bf16", "bfloat16": "bf16", "tensor(bfloat16)": "bf16",
    "f16": "f16", "float16": "f16", "half": "f16", "tensor(float16)": "f16",
    "i32": "i32", "int32": "i32", "tensor(int32)": "i32",
    "i64": "i64", "int64": "i64", "tensor(int64)": "i64",
    "u8": "u8", "uint8": "u8", "tensor(uint8)": "u8",
}


def normalize_dtype(dtype) -> str:
    """f32/bf16/f16/i32/i64/u8 from a string, numpy dtype or openvino Type."""
    text = getattr(dtype, "get_type_name", None)
    text = text() if callable(text) else str(getattr(dtype, "name", dtype))
    key = text.strip().lower()
    if key not in _DTYPE_ALIASES:
        raise ContractError(f"unknown element type {dtype!r}")
    return _DTYPE_ALIASES[key]


def _dims(shape) -> list:
    """A shape as a list of int (static) or None (dynamic), from a list, tuple or OpenVINO PartialShape."""
    out = []
    for d in shape:
        if isinstance(d, int) and not isinstance(d, bool):
            out.append(d if d >= 0 else None)
        elif isinstance(d, str) or d is None:
            out.append(None)
        else:  # openvino Dimension
            out.append(d.get_length() if d.is_static else None)
    return out


@dataclass
class Contract:
    raw: dict
    out_dir: Path

    @property
    def version(self) -> int:
        return self.raw["version"]

    @property
    def model(self) -> dict:
        return self.raw["model"]

    @property
    def cache(self) -> dict:
        return self.raw["cache"]

    @property
    def files(self) -> dict:
        return self.raw["files"]

    @property
    def mtp(self) -> dict | None:
        """The MTP draft's entry (layer_index, hidden_size, files, inputs, outputs), None without one."""
        return self.raw.get("mtp")

    def mtp_path(self, key: str) -> Path | None:
        """Path of the MTP draft's files[key] (openvino_xml, openvino_bin, onnx, onnx_data) or None."""
        name = (self.mtp or {}).get("files", {}).get(key)
        return inside(self.out_dir, name, f"mtp.files.{key}") if name else None

    @property
    def chat_template(self) -> str | None:
        return self.raw["chat_template"]

    def _io(self, variant: str, key: str) -> list:
        if variant == "mtp":  # the MTP draft graph's
            return (self.mtp or {}).get(key, [])
        return self.raw[key] if variant == "custom" else (self.raw["portable"] or {}).get(key, [])

    def inputs(self, variant: str = "custom") -> list[TensorSpec]:
        """The I/O of a graph: variant custom, portable or mtp (the MTP draft)."""
        items = self._io(variant, "inputs")
        return [TensorSpec(t["name"], tuple(t["shape"]), t["dtype"], t["meaning"]) for t in items]

    def outputs(self, variant: str = "custom") -> list[TensorSpec]:
        items = self._io(variant, "outputs")
        return [TensorSpec(t["name"], tuple(t["shape"]), t["dtype"], t["meaning"]) for t in items]

    def graph_path(self, key: str) -> Path | None:
        """Path of files[key] (openvino_xml, openvino_bin, onnx, onnx_portable, onnx_data) or None."""
        name = self.files.get(key)
        return inside(self.out_dir, name, f"files.{key}") if name else None

    def tokenizer_path(self) -> Path | None:
        tok = self.raw["tokenizer"]
        return inside(self.out_dir, tok["file"], "tokenizer.file") if tok else None

    def validate_model_io(self, inputs, outputs, variant: str = "custom") -> None:
        """inputs/outputs: (name, shape, dtype) triples of a loaded graph; shape items int or
        None/-1/str for dynamic; dtype any spelling normalize_dtype() knows. Raises ContractError."""
        for label, got, want in (("input", inputs, self.inputs(variant)), ("output", outputs, self.outputs(variant))):
            got = {name: (_dims(shape), normalize_dtype(dtype)) for name, shape, dtype in got}
            names = {spec.name for spec in want}
            extra = sorted(set(got) - names)
            if label == "input" and extra:
                raise ContractError(f"graph has {label}(s) the contract does not know: {', '.join(extra)}")
            for spec in want:
                if spec.name not in got:
                    raise ContractError(f"graph lacks the {label} {spec.name!r} the contract lists")
                dims, dtype = got[spec.name]
                if dtype != spec.dtype:
                    raise ContractError(f"{label} {spec.name!r}: element type {dtype}, contract says {spec.dtype}")
                if len(dims) != len(spec.shape):
                    raise ContractError(f"{label} {spec.name!r}: rank {len(dims)}, contract says {len(spec.shape)}")
                for axis, (d, s) in enumerate(zip(dims, spec.shape)):
                    if s == "vocab" and d is not None and d != self.model["vocab_size"]:
                        raise ContractError(f"{label} {spec.name!r}: dim {axis} is {d}, the contract's vocab_size is "
                                            f"{self.model['vocab_size']}: the graph belongs to another model")
                    if isinstance(s, int) and d != s:
                        raise ContractError(f"{label} {spec.name!r}: dim {axis} is {d if d is not None else 'dynamic'}, "
                                            f"contract says {s}")

    def validate_openvino_model(self, model) -> None:
        """The same check on an `openvino.Model` (read with the extension)."""
        def triples(ports):
            return [(p.get_any_name(), list(p.get_partial_shape()), p.get_element_type()) for p in ports]

        self.validate_model_io(triples(model.inputs), triples(model.outputs), "custom")
        for op in model.get_ops():  # the step check holds the model facts the graph was built with
            if op.get_type_name() == "MlaStepCheck":
                self.validate_graph_facts(op.get_attributes())

    def validate_graph_facts(self, attrs: dict) -> None:
        """MlaStepCheck's attributes (vocab_size, max_positions) against the contract's model."""
        for attr, key in (("vocab_size", "vocab_size"), ("max_positions", "max_position_embeddings")):
            if attr in attrs and int(attrs[attr]) != self.model[key]:
                raise ContractError(f"the graph was built for {attr} {int(attrs[attr])}, the contract says {key} "
                                    f"{self.model[key]}: the graph and mla_graph.json belong to different models")


def load_contract(out_dir: str | Path, verify: str | None = None) -> Contract:
    """Read and validate OUT_DIR/mla_graph.json (files listed must exist and match their recorded
    digests: verify = sampled | full | none, default $MLA_EXPORT_VERIFY or sampled)."""
    out_dir = Path(out_dir)
    raw = read_contract(out_dir)
    try:
        validate_contract(raw, out_dir, verify)
    except ContractError as e:  # every loading error names the file (validate_contract's say "mla_graph.json")
        raise ContractError(_in_file(out_dir / CONTRACT_FILE, str(e))) from None
    return Contract(raw, out_dir)


def read_contract(out_dir: str | Path) -> dict:
    """OUT_DIR/mla_graph.json parsed and version-checked, not validated (`mla-export verify`
    validates its structure, then checks every file itself to report all mismatches)."""
    out_dir = Path(out_dir)
    path = out_dir / CONTRACT_FILE
    raw = read_json(path, ContractError, f"; is {out_dir} an `mla-export export` output directory?")
    if isinstance(raw, dict) and _type_ok(raw.get("version"), "integer") and raw["version"] != CONTRACT_VERSION:
        raise ContractError(f"{path}: contract version {show(raw['version'])}, this mla-export reads version "
                            f"{CONTRACT_VERSION}; export the model again")
    return raw


def _in_file(path: Path, message: str) -> str:
    """`<path>: <key>: <what>` from a validation message that starts with the file's bare name."""
    if message.startswith(CONTRACT_FILE):
        message = message[len(CONTRACT_FILE):].lstrip(".:").lstrip()
    return f"{path}: {message}"


_NAME = re.compile(r"^[A-Za-z0-9_.+-]+$")


def make_contract(*, model: dict, block_size: int, kv_dtype: str, files: dict, tokenizer: dict | None,
                  chat_template: str | None, export: dict, mtp: dict | None = None) -> dict:
    """The mla_graph.json content for an export (validated before it is returned). mtp: the MTP
    draft's {"layer_index": N, "files": {openvino_xml, openvino_bin, onnx, onnx_data}}, or None."""
    row_width, r = model["kv_lora_rank"] + model["qk_rope_head_dim"], model["kv_lora_rank"]
    sparse = model.get("sparse_attention")
    index_io = (sparse["indexer_types"].count("full"), sparse["index_head_dim"]) if sparse else None
    hidden = model["hidden_size"] if mtp else None
    inputs, outputs = graph_io(model["num_layers"], block_size, row_width, kv_dtype, "custom", r, index_io, hidden)
    graph_dtype, graph_width, layout = cache_layout(kv_dtype, row_width, r)
    index = None
    if index_io:
        i_dtype, i_width, i_layout = index_cache_layout(kv_dtype, index_io[1])
        index = dict(num_layers=index_io[0], row_width=index_io[1], graph_dtype=i_dtype, graph_row_width=i_width,
                     row_layout=i_layout)
    portable = None
    if files.get("onnx_portable"):
        p_in, p_out = graph_io(model["num_layers"], block_size, row_width, kv_dtype, "portable", r, index_io, hidden)
        portable = dict(inputs=[t.to_json() for t in p_in], outputs=[t.to_json() for t in p_out])
    raw = dict(
        format="mla_graph", version=CONTRACT_VERSION, model=model,
        cache=dict(block_size=block_size, dtype=kv_dtype, row_width=row_width,
                   graph_dtype=graph_dtype, graph_row_width=graph_width, row_layout=layout,
                   num_layers=model["num_layers"], index=index),
        inputs=[t.to_json() for t in inputs], outputs=[t.to_json() for t in outputs], portable=portable,
        files={k: files.get(k) for k in ("openvino_xml", "openvino_bin", "onnx", "onnx_portable", "onnx_data")},
        tokenizer=tokenizer, chat_template=chat_template, export=export)
    if mtp:
        m_in, m_out = mtp_graph_io(block_size, row_width, kv_dtype, r, hidden, mtp["layer_index"],
                                   index_io[1] if index_io else None)
        raw["mtp"] = dict(num_layers=1, layer_index=mtp["layer_index"], hidden_size=hidden,
                          files={k: mtp["files"].get(k) for k in MTP_FILE_KEYS},
                          inputs=[t.to_json() for t in m_in], outputs=[t.to_json() for t in m_out])
    names = list(raw["files"].values()) + (list(raw["mtp"]["files"].values()) if mtp else [])
    for name in filter(None, names):
        if not _NAME.match(name):
            raise ContractError(f"file name {name!r} must be a plain name inside the export directory")
    validate_contract(raw)
    return raw
