"""Weight bytes a batch-1 decode token reads, for the benchmark's efficiency figure
(efficiency = bytes/token x tokens/s / the plain read bandwidth measured around the run).

Ours: from the export's config.json (the model's shapes, parsed by MLAModelConfig) and its
contract (mla_graph.json `export`: weight format, float dtype, int4 group sizes, MoE form, and by
name the weights an int4 export stores in another format than its default rule's,
`int4_weight_formats`: --tensor-format and --ratio's plan), with
the exporter's storage layouts (mla_export/export/graph.py, qlinear.py, moe.py), as stored:
  float formats       n params x the dtype's bytes
  int8 / int4 (plain) codes + per-group u8/u4 zero point + f16 scale (GraphBuilder._dequantized)
  MlaQLinear, fused   codes + per-group f32 scale + u8 zero point (qlinear.py, moe.py `_fused`)
What one decode token reads: every non-expert weight whole (attention projections, the absorbed
w_uk / w_uv, norms, dense MLPs, routers, shared experts, lm_head), one row of the embedding and
RoPE tables, and in each MoE layer top-k routed experts (every MoE form runs the selected experts
only). Not counted: the KV cache (it grows with the context: docs/KV_CACHE.md has its bytes).

llama.cpp: the GGUF's own tensor table (name, shape, ggml type) with ggml's block sizes, read the
same way: token_embd one row (whole too when it serves as the output), *_exps tensors top-k /
n_expert of them, attn_kv_b left out where the split attn_k_b / attn_v_b that MLA decode reads
are there, the rest whole. A tensor
type missing from GGML_BLOCKS makes the figure unknown, with the reason (never a guess).
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

from ..checkpoint.config import ConfigError, MLAModelConfig
from ..formats.weight_format import by_name

FLOAT_BYTES = {"f32": 4, "bf16": 2, "f16": 2}
FAMILIES = ("deepseek_v2", "deepseek_v3")  # the layer layout counted below (no indexer, no identity experts)


class Unknown(ValueError):
    """The bytes cannot be computed (the reason is the message)."""


# ---------------------------------------------------------------------------------------- ours
def _pick_group(n_in: int, requested: int) -> int:
    from ..export.quantize import pick_group

    return pick_group(n_in, requested)


FP8_BITS = by_name("fp8").bits  # the ops' `bits` value for e4m3 codes


def _fp8_group(n_in: int) -> int | None:
    from ..export.quantize import fp8_group

    return fp8_group(n_in)


class _Layout:
    """Bytes of one stored weight [rows, cols] in the export's format."""

    def __init__(self, export: dict):
        self.fmt = export.get("weight_format")
        self.float_dtype = export.get("weight_dtype")
        if self.fmt not in ("f32", "bf16", "f16", "int8", "int4", "fp8"):
            raise Unknown(f"weight format {self.fmt!r} is not one this count knows")
        if self.float_dtype not in FLOAT_BYTES:
            raise Unknown(f"float weight dtype {self.float_dtype!r} is not one this count knows")
        # the weights stored in another format than int4's default rule (--ratio's plan, --tensor-format)
        self.exceptions = export.get("int4_weight_formats")
        ratio = export.get("int4_ratio")
        if self.fmt == "int4" and ratio not in (None, 1, 1.0) and self.exceptions is None:
            raise Unknown(f"int4 with --ratio {ratio}: which weights went to int8 is not in the contract")
        if not isinstance(self.exceptions or {}, dict) or \
                any(v not in ("int8", "int4") for v in (self.exceptions or {}).values()):
            raise Unknown(f"int4_weight_formats {self.exceptions!r} is not a map of weight names to int8/int4")
        self.exceptions = self.exceptions or {}
        self.all_layers = bool(export.get("int4_all_layers"))
        self.groups = sorted(export.get("int4_group_sizes") or [], reverse=True)
        self.group_size = self.groups[0] if self.groups else 128  # checked against the recorded set: check_groups
        self.used_groups: set[int] = set()

    def bits(self, kind: str, name: str = "") -> int | None:
        """As WeightFormat.bits: 8, 4, FP8_BITS (fp8 codes: matmul weights only) or None (float);
        int4: the contract's int4_weight_formats for `name` (the export's name of the stored weight)."""
        if self.fmt == "int8":
            return 8
        if self.fmt == "fp8":
            return FP8_BITS if kind == "matmul" else 8
        if self.fmt == "int4":
            if name in self.exceptions:
                return int(self.exceptions[name][3:])
            return 8 if kind in ("embedding", "head") and not self.all_layers else 4
        return None

    def float_bytes(self, n: int) -> float:
        return n * FLOAT_BYTES[self.float_dtype]

    def _group(self, bits: int, cols: int) -> int:
        if bits == 8:
            return cols
        g = _pick_group(cols, self.group_size)
        self.used_groups.add(g)
        return g

    def plain(self, rows: int, cols: int, kind: str = "matmul", name: str = "") -> float:
        """GraphBuilder.weight: float as stored, or codes + zero points + f16 scales."""
        bits = self.bits(kind, name)
        if bits is None or bits == FP8_BITS:  # fp8 codes are read by our ops only: float elsewhere
            return self.float_bytes(rows * cols)
        g = self._group(bits, cols)
        if bits == 8:  # u8 codes, u8 zp and f16 scale per row
            return rows * (cols + 1 + 2)
        groups = cols // g  # u4 codes and u4 zero points (two a byte), f16 scale per group
        return rows * (cols / 2 + groups / 2 + 2 * groups)

    def qlinear_ok(self, rows: int, cols: int, bits: int | None) -> bool:
        """qlinear.qlinear_problem: MlaQLinear holds it (else the plain form)."""
        if bits not in (4, 8, FP8_BITS) or rows % 32 or cols % 32:
            return False
        if bits == FP8_BITS:
            return _fp8_group(cols) is not None
        return bits == 8 or _pick_group(cols, self.group_size) % 32 == 0

    def codes_f32_scales(self, rows: int, cols: int, bits: int) -> float:
        """MlaQLinear / fused-MoE operands: codes, f32 scale and u8 zero point per group (fp8: one
        byte a code, groups of the checkpoint's block width or quantize.fp8_group's 128)."""
        if bits == FP8_BITS:
            return rows * (cols + 5 * (cols // _fp8_group(cols)))
        g = self._group(bits, cols)
        return rows * (cols * bits / 8 + 5 * (cols // g))

    def linear(self, rows: int, cols: int, bias: bool, kind: str = "matmul", name: str = "") -> float:
        """layers.linear / model._logits: MlaQLinear where it can, else the plain form (+ f32 bias)."""
        bits = self.bits(kind, name)
        if not bias and self.qlinear_ok(rows, cols, bits):
            return self.codes_f32_scales(rows, cols, bits)
        return self.plain(rows, cols, kind, name) + (4 * rows if bias else 0)

    def check_groups(self) -> None:
        """The int4 group sizes this count used must be the ones the export recorded (the contract
        does not store --group-size: it is taken as the largest recorded group)."""
        if self.fmt == "int4" and self.used_groups != set(self.groups):
            raise Unknown(f"int4 group sizes {sorted(self.used_groups, reverse=True)} do not match the export's "
                          f"{self.groups} (an export made with another --group-size rule)")


def export_bytes_per_token(export_dir: str | Path) -> dict:
    """{"bytes": weight bytes one batch-1 decode token reads, "parts": bytes by part, "how": ...}.
    Raises Unknown with the reason when it cannot be computed."""
    export_dir = Path(export_dir)
    try:
        contract = json.loads((export_dir / "mla_graph.json").read_text())
        export = contract["export"]
        cfg = MLAModelConfig.from_dir(export_dir)
    except (OSError, ValueError, KeyError, TypeError, ConfigError) as e:
        raise Unknown(f"{export_dir}: cannot read its contract and config ({type(e).__name__}: {e})") from None
    if cfg.family not in FAMILIES or cfg.sparse is not None or (cfg.moe and cfg.moe.zero_experts):
        raise Unknown(f"{cfg.family} layers are not counted (only {', '.join(FAMILIES)} without an indexer)")
    L = _Layout(export)
    moe_form = export.get("moe_form")
    h, nh, r, dr = cfg.hidden_size, cfg.num_heads, cfg.kv_lora_rank, cfg.qk_rope_head_dim
    qk, dv, dn = cfg.qk_nope_head_dim + dr, cfg.v_head_dim, cfg.qk_nope_head_dim
    bias = cfg.attention_bias
    parts = {"embedding row": 0.0, "attention": 0.0, "dense MLP": 0.0, "routers": 0.0, "shared experts": 0.0,
             "routed experts (top-k)": 0.0, "norms and RoPE rows": 0.0, "lm_head": 0.0}

    def mlp(prefix: str, inter: int) -> float:
        return (L.linear(inter, h, cfg.mlp_bias, name=f"{prefix}.gate_proj.weight")
                + L.linear(inter, h, cfg.mlp_bias, name=f"{prefix}.up_proj.weight")
                + L.linear(h, inter, cfg.mlp_bias, name=f"{prefix}.down_proj.weight"))

    # embedding: the Gather reads one row of the stored table (codes + its zp and scale)
    parts["embedding row"] = L.plain(1, h, "embedding", "model.embed_tokens.weight")
    rope_rows = 2 * cfg.rope.dim * 4  # the token's cos and sin rows (f32)
    parts["norms and RoPE rows"] += rope_rows + 4 * h  # + the final norm
    for i in range(cfg.num_layers):
        p = f"model.layers.{i}.self_attn"
        att = 0.0
        if cfg.q_lora_rank is None:
            att += L.linear(nh * qk, h, False, name=f"{p}.q_proj.weight")
        else:
            att += L.linear(cfg.q_lora_rank, h, bias, name=f"{p}.q_a_proj.weight") + \
                L.linear(nh * qk, cfg.q_lora_rank, False, name=f"{p}.q_b_proj.weight")
            parts["norms and RoPE rows"] += 4 * cfg.q_lora_rank
        att += L.linear(r + dr, h, bias, name=f"{p}.kv_a_proj_with_mqa.weight")
        # absorbed kv_b_proj halves, operands of our attention op: float in every format
        att += FLOAT_BYTES[L.float_dtype] * nh * r * (dn + dv)
        att += L.linear(h, nh * dv, bias, name=f"{p}.o_proj.weight")
        parts["attention"] += att
        parts["norms and RoPE rows"] += 4 * (2 * h + r)
        mp = f"model.layers.{i}.mlp"
        if cfg.mlp_layer_types[i] == "dense":
            parts["dense MLP"] += mlp(mp, cfg.intermediate_size)
            continue
        m = cfg.moe
        parts["routers"] += 4 * m.n_routed_experts * h + (4 * m.n_routed_experts if m.scoring == "sigmoid" else 0)
        if m.n_shared_experts:
            parts["shared experts"] += mlp(f"{mp}.shared_experts", m.moe_intermediate_size * m.n_shared_experts)
        inter, ep = m.moe_intermediate_size, f"{mp}.experts"
        if L.fmt in ("int8", "int4", "fp8") and moe_form == "fused":  # MlaMoeExperts operands, stacked per expert
            expert = L.codes_f32_scales(2 * inter, h, L.bits("matmul", f"{ep}.w13")) + \
                L.codes_f32_scales(h, inter, L.bits("matmul", f"{ep}.w2"))
        elif moe_form == "gather_matmul":  # stacked [E, out, in] per projection (GraphBuilder.weight)
            expert = L.plain(inter, h, name=f"{ep}.gate_proj.stacked") + L.plain(inter, h, name=f"{ep}.up_proj.stacked") \
                + L.plain(h, inter, name=f"{ep}.down_proj.stacked")
        else:  # one weight per projection and expert (GraphBuilder.weight): the experts' mean
            expert = sum(L.plain(2 * inter, h, name=f"{ep}.{e}.gate_up_proj.weight")
                         + L.plain(h, inter, name=f"{ep}.{e}.down_proj.weight")
                         for e in range(m.n_routed_experts)) / m.n_routed_experts
        parts["routed experts (top-k)"] += m.num_experts_per_tok * expert
    head_bits = L.bits("head", "lm_head.weight")
    if cfg.tie_word_embeddings and head_bits is not None:
        # tied: the quantized embedding table serves as lm_head, read whole (a tied checkpoint that
        # also carries lm_head.weight gets MlaQLinear: 2 bytes a row more, not told apart here)
        parts["lm_head"] = L.plain(cfg.vocab_size, h, "embedding", "model.embed_tokens.weight")
    else:
        parts["lm_head"] = L.linear(cfg.vocab_size, h, False, "head", "lm_head.weight")
    L.check_groups()
    total = sum(parts.values())
    return {"bytes": int(round(total)), "parts": {k: int(round(v)) for k, v in parts.items() if v},
            "how": f"from config.json and the contract ({L.fmt} weights, {L.float_dtype} float weights, "
                   f"MoE form {moe_form}): non-expert weights whole, one embedding row, top-"
                   f"{cfg.moe.num_experts_per_tok if cfg.moe else 0} routed + shared experts per MoE layer"}


# ------------------------------------------------------------------------------------- llama.cpp
# ggml type id -> (name, values per block, bytes per block): ggml/include/ggml.h and ggml-common.h
GGML_BLOCKS = {0: ("F32", 1, 4), 1: ("F16", 1, 2), 2: ("Q4_0", 32, 18), 3: ("Q4_1", 32, 20), 6: ("Q5_0", 32, 22),
               7: ("Q5_1", 32, 24), 8: ("Q8_0", 32, 34), 9: ("Q8_1", 32, 36), 10: ("Q2_K", 256, 84),
               11: ("Q3_K", 256, 110), 12: ("Q4_K", 256, 144), 13: ("Q5_K", 256, 176), 14: ("Q6_K", 256, 210),
               15: ("Q8_K", 256, 292), 20: ("IQ4_NL", 32, 18), 23: ("IQ4_XS", 256, 136), 24: ("I8", 1, 1),
               25: ("I16", 1, 2), 26: ("I32", 1, 4), 27: ("I64", 1, 8),
               28: ("F64", 1, 8), 30: ("BF16", 1, 2), 39: ("MXFP4", 32, 17),
               # ik_llama.cpp's own types (its ggml-common.h): IQ4_K = f16 d, u16 extra, 4 + 8 bytes of
               # scales, 128 of nibbles a 256 block (an IQ4_K GGUF's tensors then add up to its size)
               139: ("IQ4_K", 256, 144)}
_GGUF_SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}


class _Reader:
    def __init__(self, f):
        self.f = f

    def take(self, fmt: str):
        size = struct.calcsize("<" + fmt)
        data = self.f.read(size)
        if len(data) != size:
            raise Unknown("the GGUF file ends inside its header")
        return struct.unpack("<" + fmt, data)[0]

    def string(self) -> str:
        n = self.take("Q")
        if n > 1 << 24:
            raise Unknown(f"a GGUF string of {n} bytes: not a GGUF header")
        return self.f.read(n).decode("utf-8", "replace")

    def value(self, vtype: int):
        if vtype in _GGUF_SCALARS:
            return self.take(_GGUF_SCALARS[vtype])
        if vtype == 8:
            return self.string()
        if vtype == 9:
            etype, n = self.take("I"), self.take("Q")
            return [self.value(etype) for _ in range(n)]
        raise Unknown(f"GGUF metadata value type {vtype} is not one this reader knows")


def gguf_tensors(path: str | Path) -> tuple[dict, list[tuple[str, tuple[int, ...], int]]]:
    """(metadata, [(tensor name, dims as GGUF lists them (innermost first), ggml type id)])."""
    with open(path, "rb") as f:
        rd = _Reader(f)
        if f.read(4) != b"GGUF":
            raise Unknown(f"{path}: not a GGUF file")
        version = rd.take("I")
        if version < 2:
            raise Unknown(f"{path}: GGUF version {version} (2 or 3 read here)")
        n_tensors, n_kv = rd.take("Q"), rd.take("Q")
        meta = {}
        for _ in range(n_kv):
            key = rd.string()
            meta[key] = rd.value(rd.take("I"))
        tensors = []
        for _ in range(n_tensors):
            name = rd.string()
            dims = tuple(rd.take("Q") for _ in range(rd.take("I")))
            ttype = rd.take("I")
            rd.take("Q")  # offset
            tensors.append((name, dims, ttype))
    return meta, tensors


def gguf_bytes_per_token(path: str | Path) -> dict:
    """The same figure for a llama.cpp GGUF (its tensor table and its expert count / top-k)."""
    meta, tensors = gguf_tensors(path)
    arch = meta.get("general.architecture")
    n_exp, top_k = meta.get(f"{arch}.expert_count"), meta.get(f"{arch}.expert_used_count")
    parts = {"embedding row": 0.0, "routed experts (top-k)": 0.0, "other weights": 0.0}
    names = {t[0] for t in tensors}
    for name, dims, ttype in tensors:
        if name.endswith(".attn_kv_b.weight") and name.replace("attn_kv_b", "attn_k_b") in names:
            continue  # llama.cpp's MLA decode reads the split attn_k_b / attn_v_b, not kv_b

        if ttype not in GGML_BLOCKS:
            raise Unknown(f"{Path(path).name}: tensor {name} has ggml type {ttype}, whose block size this "
                          f"count does not know")
        _, per_block, block_bytes = GGML_BLOCKS[ttype]
        n = 1
        for d in dims:
            n *= d
        size = n // per_block * block_bytes
        if name == "token_embd.weight":
            parts["embedding row"] += size / dims[-1]  # one row of [vocab (outer), hidden]
            if "output.weight" not in names:  # tied: the table is the output projection too, read whole
                parts["other weights"] += size
        elif "_exps." in name:
            if not n_exp or not top_k:
                raise Unknown(f"{Path(path).name}: expert tensors but no {arch}.expert_count / expert_used_count")
            parts["routed experts (top-k)"] += size * top_k / n_exp
        else:
            parts["other weights"] += size
    return {"bytes": int(round(sum(parts.values()))), "parts": {k: int(round(v)) for k, v in parts.items()},
            "how": f"from the GGUF's tensor table: token_embd one row, *_exps tensors {top_k}/{n_exp}, the rest whole"}
