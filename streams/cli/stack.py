"""`draftgen stack up|down|status`: a local Kafka and S3 (SeaweedFS) that stay up between
commands. `up` starts them once, detached; `run`, the workers and the one-shot commands find
them through the state file (streams/core/stack_state.py) when no `--bootstrap` (or
`DRAFTGEN_BOOTSTRAP`) is given; `down` stops them by their supervisor's PID."""

from __future__ import annotations

import argparse

from streams.cli.flags import add_flags, build
from streams.core.settings import StackSettings

ACTIONS = ("up", "down", "status", "serve")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "action",
        choices=ACTIONS,
        metavar="{up,down,status}",
        help="up: start it (once); down: stop it; status: where it is",
    )
    add_flags(parser, StackSettings)
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from compose.stack import serve_stack, start_stack, starting_supervisor, stop_stack
    from streams.core.stack_state import STATE_FILE, live_stack

    directory = build(StackSettings, args).path
    if args.action == "serve":  # the supervisor itself, started by `up`
        return serve_stack(directory)
    if args.action == "up":
        already = live_stack(directory)
        state = start_stack(directory)
        print(f"stack {'already ' if already else ''}up (supervisor pid {state.pid})")
    elif args.action == "down":
        stopped = stop_stack(directory)
        print(f"stack down (was pid {stopped})" if stopped else "no stack runs")
        return 0
    else:
        found = live_stack(directory)
        if found is None:
            starting = starting_supervisor(directory)
            print(
                f"a stack is starting (supervisor pid {starting}): `draftgen stack up` waits for it"
                if starting
                else "no stack runs: start one with `draftgen stack up`"
            )
            return 1
        state = found
        print(f"stack up (supervisor pid {state.pid})")
    print(f"  kafka   {state.bootstrap}")
    print(f"  s3      {state.s3_endpoint_url}, bucket {state.out.rsplit('/', 1)[0]}/")
    print(f"  state   {directory / STATE_FILE} (credentials there, not printed)")
    print(f"  data    {state.workdir}")
    print("commands without --bootstrap use it; stop it with `draftgen stack down`")
    return 0
