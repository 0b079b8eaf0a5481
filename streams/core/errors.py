"""Errors every layer may raise to the command line."""

from __future__ import annotations


class CliError(Exception):
    """A user-facing failure: printed as one line by the command line, exit status 2."""
