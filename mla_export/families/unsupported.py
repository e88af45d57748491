"""MLA model types of transformers 5.25 that this exporter refuses, each with what blocks it (the
refusal names it, docs/MODELS.md repeats it)."""

from __future__ import annotations

UNSUPPORTED = {
    "glm5_next_text": "GLM-5-Next's text tower uses DeepSeek Sparse Attention, not yet run here",
    "glm5_next": "GLM-5's multimodal model; its text tower uses DeepSeek Sparse Attention, not yet run here",
    "kimi_linear": "Kimi Linear interleaves MLA with Kimi Delta Attention (linear attention with a recurrent state), "
                   "which has no paged-cache op here",
    "bailing_hybrid": "Ling/Ring hybrid models interleave MLA with linear-attention layers (a recurrent state), "
                      "which have no paged-cache op here",
    "hy_v4": "Hunyuan-V4 mixes MLA with attention variants this exporter does not build",
    "hy_v4_vl": "a multimodal model (vision tower + Hunyuan-V4 text); only text-only checkpoints are exported",
    "hy_v4_vl_text": "Hunyuan-V4's text tower mixes MLA with attention variants this exporter does not build",
    "axk2": "A.X-K2 adds DeepSeek Sparse Attention's indexer to A.X-K1, not yet run here",
    "mistral_large4": "a multimodal model (Pixtral vision + Mistral Large 4 text); only text-only checkpoints "
                      "are exported",
    "mistral_large4_text": "Mistral Large 4's text tower uses DeepSeek Sparse Attention, not yet run here",
    "dots3_note": "a multimodal model (vision and audio encoders); only text-only checkpoints are exported",
    "dots3_note_text": "dots3's text tower is not built yet",
}
