"""An exported model directory, as the runtime needs it: the validated contract (see
`mla_export.formats.contract`) and the facts the engine reads from it."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ..formats.contract import Contract, load_contract
from ..formats.contract_error import ContractError

__all__ = ["ModelFacts", "load_model_dir", "graph_path"]


@dataclass(frozen=True)
class ModelFacts:
    num_layers: int
    block_size: int
    row_width: int  # kv_lora_rank + qk_rope_head_dim
    cache_dtype: str  # the row format, kv_formats.KV_DTYPES (all but f32 are bound as bytes)
    vocab_size: int
    max_model_len: int
    eos_token_ids: frozenset[int]
    tokenizer_path: Path | None
    kv_lora_rank: int = 0  # r: where quantised rows split into codes and k_pe
    random_weights: bool = False  # export.random_weights: its text is noise (generate says so)

    def load_tokenizer(self):
        if self.tokenizer_path is None:
            return None
        from tokenizers import Tokenizer

        return Tokenizer.from_file(str(self.tokenizer_path))


def graph_path(contract: Contract) -> Path:
    """The graph the OpenVINO executor compiles: the IR, else the ONNX graph with the MLA ops
    (the portable ONNX variant returns its caches instead of writing them in place: not usable)."""
    path = contract.graph_path("openvino_xml") or contract.graph_path("onnx")
    if path is None:
        raise ContractError(f"{contract.out_dir}: the export has neither an OpenVINO IR nor an ONNX graph with the MLA ops")
    return path


def load_model_dir(out_dir: str | Path, verify: str | None = None) -> tuple[Contract, ModelFacts]:
    """(contract, facts) of an `mla-export export` output directory; ContractError names the problem.
    verify: how the files are checked against their recorded digests (sampled | full | none;
    default $MLA_EXPORT_VERIFY or sampled; mla_export/formats/export_files.py)."""
    out_dir = Path(out_dir)
    if not out_dir.is_dir():
        raise ContractError(f"{out_dir}: not a directory (expected the output of `mla-export export`)")
    contract = load_contract(out_dir, verify)
    model, cache = contract.model, contract.cache
    facts = ModelFacts(
        num_layers=model["num_layers"],
        block_size=cache["block_size"],
        row_width=cache["row_width"],
        cache_dtype=cache["dtype"],
        vocab_size=model["vocab_size"],
        max_model_len=model["max_position_embeddings"],
        eos_token_ids=frozenset(model["eos_token_ids"]),
        tokenizer_path=contract.tokenizer_path(),
        kv_lora_rank=model["kv_lora_rank"],
        random_weights=contract.raw["export"].get("random_weights", False),  # a boolean (the schema); absent: an older export
    )
    return contract, facts
