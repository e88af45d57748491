"""`mla-export generate`, `from mla_export import LLM`, the bf16 cache path, and no torch on the runtime path."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

from mla_export.cli import main
from mla_export.cli.text import terminal_safe


@pytest.fixture(scope="module")
def out_dir(exports):
    return exports.model("deepseek_v3", "f32", 4)[1]


def test_generate_json_matches_llm_generate(out_dir, capsys):
    from mla_export import LLM

    expected = LLM(out_dir, precision="f32").generate([[5, 6, 7, 8]], max_tokens=5, temperature=0.0)[0]
    assert main(["generate", str(out_dir), "--prompt-ids", "5,6,7,8", "--max-tokens", "5", "--json",
                 "--precision", "f32", "--threads", "1"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["token_ids"] == expected.token_ids and report["prompt_token_ids"] == [5, 6, 7, 8]
    assert report["text"] == expected.text
    assert report["time_to_first_token_s"] > 0
    assert report["runtime"].startswith("OpenVINO ") and "openvino_model.xml" in report["runtime"]
    if len(expected.token_ids) > 1:
        assert report["decode_tokens_per_s"] > 0


def test_generate_text_prompt_prints_the_continuation(out_dir, capsys):
    from mla_export import LLM

    expected = LLM(out_dir, precision="f32").generate("The quick brown fox", max_tokens=6, temperature=0.0)[0]
    assert expected.prompt_token_ids[0] == 0  # the tokenizer adds BOS
    assert main(["generate", str(out_dir), "--prompt", "The quick brown fox", "--max-tokens", "6",
                 "--precision", "f32"]) == 0
    assert capsys.readouterr().out == terminal_safe(expected.text) + "\n"  # control characters escaped


def test_generate_errors_exit_2(tmp_path, out_dir, capsys):
    assert main(["generate", str(tmp_path), "--prompt-ids", "1,2"]) == 2
    assert "mla_graph.json" in capsys.readouterr().err
    assert main(["generate", str(out_dir), "--prompt-ids", "1,x"]) == 2
    assert "comma-separated" in capsys.readouterr().err
    assert main(["generate", str(out_dir), "--prompt-ids", "1,2", "--temperature", "-1"]) == 2
    assert "temperature" in capsys.readouterr().err


def test_bf16_cache_is_written_in_place_and_generates(exports):
    # The default export: a bf16 cache, bound as bytes; the engine's start-up sentinel check passes.
    from mla_export import LLM

    _, bf16_dir = exports.model("deepseek_v3", "bf16", 4)
    llm = LLM(bf16_dir, precision="bf16", num_blocks=16)
    outs = llm.generate([[5, 6, 7, 8, 9, 10], [11, 12]], max_tokens=6, ignore_eos=True, temperature=0.0)
    assert [len(o.token_ids) for o in outs] == [6, 6]
    assert llm.engine.backend.kv_caches[0].dtype.name == "bfloat16"
    assert llm.engine.stats()["kv_blocks_used"] == 0


def test_runtime_path_never_imports_torch(out_dir):
    script = textwrap.dedent(f"""
        import sys
        from mla_export import LLM
        from mla_export.cli import main
        outs = LLM({str(out_dir)!r}, precision="f32").generate([[5, 6, 7]], max_tokens=3, ignore_eos=True, temperature=0.0)
        assert len(outs[0].token_ids) == 3
        assert main(["generate", {str(out_dir)!r}, "--prompt-ids", "5,6,7", "--max-tokens", "2"]) == 0
        leaked = sorted(m for m in ("torch", "transformers", "onnx") if m in sys.modules)
        assert not leaked, leaked
        print("ok")
    """)
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip().endswith("ok")
