"""The Hugging Face checkpoint: config.json read and checked, safetensors read one tensor
at a time, and the checkpoints the tests and presets write (random, FP8)."""
