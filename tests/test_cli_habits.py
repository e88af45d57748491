"""What users of optimum-cli, vllm serve and llama.cpp type: each friction point by its message.

Aliases must do what the native option does; other tools' options that mean nothing here must
name the nearest equivalent; a Hub id must say how to download it; a missing optional package
must be one line naming the extra; `--version` must exist."""

from __future__ import annotations

import argparse
import subprocess
import sys
import textwrap

import pytest

from mla_export.cli import main


def err_of(capsys, argv) -> str:
    with pytest.raises(SystemExit) as e:  # argparse-level errors exit from inside parse_args
        code = main(argv)
        raise SystemExit(code)
    assert e.value.code == 2, e.value.code
    return capsys.readouterr().err


def test_version(capsys):
    from mla_export import __version__

    with pytest.raises(SystemExit) as e:
        main(["--version"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith(f"mla-export {__version__} (openvino ")


@pytest.mark.parametrize("argv, nearest", [
    (["serve", "x", "--tensor-parallel-size", "2"], "--threads"),
    (["serve", "x", "--gpu-memory-utilization", "0.9"], "--kv-cache-memory"),
    (["serve", "x", "--block-size", "32"], "mla-export export --block-size"),
    (["serve", "x", "--quantization", "awq"], "mla-export export --weight"),
    (["generate", "x", "-p", "hi", "-ngl", "99"], "CPU only"),
    (["generate", "x", "-p", "hi", "--n-gpu-layers", "99"], "CPU only"),
    (["generate", "x", "-p", "hi", "--repeat-penalty", "1.1"], "--temperature"),
    (["generate", "x", "-p", "hi", "-c", "4096"], "max_position_embeddings"),
    (["export", "x", "-o", "y", "--sym"], "--weight-format int8|int4"),
    (["export", "x", "-o", "y", "--kv-cache-dtype", "fp8"], "--kv-dtype"),
    (["export", "x", "-o", "y", "--tensor-type", "down=q8_0"], "--tensor-format PATTERN=int8|int4"),
])
def test_foreign_options_name_the_nearest_equivalent(capsys, argv, nearest):
    err = err_of(capsys, argv)
    flag = next(a for a in argv[2:] if a.startswith("-") and a not in ("-p", "-o"))
    assert f"{flag} is not an option of `mla-export {argv[0]}" in err and nearest in err, err
    assert f"usage: mla-export {argv[0]}" in err  # the command's usage, not the top-level one


def test_misspelled_option_gets_a_suggestion(capsys):
    err = err_of(capsys, ["generate", "x", "-p", "hi", "--temprature", "0"])
    assert "did you mean --temperature" in err, err


@pytest.mark.parametrize("command, argv", [
    ("export", ["export", "deepseek-ai/DeepSeek-V2-Lite", "-o", "out/v2lite"]),
    ("export", ["export", "--model", "deepseek-ai/DeepSeek-V2-Lite", "-o", "out/v2lite"]),
    ("generate", ["generate", "deepseek-ai/DeepSeek-V2-Lite", "-p", "hi"]),
    ("serve", ["serve", "deepseek-ai/DeepSeek-V2-Lite"]),
])
def test_hub_id_says_download_first(capsys, tmp_path, monkeypatch, command, argv):
    monkeypatch.chdir(tmp_path)  # no such directory here
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "hf download deepseek-ai/DeepSeek-V2-Lite --local-dir DeepSeek-V2-Lite" in err, err
    assert "then pass" in err


def _parse(command, argv):
    from mla_export.cli.main import _command

    parser = argparse.ArgumentParser(prog="mla-export")
    sub = parser.add_subparsers(dest="command")
    _command(command).add_parser(sub)
    return parser.parse_args([command, *argv])


def test_vllm_serve_aliases_map_to_the_native_options():
    a = _parse("serve", ["--model", "out/x", "--dtype", "float32", "--no-enable-prefix-caching",
                         "--trust-remote-code", "--uvicorn-log-level", "warning"])
    assert (a.model_opt, a.precision, a.no_prefix_caching, a.log_level) == ("out/x", "f32", True, "warning")
    a = _parse("serve", ["out/x", "--dtype", "bfloat16", "--enable-prefix-caching"])
    assert (a.out_dir, a.precision, a.no_prefix_caching) == ("out/x", "bf16", False)
    a = _parse("serve", ["out/x"])
    assert (a.precision, a.no_prefix_caching, a.kv_cache_dtype) == ("bf16", False, "auto")
    with pytest.raises(SystemExit):
        _parse("serve", ["out/x", "--dtype", "half"])


def test_serve_kv_cache_dtype_must_be_a_cache_format(capsys, tmp_path):
    assert main(["serve", str(tmp_path), "--kv-cache-dtype", "int3"]) == 2
    err = capsys.readouterr().err
    assert "--kv-cache-dtype int3: not a cache format" in err and "fixed at export" in err


@pytest.mark.parametrize("value,name", [("auto", None), ("fp8", "fp8"), ("fp8_e4m3", "fp8"), ("fp8_e5m2", "e5m2"),
                                        ("bfloat16", "bf16"), ("half", "f16"), ("int8", "int8")])
def test_serve_kv_cache_dtype_takes_our_and_vllms_names(value, name):
    from mla_export.cli.commands.serve import _kv_cache_dtype

    assert _kv_cache_dtype(value) == name


def test_serve_kv_cache_dtype_must_be_the_exports(capsys, exports):
    """The tiny export's cache is f16: asking for fp8 is refused naming both (the cache is fixed at export)."""
    assert main(["serve", str(exports.tiny()), "--kv-cache-dtype", "fp8_e4m3", "--port", "0"]) == 2
    err = capsys.readouterr().err
    assert "was exported with a f16 cache" in err and "--kv-dtype fp8" in err


def test_llama_cpp_generate_aliases_map_to_the_native_options():
    a = _parse("generate", ["-m", "out/x", "-p", "hi", "-n", "7", "--temp", "0.5", "-t", "1", "-s", "3",
                            "-cnv", "-sys", "Be brief.", "--dtype", "float32"])
    assert (a.model_opt, a.prompt, a.max_tokens, a.temperature, a.threads, a.seed, a.chat, a.system, a.precision) \
        == ("out/x", "hi", 7, 0.5, 1, 3, True, "Be brief.", "f32")
    a = _parse("generate", ["out/x", "--prompt", "hi", "--n-predict", "4", "--conversation", "--system-prompt", "s"])
    assert (a.max_tokens, a.chat, a.system) == (4, True, "s")


def test_optimum_export_aliases(tmp_path, capsys):
    from mla_export.checkpoint.presets import make_numpy_checkpoint

    ckpt = make_numpy_checkpoint(tmp_path / "ckpt", seed=5)
    out = tmp_path / "out"
    assert main(["export", "-m", str(ckpt), "--task", "text-generation-with-past", "--trust-remote-code",
                 "-o", str(out), "-q"]) == 0
    assert (out / "mla_graph.json").is_file()
    capsys.readouterr()
    with pytest.raises(SystemExit):
        main(["export", "-m", str(ckpt), "--task", "image-classification", "-o", str(out)])
    assert "invalid choice" in capsys.readouterr().err


_BLOCKED = """
import sys
for name in {names!r}:
    sys.modules[name] = None  # `import name` now raises ModuleNotFoundError, as when not installed
from mla_export.cli import main
code = main({argv!r})
print("exit", code)
"""


@pytest.mark.parametrize("blocked, argv, extra", [
    (["onnx"], ["export", "--preset", "tiny", "-o", "{tmp}/out"], "export"),
    (["tqdm"], ["export", "--preset", "tiny", "-o", "{tmp}/out"], "export"),
    (["onnxruntime"], ["generate", "{model}", "--prompt-ids", "1,2", "--runtime", "onnxruntime"], "onnxruntime"),
    (["uvicorn"], ["serve", "{model}"], "serve"),
])
def test_missing_optional_package_is_one_line_naming_the_extra(tmp_path, tiny_model, blocked, argv, extra):
    argv = [a.format(tmp=tmp_path, model=tiny_model) for a in argv]
    script = textwrap.dedent(_BLOCKED.format(names=blocked, argv=argv))
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=600)
    assert "exit 2" in run.stdout, (run.stdout, run.stderr)
    assert "Traceback" not in run.stderr, run.stderr
    lines = [ln for ln in run.stderr.splitlines() if f"mla-export[{extra}]" in ln]
    assert len(lines) == 1 and blocked[0] in lines[0], run.stderr


@pytest.fixture(scope="module")
def tiny_model(exports):
    return exports.tiny()
