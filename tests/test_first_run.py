"""A first run that explains itself (issue 37, part 3): the tiny preset says its weights are random
(at export and at generate, from export.random_weights in the contract); the model's text never
reaches the terminal with raw control characters; chat templates render with the base install;
the export summary ends with the commands to run next (and they run)."""

from __future__ import annotations

import json
import shlex
import shutil
import subprocess
import sys
import textwrap
import unicodedata
from pathlib import Path

import pytest

from cli_parse import parse_command
from mla_export.checkpoint.writer import RANDOM_WEIGHTS_NOTE
from mla_export.cli.text import terminal_safe

REPO = Path(__file__).resolve().parent.parent


def _cli(*argv, timeout=600):
    return subprocess.run([sys.executable, "-m", "mla_export.cli", *map(str, argv)], cwd=REPO,
                          capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """(export dir, the export command's stdout): `mla-export export --preset tiny`, as typed."""
    out = tmp_path_factory.mktemp("first-run") / "tiny"
    proc = _cli("export", "--preset", "tiny", "-o", out, "-q")
    assert proc.returncode == 0, proc.stderr
    return out, proc.stdout


class TestRandomWeightsAreSaid:
    """The tiny preset (and every random-weight checkpoint writer) marks its weights, the export
    records the mark, and both export and generate say that the text is noise."""

    def test_the_preset_export_records_random_weights(self, tiny):
        out, _ = tiny
        contract = json.loads((out / "mla_graph.json").read_text())
        assert contract["export"]["random_weights"] is True

    def test_the_export_summary_says_so(self, tiny):
        _, stdout = tiny
        assert f"note: {RANDOM_WEIGHTS_NOTE}" in stdout.splitlines()

    def test_generate_says_so_on_stderr_and_keeps_stdout_for_the_text(self, tiny):
        out, _ = tiny
        proc = _cli("generate", out, "--prompt", "Hello", "--max-tokens", "4")
        assert proc.returncode == 0, proc.stderr
        assert f"mla-export generate: note: {RANDOM_WEIGHTS_NOTE}" in proc.stderr.splitlines()
        assert "random" not in proc.stdout

    def test_chat_says_so_before_the_first_reply(self, tiny):
        out, _ = tiny
        proc = subprocess.run([sys.executable, "-m", "mla_export.cli", "chat", str(out), "-p", "Hi", "-st", "-n", "4"],
                              cwd=REPO, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=600)
        assert proc.returncode == 0, proc.stderr
        assert f"mla-export chat: note: {RANDOM_WEIGHTS_NOTE}" in proc.stderr.splitlines()

    def test_a_checkpoint_without_the_mark_is_not_called_random(self, exports):
        """transformers' save_pretrained writes no mark: no note (the text may be a real model's)."""
        _, out = exports.model("deepseek_v3")
        assert json.loads((out / "mla_graph.json").read_text())["export"]["random_weights"] is False
        proc = _cli("generate", out, "--prompt-ids", "1,2,3", "--max-tokens", "2")
        assert proc.returncode == 0, proc.stderr
        assert RANDOM_WEIGHTS_NOTE not in proc.stderr

    def test_real_dims_checkpoints_carry_the_mark(self, tmp_path):
        """tools/make_checkpoint.py's shards (mla_export/bench/checkpoint.py) say so in their header."""
        from mla_export.bench.checkpoint import TensorSpec, _header
        from mla_export.checkpoint.reader import CheckpointReader

        spec = TensorSpec("model.norm.weight", (8,), "norm")
        (tmp_path / "model.safetensors").write_bytes(_header([spec], "F32", 4) + bytes(32))
        assert CheckpointReader(tmp_path).random_weights() is True

    def test_a_malformed_mark_in_the_contract_is_refused_by_name(self, tiny, tmp_path):
        from mla_export.formats.contract_error import ContractError
        from mla_export.runtime.model_dir import load_model_dir

        out, _ = tiny
        copy = shutil.copytree(out, tmp_path / "copy")
        contract = json.loads((copy / "mla_graph.json").read_text())
        contract["export"]["random_weights"] = "yes"
        (copy / "mla_graph.json").write_text(json.dumps(contract))
        with pytest.raises(ContractError, match=r"export\.random_weights: expected boolean"):
            load_model_dir(copy)


class TestTerminalText:
    """Control characters in a model's text are escaped before they reach the terminal."""

    @pytest.mark.parametrize("raw, shown", [
        ("a\x1b[2Jb", "a\\x1b[2Jb"), ("bell\x07", "bell\\x07"), ("over\rwrite", "over\\x0dwrite"),
        ("del\x7f", "del\\x7f"), ("c1\x9b", "c1\\x9b"), ("rtl\u202eabc", "rtl\\u202eabc"), ("nul\x00", "nul\\x00"),
    ])
    def test_control_characters_are_escaped(self, raw, shown):
        assert terminal_safe(raw) == shown

    @pytest.mark.parametrize("text", ["line\nnext\ttab", "déjà vu 東京", "\ufffd#\ufffd the0tor",
                                      "family \U0001f468\u200d\U0001f469\u200d\U0001f467", ""])
    def test_printable_text_newlines_and_tabs_pass_unchanged(self, text):
        assert terminal_safe(text) == text

    def test_generate_prints_no_raw_control_character(self, tiny):
        """A sampled continuation of the random model that holds control characters (checked:
        the JSON report's text has some) is printed with them escaped, and is otherwise the same."""
        out, _ = tiny
        args = ["generate", out, "--prompt", "The quick brown fox", "--max-tokens", "160", "--ignore-eos",
                "--temperature", "1.5", "--seed", "3", "--precision", "f32"]
        report = _cli(*args, "--json")
        assert report.returncode == 0, report.stderr
        text = json.loads(report.stdout)["text"]
        raw = [ch for ch in text if unicodedata.category(ch) == "Cc" and ch not in "\n\t"]
        assert raw, f"this seed's text has no control character to escape: {text!r}"
        shown = _cli(*args)
        assert shown.returncode == 0, shown.stderr
        assert not [ch for ch in shown.stdout if unicodedata.category(ch) == "Cc" and ch not in "\n\t"]
        assert shown.stdout == terminal_safe(text) + "\n"


class TestChatTemplatesWithTheBaseInstall:
    """`generate --chat` runs with only the base dependencies importable (every extra's blocked)."""

    def test_jinja2_is_a_base_dependency(self):
        project = pytest.importorskip("tomllib").loads((REPO / "pyproject.toml").read_text())["project"]
        assert any(d.split(">")[0].split("=")[0].strip() == "jinja2" for d in project["dependencies"])

    def test_generate_chat_runs_with_every_extra_blocked(self, tiny):
        out, _ = tiny
        project = pytest.importorskip("tomllib").loads((REPO / "pyproject.toml").read_text())["project"]
        base = {_import_name(d) for d in project["dependencies"]}
        extras = {_import_name(d) for deps in project["optional-dependencies"].values() for d in deps
                  if not d.startswith("mla-export")} - base - {"pytest"}
        script = textwrap.dedent(f"""
            import sys
            for name in {sorted(extras)!r}:
                sys.modules[name] = None  # as if not installed
            from mla_export.cli import main
            sys.exit(main(["generate", {str(out)!r}, "--chat", "--prompt", "Hi", "--max-tokens", "2"]))
        """)
        proc = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=600)
        assert proc.returncode == 0, proc.stderr
        assert "Traceback" not in proc.stderr


def _import_name(requirement: str) -> str:
    """A requirement's import name, for the packages pyproject names (distribution name, lowered)."""
    name = requirement
    for sep in "[<>=!~ ;":
        name = name.split(sep)[0]
    return name.strip().lower().replace("-", "_")


class TestExportSummaryEndsWithTheNextCommand:
    def test_the_last_lines_are_commands_that_run(self, tiny):
        out, stdout = tiny
        lines = stdout.rstrip("\n").splitlines()
        nxt = lines.index("next:")
        commands = [ln.split("#")[0].strip() for ln in lines[nxt + 1:]]
        assert [c.split()[:2] for c in commands] == [["mla-export", "generate"], ["mla-export", "serve"]]
        generate = shlex.split(commands[0])
        assert generate[2] == str(out)
        proc = _cli(*generate[1:])
        assert proc.returncode == 0, proc.stderr
        assert proc.stdout.strip()
        args, unknown = parse_command(commands[1])  # serve: parsed only (it would not return)
        assert not unknown and args.out_dir == str(out)
