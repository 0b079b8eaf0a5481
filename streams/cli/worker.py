"""`draftgen worker generate|tokenize`: one pipeline worker (a Faust app) in this process."""

from __future__ import annotations

import argparse
import asyncio
from collections.abc import Callable
from typing import Any

from streams.cli.flags import add_flags, add_settings_file_flag, build, settings_file
from streams.core.errors import CliError
from streams.core.retry import short_error
from streams.core.settings import (
    GenerateSettings,
    ObserveSettings,
    OnceSettings,
    TokenizeSettings,
)


def add_arguments(worker: argparse.ArgumentParser) -> None:
    workers = worker.add_subparsers(dest="worker", required=True, parser_class=type(worker))
    generate = workers.add_parser(
        "generate", help="one generation worker bound to one SGLang server"
    )
    add_settings_file_flag(generate)
    add_flags(generate, GenerateSettings)
    add_flags(generate, OnceSettings)
    add_flags(generate, ObserveSettings)
    generate.set_defaults(handler=run_generate)
    tokenize = workers.add_parser("tokenize", help="completions → Arrow shards for one dataset")
    add_tokenize_flags(tokenize)
    tokenize.set_defaults(handler=run_tokenize)


def add_tokenize_flags(parser: argparse.ArgumentParser) -> None:
    add_settings_file_flag(parser)
    add_flags(parser, TokenizeSettings)
    add_flags(parser, ObserveSettings)


def run_generate(args: argparse.Namespace) -> int:
    file = settings_file(args)
    settings = build(GenerateSettings, args, base=file.get("generate"))
    once = build(OnceSettings, args, base=file.get("once"))
    observe = build(ObserveSettings, args, base=file.get("observe"))
    # the worker's own imports (faust, aiokafka) after its settings: a bad one is said at once
    from streams.core.faust_app import run_worker
    from streams.core.topics import prepare_topics
    from streams.generate.app import build_generate_app

    # the replication resolved for this cluster (for faust's own topics too), and the topics'
    # own message limit: the idempotent producer cannot get past a batch the broker refused
    settings = settings.model_copy(update={"kafka": asyncio.run(prepare_topics(settings.kafka))})
    app, worker = build_generate_app(settings, observe, once)
    try:
        run_worker(app, args.log_level)
    except SystemExit:
        if worker.refused is None:
            raise
    if worker.refused is not None:  # its server serves another model than the run's
        raise CliError(worker.refused)
    return 0


def run_tokenize(
    args: argparse.Namespace,
    check: Callable[[dict[str, Any] | None, TokenizeSettings], dict[str, Any]] | None = None,
) -> int:
    """A tokenize worker; `check(existing manifest, settings)` may refuse the dataset version
    (a CliError) or add to the manifest written at start (replay does both)."""
    file = settings_file(args)
    settings = build(TokenizeSettings, args, base=file.get("tokenize"))
    observe = build(ObserveSettings, args, base=file.get("observe"))
    from sinks.shards import ShardStore
    from streams.core.faust_app import run_worker
    from streams.core.memory import limit_malloc_arenas
    from streams.core.tokenizers import load_tokenizer
    from streams.core.topics import prepare_topics
    from streams.tokenize.app import build_tokenize_app, manifest

    limit_malloc_arenas()  # before the tokenizer's and the worker's threads
    loaded = load_tokenizer(settings.tokenizer_dir, settings.chat_template_file, settings.family)
    out = settings.storage.out
    try:
        store = ShardStore(out, settings.dataset, settings.storage.storage_options())
    except ValueError as err:
        raise CliError(f"--out {out}: {err}") from None
    info = manifest(settings, loaded)
    try:
        if store.fenced():
            raise CliError(
                f"dataset version {settings.dataset} is sealed: a worker must not change it; "
                "`draftgen replay --dataset NEW` builds a new version from the completions"
            )
        if check is not None:
            info |= check(store.manifest(), settings)
        store.write_manifest(info)
    except CliError:
        raise
    except Exception as err:
        raise CliError(f"cannot write to {store.url}: {short_error(err)}") from None
    settings = settings.model_copy(update={"kafka": asyncio.run(prepare_topics(settings.kafka))})
    app, worker = build_tokenize_app(settings, loaded, store, observe)
    try:
        run_worker(app, args.log_level)
    except SystemExit:
        if worker.sink.sealed is None:
            raise
    # stopped because the version was sealed under it (the line is in its log): not a success
    return 1 if worker.sink.sealed is not None else 0
