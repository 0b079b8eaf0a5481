"""`python -m compose.emulator --tokenizer-dir DIR ...`: the flags of `draftgen emulate-server`."""

from __future__ import annotations

import argparse

from compose.emulator import add_emulator_arguments, run, settings_from_args


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m compose.emulator", description=__doc__)
    add_emulator_arguments(parser)
    run(settings_from_args(parser.parse_args(argv)))


if __name__ == "__main__":
    main()
