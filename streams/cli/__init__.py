"""The `draftgen` command line: the parser (streams/cli/main.py) and one module per command."""

from streams.cli.main import main

__all__ = ["main"]
