"""The runtime: run an exported MLA model step by step on a paged latent cache.

Imports only openvino, numpy, ml_dtypes and tokenizers (never torch). The pieces, vLLM-style:
  backend.OpenVINOMLABackend   cache layout facts, block copies, builder + implementation classes
  metadata.MLAMetadataBuilder  per-sequence facts -> the graph's metadata inputs
  executor_openvino            the compiled graph bound to the shared per-layer caches
  kv_cache.KVCacheManager      cache arrays, block allocator, prefix caching, copy-on-write
  scheduler.Scheduler          token budget, continuous batching, chunked prefill, preemption
  sampling                     SamplingParams and the numpy sampler
  engine.LLMEngine, llm.LLM    the user-facing engine and offline generate()
"""

from .backend import OpenVINOMLABackend
from .engine import LLMEngine, RequestMetrics, RequestOutput
from .llm import LLM, CompletionOutput
from .metadata import MLAMetadata, MLAMetadataBuilder
from .sampling import SamplingParams

__all__ = [
    "OpenVINOMLABackend",
    "MLAMetadata",
    "MLAMetadataBuilder",
    "LLMEngine",
    "RequestOutput",
    "RequestMetrics",
    "SamplingParams",
    "LLM",
    "CompletionOutput",
]
