"""DeepSeek Sparse Attention (DSA) families: DeepSeek-V3's blocks with a lightning indexer per layer
that picks, for every new token, the `index_topk` cached positions its attention reads.

- `deepseek_v32` (DeepSeek-V3.2): every layer runs its own indexer; the indexer's RoPE is
  rotate-half (the main attention's stays interleaved, as V3's).
- `glm_moe_dsa` (GLM-5): V3.2's indexer with interleaved RoPE; layers marked "shared" in
  `indexer_types` (or the pattern `index_topk_pattern` / `index_topk_freq` +
  `index_skip_topk_offset` derive) reuse the previous "full" layer's selection and keep no
  indexer cache; GLM's default dims (qk_nope 192, v 256, q_lora 2048).

The indexer (transformers' `DeepseekV32Indexer`): q = wq_b(q_a_layernorm(q_a_proj(x))) as
index_n_heads heads of index_head_dim, k = LayerNorm(wk(x)), RoPE on the first
qk_rope_head_dim values of both, score[t, s] = sum_h weights_proj(x)[t, h] * Hi^-0.5 *
relu(q[t, h] . k[s] * D^-0.5), causal, top-k.
"""

from __future__ import annotations

from .base import Family, SparseAttention
from .deepseek import _V3


def _int(d: dict, key: str, error) -> int:
    v = d.get(key)
    if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
        raise error(f"config.json: {key} must be a positive integer, got {v!r}")
    return v


class DeepseekV32(Family):
    name = "deepseek_v32"
    model_types = ("deepseek_v32",)
    defaults = dict(_V3, max_position_embeddings=163840, index_topk=2048, index_head_dim=128, index_n_heads=64)
    index_rope = "half"

    def rope_form(self, d):
        return "interleave"  # transformers' V3.2 always interleaves the main attention's RoPE

    def indexer_types(self, d: dict, n: int, error) -> tuple[str, ...]:
        return ("full",) * n

    def index_rope_form(self, d: dict, error) -> str:
        """The indexer's RoPE layout: the family's (transformers hard-codes it per class), or what a
        released config.json says in `indexer_rope_interleave` (GLM-5's says true)."""
        flag = d.get("indexer_rope_interleave")
        if flag is None:
            return self.index_rope
        if not isinstance(flag, bool):
            raise error(f"config.json: indexer_rope_interleave must be true or false, got {flag!r}")
        return "interleave" if flag else "half"

    def sparse_attention(self, d, ints, error):
        if d.get("q_lora_rank") is None:
            raise error("config.json: q_lora_rank must be set for DeepSeek Sparse Attention (the indexer's query "
                        "is read from the q_lora projection)")
        s = SparseAttention(index_n_heads=_int(d, "index_n_heads", error),
                            index_head_dim=_int(d, "index_head_dim", error),
                            index_topk=_int(d, "index_topk", error), rope_form=self.index_rope_form(d, error),
                            indexer_types=self.indexer_types(d, ints["num_hidden_layers"], error))
        if s.index_head_dim < ints["qk_rope_head_dim"]:
            raise error(f"config.json: index_head_dim ({s.index_head_dim}) must be at least qk_rope_head_dim "
                        f"({ints['qk_rope_head_dim']}): the indexer rotates that many of its values")
        if s.indexer_types[0] != "full":
            raise error("config.json: indexer_types[0] must be 'full' (a shared layer reuses an earlier full "
                        "layer's selection)")
        return s


class GlmMoeDsa(DeepseekV32):
    name = "glm_moe_dsa"
    model_types = ("glm_moe_dsa",)
    defaults = dict(_V3, vocab_size=154880, hidden_size=6144, intermediate_size=12288, moe_intermediate_size=2048,
                    num_hidden_layers=78, num_attention_heads=64, q_lora_rank=2048, v_head_dim=256,
                    qk_nope_head_dim=192, n_group=1, topk_group=1, rms_norm_eps=1e-5, max_position_embeddings=202752,
                    index_topk=2048, index_head_dim=128, index_n_heads=32)
    index_rope = "interleave"

    def indexer_types(self, d, n, error):
        types = d.get("indexer_types")
        if types is None:  # transformers' GlmMoeDsaConfig.__post_init__
            pattern = d.get("index_topk_pattern")
            if pattern is not None:
                if isinstance(pattern, str) and set(pattern) <= {"F", "S"}:
                    types = [{"F": "full", "S": "shared"}[c] for c in pattern]
                else:
                    types = pattern
            else:
                freq, offset = max(d.get("index_topk_freq", 1), 1), d.get("index_skip_topk_offset", 2)
                types = ["full" if (max(i - offset + 1, 0) % freq) == 0 else "shared" for i in range(n)]
        if not isinstance(types, list) or len(types) != n or any(t not in ("full", "shared") for t in types):
            raise error(f"config.json: indexer_types must be {n} entries of 'full' or 'shared', got {types!r}")
        return tuple(types)


FAMILIES = (DeepseekV32(), GlmMoeDsa())
