"""llama-cli's and optimum-cli's forms that misfired (issue 37): `-f FILE` was answered as `-fa`,
`-st` failed with a seed parse error, `generate --chat` had no --chat-template, there were no
stop strings, `-V` and optimum-cli's positional output were refused. Each on the real tiny
export (`mla-export export --preset tiny -o DIR`, the `exports.tiny()` fixture)."""

from __future__ import annotations

import json

import pytest

from mla_export.cli import main


def gen_json(capsys, *argv) -> dict:
    capsys.readouterr()
    assert main(["generate", *argv, "--json"]) == 0, capsys.readouterr().err
    return json.loads(capsys.readouterr().out)


def tokenize(export, text: str) -> list[int]:
    from tokenizers import Tokenizer

    return Tokenizer.from_file(str(export / "tokenizer.json")).encode(text, add_special_tokens=False).ids


class TestPromptFile:
    """-f FILE: llama-cli reads the prompt from FILE; here it was '-f is not an option ... -fa'."""

    def test_file_prompt_is_the_files_text_less_one_newline(self, exports, tmp_path, capsys):
        export = exports.tiny()
        f = tmp_path / "prompt.txt"
        f.write_text("The first line\nand the second\n", encoding="utf-8")
        for flag in ("-f", "--file"):
            from_file = gen_json(capsys, str(export), flag, str(f), "-n", "4")
            inline = gen_json(capsys, str(export), "-p", "The first line\nand the second", "-n", "4")
            assert from_file["prompt_token_ids"] == inline["prompt_token_ids"]
            assert from_file["token_ids"] == inline["token_ids"]

    def test_file_errors_name_the_file(self, exports, tmp_path, capsys):
        export = exports.tiny()
        assert main(["generate", str(export), "-f", str(tmp_path / "missing.txt")]) == 2
        assert f"-f {tmp_path / 'missing.txt'}: no such file" in capsys.readouterr().err
        (tmp_path / "empty.txt").write_text("")
        assert main(["generate", str(export), "-f", str(tmp_path / "empty.txt")]) == 2
        assert "the file is empty" in capsys.readouterr().err
        (tmp_path / "bin.txt").write_bytes(b"\xff\xfe\x00")
        assert main(["generate", str(export), "-f", str(tmp_path / "bin.txt")]) == 2
        assert "not UTF-8 text" in capsys.readouterr().err

    def test_fa_still_gets_its_hint(self, capsys):
        with pytest.raises(SystemExit):
            main(["generate", "x", "-p", "hi", "-fa"])
        assert "-fa is not an option of `mla-export generate`" in capsys.readouterr().err


class TestSingleTurn:
    """-st (llama-cli's --single-turn) parsed as -s with the value 't': 'invalid int value'."""

    def test_st_is_one_chat_turn(self, exports, capsys):
        export = exports.tiny()
        st = gen_json(capsys, str(export), "-p", "hi", "-st", "-n", "3")
        chat = gen_json(capsys, str(export), "-p", "hi", "--chat", "-n", "3")
        assert st["prompt_token_ids"] == chat["prompt_token_ids"]
        assert st["prompt_token_ids"] != gen_json(capsys, str(export), "-p", "hi", "-n", "3")["prompt_token_ids"]
        assert gen_json(capsys, str(export), "-p", "hi", "--single-turn", "-n", "3")["prompt_token_ids"] \
            == chat["prompt_token_ids"]


class TestChatTemplate:
    """generate --chat asked for a template but had no option to give one."""

    def test_template_text_and_file(self, exports, tmp_path, capsys):
        export = exports.tiny()
        template = "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}{% endfor %}|"
        ids = gen_json(capsys, str(export), "-p", "hi", "--chat", "--chat-template", template,
                       "-n", "2")["prompt_token_ids"]
        assert ids == tokenize(export, "<user>hi|")
        f = tmp_path / "t.jinja"
        f.write_text(template)
        assert gen_json(capsys, str(export), "-p", "hi", "--chat", "--chat-template", str(f),
                        "-n", "2")["prompt_token_ids"] == ids

    def test_template_without_chat_or_missing_file_is_refused(self, exports, tmp_path, capsys):
        export = exports.tiny()
        assert main(["generate", str(export), "-p", "hi", "--chat-template", "{{ x }}"]) == 2
        assert "--chat-template is used only with --chat" in capsys.readouterr().err
        assert main(["generate", str(export), "-p", "hi", "--chat", "--chat-template", str(tmp_path / "no")]) == 2
        assert "chat template file not found" in capsys.readouterr().err


class TestStopStrings:
    """--stop TEXT (repeatable): the output ends before the first stop string."""

    def test_output_is_cut_before_the_stop_string(self, exports, capsys):
        export = exports.tiny()
        full = gen_json(capsys, str(export), "-p", "Once upon", "-n", "24", "--ignore-eos")["text"]
        stop = next(full[i:i + 2] for i in range(4, len(full) - 2) if full[i:i + 2].isprintable()
                    and full[i:i + 2].strip() == full[i:i + 2])
        cut = gen_json(capsys, str(export), "-p", "Once upon", "-n", "24", "--ignore-eos", "--stop", stop,
                       "--stop", "never-in-this-output")
        assert cut["text"] == full[:full.index(stop)] and cut["finish_reason"] == "stop"
        capsys.readouterr()
        assert main(["generate", str(export), "-p", "Once upon", "-n", "24", "--ignore-eos", "--stop", stop]) == 0
        assert capsys.readouterr().out.rstrip("\n").endswith(full[:full.index(stop)][-3:].rstrip("\n"))


class TestVersionShortFlag:
    def test_V(self, capsys):
        with pytest.raises(SystemExit) as e:
            main(["-V"])
        assert e.value.code == 0 and capsys.readouterr().out.startswith("mla-export ")


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    from mla_export.checkpoint.presets import make_numpy_checkpoint

    return make_numpy_checkpoint(tmp_path_factory.mktemp("pos") / "ckpt", seed=5)


class TestPositionalOutput:
    """optimum-cli's `export MODEL OUTDIR` (and `--model MODEL OUTDIR`) were refused: -o was required."""

    @pytest.mark.parametrize("form", [
        ["{ckpt}", "{out}"],
        ["{ckpt}", "--kv-dtype", "f32", "{out}"],  # an option between: argparse leaves OUTDIR over
        ["--model", "{ckpt}", "{out}"],
        ["--preset", "tiny", "{out}"],
        ["{ckpt}", "{out}", "-o", "{out}"],  # the same directory twice is fine
    ])
    def test_forms(self, ckpt, tmp_path, form):
        out = tmp_path / "out"
        argv = ["export", *[a.format(ckpt=ckpt, out=out) for a in form], "-q"]
        assert main(argv) == 0
        assert (out / "mla_graph.json").is_file()

    def test_conflicts_and_missing_are_refused(self, ckpt, tmp_path, capsys):
        assert main(["export", str(ckpt), str(tmp_path / "a"), "-o", str(tmp_path / "b"), "-q"]) == 2
        assert "give the export directory once" in capsys.readouterr().err
        assert main(["export", str(ckpt), "-q"]) == 2
        assert "give the export directory" in capsys.readouterr().err
        assert main(["export", str(ckpt), str(tmp_path / "a"), "stray", "-q"]) == 2
        assert "unexpected argument(s): stray" in capsys.readouterr().err
        assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()
