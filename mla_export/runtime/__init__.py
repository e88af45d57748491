"""The runtime: run an exported MLA model step by step on a paged latent cache.

Imports only openvino, numpy, ml_dtypes and tokenizers (never torch). The pieces, vLLM-style:
  backend.MLABackend           the one object the engine talks to: owns the cache arrays, builds
                               the graph inputs, runs one executor per runtime, applies block copies
  cache_layout.CacheLayout     per-layer cache array shape, bytes per block, allocation
  metadata.MLAMetadataBuilder  per-sequence facts -> the graph's metadata inputs
  executor_openvino, executor_onnxruntime   the compiled graph bound to the per-layer caches
  kv_cache.KVCacheManager      bookkeeping: block ids, ref counts, prefix caching, copy-on-write
  scheduler.Scheduler          token budget, continuous batching, chunked prefill, preemption
  sampling                     SamplingParams and the numpy sampler
  structured_output            structured outputs: llguidance grammars, per-request matchers, bitmasks
  engine.LLMEngine, llm.LLM    the user-facing engine and offline generate()
"""

from .backend import MLABackend
from .engine import LLMEngine, RequestMetrics, RequestOutput
from .llm import LLM, CompletionOutput, RequestOutput as GenerateOutput
from .metadata import MLAMetadata, MLAMetadataBuilder
from .sampling import SamplingParams
from .structured_output import GuidedDecodingParams, StructuredOutputsParams

__all__ = [
    "MLABackend",
    "MLAMetadata",
    "MLAMetadataBuilder",
    "LLMEngine",
    "RequestOutput",
    "RequestMetrics",
    "SamplingParams",
    "StructuredOutputsParams",
    "GuidedDecodingParams",
    "LLM",
    "CompletionOutput",
    "GenerateOutput",
]
