"""Export and run DeepSeek-style MLA models on CPU with a paged latent KV cache.

One command, one module per subcommand (mla_export/cli/commands/<name>.py, each with
add_parser(subparsers) and run(args) -> exit code), imported only when chosen so that
`generate` and `serve` never import the exporter's dependencies.

Habits from other tools: options that map to something real here are aliases in the
commands' parsers; any other unknown option gets a line naming the nearest equivalent
(`cli_hints`), and a missing optional package a line naming the extra that installs it
(`deps`), instead of argparse's top-level usage line or a traceback."""

from __future__ import annotations

import time

STARTED = time.perf_counter()  # when this module was imported: the fallback of waited_seconds()

import argparse  # noqa: E402
import importlib  # noqa: E402
import sys  # noqa: E402

COMMANDS = {
    "export": "export a DeepSeek-V2/V3 checkpoint to ONNX / OpenVINO IR with the paged latent cache",
    "generate": "generate text from an exported model directory",
    "chat": "chat with an exported model in the terminal (multi-turn, streaming)",
    "serve": "serve an exported model with an OpenAI-compatible HTTP API",
    "verify": "check every byte of an export against the digests recorded at export",
    "ovms": "lay out an OpenVINO Model Server repository from an export directory",
    "bench": "end-to-end benchmark against llama.cpp, vLLM, optimum-intel and transformers",
}
EXIT_USAGE = 2


def _command(name: str):
    return importlib.import_module(f"mla_export.cli.commands.{name}")


def version_text() -> str:
    """`mla-export --version`: the package and the runtime it was built against."""
    from importlib import metadata

    from ..version import __version__

    parts = []
    for dist in ("openvino", "onnxruntime", "tokenizers"):
        try:
            parts.append(f"{dist} {metadata.version(dist)}")
        except metadata.PackageNotFoundError:
            pass
    return f"mla-export {__version__} ({', '.join(parts)})"


def waited_seconds() -> float:
    """Wall time since the process started (interpreter start-up and imports included: what
    the user waited), from /proc; since this module's import where /proc is not there."""
    import os

    try:
        with open("/proc/self/stat") as f:
            fields = f.read().rpartition(")")[2].split()
        with open("/proc/uptime") as f:
            uptime = float(f.read().split()[0])
        return max(uptime - int(fields[19]) / os.sysconf("SC_CLK_TCK"), 0.0)
    except (OSError, ValueError, IndexError):
        return time.perf_counter() - STARTED


def _known_options(parser: argparse.ArgumentParser) -> list[str]:
    return [s for a in parser._actions for s in a.option_strings]


def main(argv: list[str] | None = None) -> int:
    from_argv = argv is None
    argv = sys.argv[1:] if argv is None else argv
    if from_argv and argv[:1] == ["export"]:
        # Ctrl-C / SIGTERM from the first moment of an export: one line and 130/143, never a
        # traceback from an import (mla_export/export/signals.py).
        from ..export.signals import install_first

        install_first()
    parser = argparse.ArgumentParser(prog="mla-export", description=__doc__.splitlines()[0])
    _add_top_level_options(parser)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    # Only the chosen subcommand's module is imported (help lists them all by name).
    chosen = next((a for a in argv if not a.startswith("-")), None)
    chosen_parser = None
    for name, help_text in COMMANDS.items():
        if name == chosen:
            try:
                chosen_parser = _command(name).add_parser(sub)
            except ModuleNotFoundError as e:
                if e.name and e.name.startswith("mla_export.cli.commands"):
                    print(f"mla-export: the '{name}' command is not available in this build", file=sys.stderr)
                    return EXIT_USAGE
                return _missing(e, name)
        else:
            sub.add_parser(name, help=help_text, add_help=False)
    args, extras = parser.parse_known_args(argv)
    if args.command is None:
        parser.print_help()
        return EXIT_USAGE
    try:
        extras = _finish_parsing(args, extras)
    except ValueError as e:
        print(f"mla-export {args.command}: {e}", file=sys.stderr)
        return EXIT_USAGE
    if extras:
        return _unknown(args.command, chosen_parser, extras)
    args.whole_process = from_argv  # the command may own the process's signals until it exits
    from ..deps import MissingDependency

    try:
        return int(_command(args.command).run(args) or 0)
    except MissingDependency as e:
        print(f"mla-export {args.command}: {e}", file=sys.stderr)
        return EXIT_USAGE
    except ModuleNotFoundError as e:
        return _missing(e, args.command)


def _add_top_level_options(parser: argparse.ArgumentParser) -> None:
    # -V: optimum-cli's and pip's spelling of --version
    parser.add_argument("-V", "--version", action="version", version=version_text())


def _finish_parsing(args, extras: list[str]) -> list[str]:
    """A command's `finish_parsing(args, extras)`, where it has one: it settles arguments that
    depend on each other (a ValueError is the user's error, one line) and may claim a positional
    that argparse left over because an option came between it and the one before (`export MODEL
    --weight-format int8 OUT`: argparse fills optional positionals only from their first run);
    it returns the extras it did not claim."""
    finish = getattr(_command(args.command), "finish_parsing", None)
    return finish(args, extras) if finish is not None else extras


def _missing(e: ModuleNotFoundError, command: str) -> int:
    """A missing optional package: one line naming the extra (an unknown one is a real bug)."""
    from ..deps import EXTRA_OF, missing_message

    top = (e.name or "").split(".")[0]
    if top not in EXTRA_OF:
        raise e
    print(f"mla-export {command}: {missing_message(top, f'`mla-export {command}`')}", file=sys.stderr)
    return EXIT_USAGE


def _unknown(command: str, sub_parser, extras: list[str]) -> int:
    from .hints import unknown_option_lines

    known = _known_options(sub_parser) if sub_parser is not None else []
    lines = unknown_option_lines(command, extras, known)
    if not lines:  # only stray positionals
        lines = [f"unexpected argument(s): {' '.join(extras)}"]
    if sub_parser is not None:
        sub_parser.print_usage(sys.stderr)
    for line in lines:
        print(f"mla-export {command}: error: {line}", file=sys.stderr)
    return EXIT_USAGE


if __name__ == "__main__":
    sys.exit(main())
