"""The `mla-export` command line: main.py parses and dispatches, commands/<name>.py is one
subcommand each, hints.py and text.py are what the commands print."""

from .main import main

__all__ = ["main"]
