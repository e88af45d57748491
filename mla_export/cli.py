"""Export and run DeepSeek-style MLA models on CPU with a paged latent KV cache.

One command, one module per subcommand (mla_export/commands/<name>.py, each with
add_parser(subparsers) and run(args) -> exit code), imported only when chosen so that
`generate` and `serve` never import the exporter's torch."""

from __future__ import annotations

import argparse
import importlib
import sys

COMMANDS = {
    "export": "export a DeepSeek-V2/V3 checkpoint to ONNX / OpenVINO IR with the paged latent cache",
    "generate": "generate text from an exported model directory",
    "serve": "serve an exported model with an OpenAI-compatible HTTP API",
    "ovms": "lay out an OpenVINO Model Server repository from an export directory",
    "bench": "end-to-end benchmark against transformers and optimum-intel",
}


def _command(name: str):
    return importlib.import_module(f"mla_export.commands.{name}")


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(prog="mla-export", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    # Only the chosen subcommand's module is imported (help lists them all by name).
    chosen = next((a for a in argv if not a.startswith("-")), None)
    for name, help_text in COMMANDS.items():
        if name == chosen:
            try:
                _command(name).add_parser(sub)
            except ModuleNotFoundError as e:
                if e.name and e.name.startswith("mla_export.commands"):
                    print(f"mla-export: the '{name}' command is not available in this build", file=sys.stderr)
                    return 2
                raise
        else:
            sub.add_parser(name, help=help_text, add_help=False)
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 2
    return int(_command(args.command).run(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
