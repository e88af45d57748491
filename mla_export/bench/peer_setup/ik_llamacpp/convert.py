"""Runs ik_llama.cpp's own convert_hf_to_gguf.py on a random-weight DeepSeek checkpoint (as the
llama.cpp peer's convert.py does with mainline's), with one run-time patch, the converter file
untouched: its BPE pre-tokenizer hash check is bypassed, the synthetic tokenizer declared to be
DeepSeek's real pre-tokenizer ("deepseek-llm"), since the real tokenizer files are not here.
(ik decides "no q LoRA" from the GGUF itself once setup_ik_llamacpp_peer.sh has mended it.)
The checkpoint needs tokenizer.json + tokenizer_config.json of the full vocab size.
usage: DIR/venv/bin/python DIR/convert.py CKPT_DIR --outtype {f32,bf16,f16,q8_0} --outfile OUT.gguf"""
import os
import sys
from pathlib import Path

SRC = Path(os.environ.get("IK_LLAMACPP_SRC", Path(__file__).resolve().parent / "src"))
sys.path.insert(0, str(SRC))
sys.path.insert(1, str(SRC / "gguf-py"))
import convert_hf_to_gguf as conv  # noqa: E402  (ik_llama.cpp's converter, one module)

conv.Model.get_vocab_base_pre = lambda self, tokenizer: "deepseek-llm"
sys.argv[0] = str(SRC / "convert_hf_to_gguf.py")
conv.main()
