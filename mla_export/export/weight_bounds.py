"""config.json's dimensions against what the checkpoint's weights hold, before the exporter
allocates or loops over anything sized by them.

The safetensors headers (read when the `CheckpointReader` opens the checkpoint) say which decoder
layers exist and each tensor's shape. A config that claims more layers than the weights hold, or
an embedding table of another shape, is refused here with one `ConfigError` naming the key,
instead of after a per-layer loop over the claimed count (the shape of every other tensor is
checked against config.json where it is read, before its bytes are). Layers past the config's
count (DeepSeek-V3's multi-token-prediction layer 61) are left alone, as before.
"""

from __future__ import annotations

import re

from ..config import ConfigError, MLAModelConfig
from .weights import CheckpointReader

__all__ = ["check_weights_hold"]

_LAYER = re.compile(r"^model\.layers\.(\d+)\.")


def check_weights_hold(cfg: MLAModelConfig, reader: CheckpointReader, sublayers: int) -> None:
    """ConfigError unless the weights hold decoder layers 0 .. num_layers / sublayers - 1 and an
    embedding table of [vocab_size, hidden_size]. sublayers: cache layers per decoder layer."""
    held = {int(m.group(1)) for m in map(_LAYER.match, reader.names()) if m}
    layers = cfg.num_layers // sublayers
    key = "num_layers" if sublayers > 1 else "num_hidden_layers"
    missing = next((i for i in range(layers) if i not in held), None)  # layers <= MAX_LAYERS (config_values)
    if missing is not None:
        raise ConfigError(f"config.json: {key} {cfg.raw.get(key, layers)} means {layers} decoder layers, but the "
                          f"weights hold {len(held)} (no tensor under model.layers.{missing}.)")
    name = "model.embed_tokens.weight"
    if reader.has(name):
        got = reader.shape(name)
        if got != (cfg.vocab_size, cfg.hidden_size):
            raise ConfigError(f"config.json: vocab_size {cfg.vocab_size} and hidden_size {cfg.hidden_size} disagree "
                              f"with the weights: {name} is {list(got)}")
