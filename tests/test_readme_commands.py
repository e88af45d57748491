"""The README's commands cannot drift from the code: every `mla-export ...` command in its shell
blocks parses with the CLI's own parsers (no unknown option, valid values), the extras it
installs exist, its two start commands are the ones CI and tools/check_fresh_install.sh run, its
HTTP examples name routes the server has, its Python blocks compile and import names the package
exports, and its figures and links point at files that exist. Nothing heavy runs here (the
quickstart itself was run by hand as a newcomer: see the commit that added this file)."""

from __future__ import annotations

import ast
import json
import re
import shlex
from pathlib import Path

import pytest

from cli_parse import parse_command

REPO = Path(__file__).resolve().parent.parent
README = (REPO / "README.md").read_text()


def _blocks(lang: str) -> list[str]:
    return re.findall(rf"```{lang}\n(.*?)```", README, flags=re.S)


def _shell_commands() -> list[str]:
    """Each command of the bash blocks: continuation lines joined, `&&` chains split, comments cut."""
    out = []
    for block in _blocks("bash"):
        for line in block.replace("\\\n", " ").splitlines():
            line = line.split(" #")[0].strip()
            out += [part.strip() for part in line.split(" && ") if part.strip()]
    return out


MLA_COMMANDS = [c for c in _shell_commands() if c.startswith("mla-export ")]


def test_the_readme_has_the_commands_this_file_checks():
    subcommands = {shlex.split(c)[1] for c in MLA_COMMANDS}
    assert {"export", "generate", "serve"} <= subcommands, MLA_COMMANDS
    assert any("--weight-format int8" in c for c in MLA_COMMANDS)


@pytest.mark.parametrize("command", MLA_COMMANDS)
def test_every_mla_export_command_parses(command):
    try:
        args, unknown = parse_command(command)
    except SystemExit as e:  # argparse refused a value or a missing option: the README is wrong
        pytest.fail(f"README command does not parse ({e}): {command}")
    assert not unknown, f"README command has options the CLI does not know: {unknown} in {command}"


def test_inline_commands_in_prose_parse():
    """`mla-export ...` spans in the README's text (not only its code blocks)."""
    from mla_export.cli.main import COMMANDS

    spans = [s for s in re.findall(r"`(mla-export [^`]+)`", README)
             if len(s.split()) > 2 and s.split()[1] in COMMANDS]
    assert len(spans) >= 4, spans
    for span in spans:
        for part in span.split(";"):
            part = part.strip()
            if part.startswith("mla-export "):
                args, unknown = parse_command(part.split(" (or ")[0])
                assert not unknown, (unknown, part)


def test_extras_the_readme_installs_exist():
    extras = set(pytest.importorskip("tomllib").loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"])
    named = {e for c in _shell_commands() for group in re.findall(r'(?:\.|mla-export)\[([a-z,]+)\]', c)
             for e in group.split(",")}
    assert {"export", "serve"} <= named <= extras, (named, extras)


def _steps(text: str) -> list[str]:
    """A command chain's steps without pip's and pytest's quiet / cache flags (what CI adds)."""
    steps = []
    for part in text.split(" && "):
        words = [w for w in shlex.split(part) if w != "-q"]
        if "-p" in words:  # pytest -p no:cacheprovider
            i = words.index("-p")
            del words[i:i + 2]
        steps.append(words)
    return steps


def test_the_test_command_is_what_ci_runs():
    readme_cmd = next(c for c in _blocks("bash") if "pytest" in c).strip()
    ci = (REPO / ".ci" / "run").read_text()
    ci_cmd = next(line for line in ci.splitlines() if "pytest" in line and "pip install" in line)
    assert _steps(readme_cmd)[2:] == _steps(ci_cmd), (readme_cmd, ci_cmd)  # after the venv and activate steps


def test_the_first_command_is_what_check_fresh_install_runs():
    first = _blocks("bash")[0].strip()
    assert first.startswith("python3 -m venv .venv && ") and "--preset tiny" in first
    script = (REPO / "tools" / "check_fresh_install.sh").read_text()
    install = _steps(first)[2]
    assert install[:3] == ["pip", "install", "-e"]
    assert f'install -q -e "{install[3]}"' in script  # the same extras
    for step in _steps(first)[3:]:  # export --preset tiny, generate: same subcommand and main options
        sub = step[1]
        line = next(ln for ln in script.splitlines() if f"mla-export\" {sub} " in ln)
        assert all(w in line for w in step if w.startswith("--") and w != "--max-tokens"), (step, line)


def test_http_examples_use_routes_the_server_has():
    app = (REPO / "mla_export" / "server" / "app.py").read_text()
    curls = [c for c in _shell_commands() if c.startswith("curl ")]
    assert curls
    for c in curls:
        words = shlex.split(c)
        path = "/" + next(w for w in words if w.startswith("localhost:")).split("/", 1)[1]
        assert f'Route("{path}"' in app, path
        body = json.loads(words[words.index("-d") + 1])
        assert body["model"] == _served_name()


def _served_name() -> str:
    serve = next(c for c in MLA_COMMANDS if shlex.split(c)[1] == "serve")
    return parse_command(serve)[0].served_model_name


def test_python_blocks_compile_and_import_what_exists():
    import mla_export

    blocks = _blocks("python")
    assert blocks
    for block in blocks:
        tree = ast.parse(block)
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module == "mla_export":
                for alias in node.names:
                    assert hasattr(mla_export, alias.name), alias.name
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value.startswith("v2"):
                assert node.value == _served_name()  # the openai client asks for the served name


def test_links_and_figures_exist():
    for target in re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", README):
        if not target.startswith("http"):
            assert (REPO / target).exists(), target
