"""A byte-level BPE tokenizer that fills a model's whole vocabulary (random-weight checkpoints).

DeepSeek's layout: BPE tokens on the low ids (the 256 byte symbols, then every 2-byte pair, then
3-byte tokens until the BPE range is full), BOS/EOS at the config's ids and reserved special
tokens from `reserved_from` to the end, so that every id the model can emit decodes and llama.cpp's
converter (which walks ids 0..vocab-1) and our exporter both take the directory. Built from a
vocabulary and merge list directly (no training), in about a second at 102400 entries.
"""

from __future__ import annotations

import json
from pathlib import Path

BOS, EOS = "<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>"


def _bytes_to_unicode() -> list[str]:
    """GPT-2's printable stand-ins for the 256 byte values (what ByteLevel pre-tokenizes to)."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs, n = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    table = dict(zip(bs, cs))
    return [chr(table[b]) for b in range(256)]


def build_tokenizer(vocab_size: int, bos_id: int, eos_id: int, reserved_from: int):
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

    special_ids = {bos_id, eos_id} | set(range(reserved_from, vocab_size))
    bpe_ids = [i for i in range(min(reserved_from, vocab_size)) if i not in special_ids]
    if len(bpe_ids) < 256 or not (0 <= bos_id < vocab_size and 0 <= eos_id < vocab_size) or bos_id == eos_id:
        raise ValueError(f"tokenizer: vocab {vocab_size} with BOS {bos_id}, EOS {eos_id}, specials from "
                         f"{reserved_from} leaves {len(bpe_ids)} BPE ids (needs >= 256 and distinct BOS/EOS ids)")
    alpha = _bytes_to_unicode()
    tokens, merges = list(alpha), []

    def fill():
        for a in alpha:
            for b in alpha:
                yield a + b, (a, b)
        for a in alpha:
            for b in alpha:
                for c in alpha:
                    yield a + b + c, (a + b, c)

    gen = fill()
    while len(tokens) < len(bpe_ids):
        tok, merge = next(gen)
        tokens.append(tok)
        merges.append(merge)
    vocab = dict(zip(tokens, bpe_ids))
    specials = {bos_id: BOS, eos_id: EOS}
    for i in sorted(special_ids - {bos_id, eos_id}):
        specials[i] = f"<｜reserved_{i}｜>"
    vocab.update({s: i for i, s in specials.items()})  # specials keep their ids when added below
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(specials[i], special=True, normalized=False) for i in sorted(specials)])
    if tok.get_vocab_size() != vocab_size or tok.token_to_id(BOS) != bos_id or tok.token_to_id(EOS) != eos_id:
        raise RuntimeError(f"tokenizer: built {tok.get_vocab_size()} entries (BOS {tok.token_to_id(BOS)}, "
                           f"EOS {tok.token_to_id(EOS)}), expected {vocab_size} ({bos_id}, {eos_id})")
    return tok


def write_tokenizer(out_dir, vocab_size: int, bos_id: int, eos_id: int, reserved_from: int) -> None:
    out = Path(out_dir)
    build_tokenizer(vocab_size, bos_id, eos_id, reserved_from).save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text(json.dumps(
        {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": BOS, "eos_token": EOS, "add_bos_token": True,
         "add_eos_token": False, "model_max_length": 163840, "legacy": True,
         "clean_up_tokenization_spaces": False}, indent=1) + "\n")
