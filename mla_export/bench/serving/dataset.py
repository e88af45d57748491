"""vLLM's random dataset as text: prompts of a target token length for servers that take text only
(llama-server refuses token-id prompts), made with the export's own tokenizer.json.

As vLLM's RandomDataset: per request an input length drawn uniformly from
[floor(L(1-r)), ceil(L(1+r))] where L = --random-input-len minus the special tokens the tokenizer
adds (BOS), an output length likewise around --random-output-len (at least 1), and an offset; the
prompt is the run of non-special token ids (offset + i + k) mod |allowed|, decoded to text,
re-encoded, truncated or padded with random non-special ids, up to 10 times, until the text re-encodes to the
target length (a byte-level BPE does not always round-trip N ids to N ids)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

MAX_RETRY = 10  # vLLM's gen_prompt_decode_to_target_len budget


@dataclass(frozen=True)
class SampleRequest:
    prompt: str
    prompt_len: int  # tokens as a server with this tokenizer counts them (its specials included)
    expected_output_len: int
    prompt_ids: tuple[int, ...] = ()  # the prompt's ids without specials (--prompt-format token-ids sends these)

    def payload_prompt(self, fmt: str):
        """The `prompt` field: the text, or the token ids (the same tokens to every server,
        whatever its own tokenizer would make of the text; no special token is added to them)."""
        return list(self.prompt_ids) if fmt == "token-ids" else self.prompt

    def payload_len(self, fmt: str) -> int:
        return len(self.prompt_ids) if fmt == "token-ids" else self.prompt_len


def load_tokenizer(path: str | Path):
    """A `tokenizers.Tokenizer` from tokenizer.json or from a directory holding one (an export)."""
    from tokenizers import Tokenizer

    p = Path(path)
    f = p / "tokenizer.json" if p.is_dir() else p
    if not f.is_file():
        raise ValueError(f"--tokenizer: no tokenizer.json at {p} (give an export directory or the file itself)")
    try:
        return Tokenizer.from_file(str(f))
    except Exception as e:  # a malformed file: say which
        raise ValueError(f"--tokenizer: {f} is not a tokenizers JSON file ({e})") from e


def num_special_tokens_to_add(tok) -> int:
    """How many ids the tokenizer's post-processor adds to one text (BOS for DeepSeek's)."""
    return len(tok.encode("a", add_special_tokens=True).ids) - len(tok.encode("a", add_special_tokens=False).ids)


def special_ids(tok) -> set[int]:
    return {i for i, t in tok.get_added_tokens_decoder().items() if t.special}


def decode_to_target_len(tok, ids: list[int], target: int, allowed: np.ndarray,
                         rng: np.random.Generator) -> tuple[str, list[int], int]:
    """(prompt, its ids, residual mismatch): decode, re-encode, cut or pad until the lengths agree.
    Pads with non-special ids only: a special token's text would re-encode as that special token."""
    mismatch, tries = 0, MAX_RETRY
    while True:
        prompt = tok.decode(ids, skip_special_tokens=False)
        ids = tok.encode(prompt, add_special_tokens=False).ids
        if tries <= 0:
            mismatch = len(ids) - target
            break
        if len(ids) == target:
            break
        if len(ids) < target:
            ids = ids + allowed[rng.integers(0, allowed.size, size=target - len(ids))].tolist()
        else:
            ids = ids[:target]
        tries -= 1
    return prompt, ids, mismatch


def random_requests(tok, num_prompts: int, input_len: int, output_len: int, range_ratio: float = 0.0,
                    seed: int = 0) -> tuple[list[SampleRequest], int]:
    """(requests, total token mismatch left after the retries) for vLLM's random dataset."""
    if num_prompts < 1:
        raise ValueError(f"--num-prompts must be >= 1, got {num_prompts}")
    if not 0.0 <= range_ratio < 1.0:
        raise ValueError(f"--random-range-ratio must be in [0, 1), got {range_ratio}")
    if output_len < 1:
        raise ValueError(f"--random-output-len must be >= 1, got {output_len}")
    n_special = num_special_tokens_to_add(tok)
    real = max(0, input_len - n_special)
    in_lo, in_hi = math.floor(real * (1 - range_ratio)), math.ceil(real * (1 + range_ratio))
    if in_lo < 1:
        raise ValueError(f"--random-input-len {input_len} is too small: the tokenizer adds {n_special} special "
                         f"token(s), leaving {in_lo} random tokens at the low end of the range")
    out_lo, out_hi = max(1, math.floor(output_len * (1 - range_ratio))), max(1, math.ceil(output_len * (1 + range_ratio)))
    vocab = tok.get_vocab_size()
    allowed = np.array(sorted(set(range(vocab)) - special_ids(tok)), dtype=np.int64)
    if allowed.size == 0:
        raise ValueError("--tokenizer: every id is a special token; no text can be drawn")
    rng = np.random.default_rng(seed)
    in_lens = rng.integers(in_lo, in_hi + 1, size=num_prompts)
    out_lens = rng.integers(out_lo, out_hi + 1, size=num_prompts)
    offsets = rng.integers(0, vocab, size=num_prompts)
    out, total_mismatch = [], 0
    for i in range(num_prompts):
        seq = allowed[(int(offsets[i]) + i + np.arange(int(in_lens[i]))) % allowed.size].tolist()
        prompt, ids, mismatch = decode_to_target_len(tok, seq, int(in_lens[i]), allowed, rng)
        total_mismatch += mismatch
        out.append(SampleRequest(prompt=prompt, prompt_len=len(ids) + n_special, expected_output_len=int(out_lens[i]),
                                 prompt_ids=tuple(ids)))
    return out, total_mismatch
