"""`youtu` (Youtu-LLM): DeepSeek-V3's MLA attention in a Llama decoder with a dense SwiGLU MLP in
every layer (no experts) and, by default, the embedding table as lm_head."""

from __future__ import annotations

from .base import Family
from .deepseek import _V3


class Youtu(Family):
    name = "youtu"
    model_types = ("youtu",)
    defaults = dict(_V3, vocab_size=128256, max_position_embeddings=131072, bos_token_id=128000,
                    eos_token_id=128001, tie_word_embeddings=True)
    required = tuple(k for k in Family.required if k != "moe_intermediate_size")
    has_moe = False

    def mlp_layer_types(self, d, ints, error):
        return ("dense",) * ints["num_hidden_layers"]


FAMILIES = (Youtu(),)
