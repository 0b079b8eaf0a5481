"""`draftgen publish`: prompt sources → the prompts topic."""

from __future__ import annotations

import argparse
import asyncio
from typing import Any

from streams.cli.flags import add_flags, build
from streams.core.errors import CliError
from streams.core.settings import KafkaSettings, PublishSettings, StorageSettings


def add_arguments(parser: argparse.ArgumentParser) -> None:
    # the registered source formats (built only for this command: publish reads them anyway)
    from producers.sources import SOURCE_FORMATS

    extensions = ", ".join(fmt.extensions[0] for fmt in SOURCE_FORMATS.values())
    parser.add_argument(
        "sources",
        nargs="*",
        help=f"files ({extensions}; compressed too), directories or globs of them, "
        "on a path or URL; hf:NAME[:SPLIT]; each optionally PATH:WEIGHT",
    )
    add_flags(parser, PublishSettings)
    add_flags(parser, KafkaSettings)
    parser.set_defaults(handler=run)


def source_specs(sources: list[str]) -> list[Any]:
    """The sources named on the command line; none: the bundled sample prompts."""
    from producers.sources import bundled_sample_path, parse_source_spec

    try:
        return [parse_source_spec(s) for s in (sources or [str(bundled_sample_path())])]
    except ValueError as err:
        raise CliError(str(err)) from None


def recipe_sources(
    sources: list[str], settings: PublishSettings, thinking_kwarg: Any = False
) -> tuple[str, list[Any]]:
    """(recipe name, the sources with their recipes): the named sources, else the recipe
    file's, else the bundled samples; a recipe that cannot be used is one line."""
    from producers.recipes import RecipeError, load_recipe, parse_source_recipe, with_recipes

    try:
        recipe = load_recipe(settings.recipe) if settings.recipe else None
        overrides = [parse_source_recipe(text) for text in settings.source_recipe]
        named = source_specs(sources) if sources or not (recipe and recipe.sources) else []
        return with_recipes(named, recipe, overrides, thinking_kwarg)
    except RecipeError as err:
        raise CliError(str(err)) from None


def cleaner_of(settings: PublishSettings, storage_options: dict[str, Any]) -> Any:
    """The publish's PromptCleaner (producers/clean.py); an evaluation set that cannot be read
    is one line."""
    from producers.clean import load_cleaner

    try:
        return load_cleaner(
            settings.dedup_text,
            settings.decontaminate,
            settings.contamination_ngram,
            storage_options,
            settings.near_duplicates,
        )
    except (OSError, ValueError) as err:
        raise CliError(f"--decontaminate: {err}") from None


def run(args: argparse.Namespace) -> int:
    from producers.publish import publish

    settings = build(PublishSettings, args)
    storage = StorageSettings(out="s3://").storage_options()
    recipe, specs = recipe_sources(args.sources, settings)
    summary = asyncio.run(
        publish(
            build(KafkaSettings, args),
            specs,
            settings.limit,
            # sources may be on S3: the same credentials as the output
            storage,
            settings.progress,
            regen=settings.regen,
            regenerate=settings.regenerate,
            id_field=settings.id_field,
            cleaner=cleaner_of(settings, storage),
            recipe_name=recipe,
        )
    )
    print(summary.line())
    return 0
