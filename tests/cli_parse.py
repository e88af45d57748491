"""Parse an `mla-export ...` command line with the CLI's own parsers, without running it: what a
documented command asks for (tests/test_readme_commands.py, the export summary's next lines)."""

from __future__ import annotations

import argparse
import importlib
import shlex


def parse_command(line: str) -> tuple[argparse.Namespace, list[str]]:
    """(args, unknown options) of one `mla-export COMMAND ...` line; argparse's own errors
    (a bad value, a missing required option) raise SystemExit as in the CLI."""
    argv = shlex.split(line)
    assert argv[0] == "mla-export", f"not an mla-export command: {line!r}"
    parser = argparse.ArgumentParser(prog="mla-export")
    sub = parser.add_subparsers(dest="command")
    importlib.import_module(f"mla_export.cli.commands.{argv[1]}").add_parser(sub)
    return parser.parse_known_args(argv[1:])
