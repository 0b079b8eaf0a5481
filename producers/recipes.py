"""Recipes: how each source's prompts are generated, given per source in a TOML (or YAML) file
(`--recipe FILE`) or on the command line (`--source-recipe NAME:KEY=VALUE,...`).

    name = "kimi-k26-mix"          # the recipe's name, in every sample's provenance

    [defaults]                     # every source's, before its own
    thinking = 0.7                 # true, false, or the share of samples that think

    [[sources]]
    path = "code.jsonl"            # relative to the recipe file
    temperature = 0.6
    samples = 2                    # answers per prompt, each its own sample

A source's keys: the sampling parameters of streams/core/recipes.py (`temperature`, `top_p`,
`top_k`, `min_p`, `presence_penalty`, `frequency_penalty`, `repetition_penalty`,
`max_tokens`, `seed`), `thinking`, `samples`, `regen` (`final`, `every-turn`), `weight`,
`id_field`, and `gate`, the tokenize stage's verdict per rule (`gate = { repetition = "flag" }`,
streams/core/recipes.py GATE_RULES). Unset keys are the publish's flags (regen, id field), the
generate workers' flags (sampling, thinking) or the tokenize stage's (gate). Everything is
checked when the recipe is read: a key that is not one, a value out of the servers' range, or
thinking off for a family without a thinking switch is one line before anything is published
(`RecipeError`).

Each prompt then becomes `samples` prompt records (streams/core/recipes.py `sample_id`), each
carrying its policy: the sampling, and thinking decided per sample from its id when the source
asks for a mix.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import ValidationError

from producers.sources import SourceSpec, source_name
from streams.core.recipes import (
    SAMPLING_HELP,
    RecipeError,
    Sampling,
    SourceRecipe,
    sample_id,
    sampling_error,
    thinking_for,
)
from streams.core.records import PromptRecord

# the name of a recipe given only with --source-recipe
COMMAND_LINE = "command-line"


@dataclass(frozen=True)
class Recipe:
    name: str
    defaults: SourceRecipe = field(default_factory=lambda: SourceRecipe.model_validate({}))
    sources: tuple[SourceRecipe, ...] = ()


def source_recipe(table: dict[str, Any], where: str) -> SourceRecipe:
    """A source's table: its sampling parameters gathered and checked, the rest by name."""
    sampling = {k: v for k, v in table.items() if k in SAMPLING_HELP}
    rest = {k: v for k, v in table.items() if k not in SAMPLING_HELP}
    try:
        checked = Sampling.model_validate(sampling).as_dict()
    except ValidationError as err:
        raise RecipeError(f"{where}: {sampling_error(err)}") from None
    try:
        recipe = SourceRecipe.model_validate({**rest, "sampling": checked})
    except ValidationError as err:
        first = err.errors()[0]
        name = ".".join(str(p) for p in first["loc"])
        if first["type"] == "extra_forbidden":
            fields = [k for k in SourceRecipe.model_fields if k != "sampling"]
            known = ", ".join([*SAMPLING_HELP, *fields])
            raise RecipeError(f"{where}: {name} is not a recipe key (one of: {known})") from None
        raise RecipeError(f"{where}: {name} = {first.get('input')!r}: {first['msg']}") from None
    try:
        recipe.thinking_share()  # a share out of range is refused now
    except RecipeError as err:
        raise RecipeError(f"{where}: {err}") from None
    return recipe


def merged(base: SourceRecipe, over: SourceRecipe) -> SourceRecipe:
    """`over`'s keys where it sets them, else `base`'s."""
    given = over.model_dump(exclude_unset=True, exclude={"sampling", "gate"})
    sampling, gate = {**base.sampling, **over.sampling}, {**base.gate, **over.gate}
    return base.model_copy(update={**given, "sampling": sampling, "gate": gate})


def load_recipe(path: str) -> Recipe:
    """A recipe file (TOML, or YAML when it ends in .yaml or .yml: the same keys); its sources'
    relative paths are relative to it."""
    file = Path(path)
    yaml_file = file.suffix.lower() in (".yaml", ".yml")
    try:
        text = file.read_text(encoding="utf-8")
        data = yaml.safe_load(text) if yaml_file else tomllib.loads(text)
    except OSError as err:
        raise RecipeError(f"cannot read {path}: {err.strerror or err}") from None
    except (tomllib.TOMLDecodeError, yaml.YAMLError, UnicodeDecodeError) as err:
        kind = "YAML" if yaml_file else "TOML"
        raise RecipeError(f"{file.name} is not {kind}: {_one_line(str(err))}") from None
    if data is None and yaml_file:
        data = {}
    if not isinstance(data, dict):
        raise RecipeError(f"{file.name}: a recipe is a table of name, defaults and sources")
    unknown = set(data) - {"name", "defaults", "sources"}
    if unknown:
        raise RecipeError(f"{file.name}: unknown top-level key(s) {', '.join(sorted(unknown))}")
    defaults = source_recipe(data.get("defaults") or {}, f"{file.name} [defaults]")
    sources = []
    for index, table in enumerate(data.get("sources") or []):
        where = f"{file.name} sources[{index}]"
        if not isinstance(table, dict) or not table.get("path"):
            raise RecipeError(f"{where}: a source needs a path")
        recipe = source_recipe(table, where)
        source_path = str(recipe.path)
        if not _is_url(source_path) and not Path(source_path).is_absolute():
            recipe = recipe.model_copy(update={"path": str(file.parent / source_path)})
        sources.append(recipe)
    name = data.get("name") or file.stem
    if not isinstance(name, str):
        raise RecipeError(f"{file.name}: name must be a string")
    return Recipe(name, defaults, tuple(sources))


def parse_source_recipe(text: str) -> tuple[str, SourceRecipe]:
    """`NAME:KEY=VALUE[,KEY=VALUE]` → (the source it is for, its recipe); a value is read as
    TOML (`0.6`, `true`, `"every-turn"` or the bare word); `gate.RULE=VERDICT` sets one rule of
    the source's gate."""
    name, sep, pairs = text.rpartition(":")
    if not sep or not name or not pairs:
        raise RecipeError(f"--source-recipe {text!r}: expected SOURCE:KEY=VALUE[,KEY=VALUE]")
    table: dict[str, Any] = {}
    for pair in pairs.split(","):
        key, eq, value = pair.partition("=")
        if not eq or not key.strip():
            raise RecipeError(f"--source-recipe {text!r}: {pair!r} is not KEY=VALUE")
        try:
            parsed = tomllib.loads(f"v = {value.strip()}")["v"]
        except tomllib.TOMLDecodeError:
            parsed = value.strip()
        rule = key.strip().removeprefix("gate.")
        if rule != key.strip():  # gate.RULE=VERDICT: one rule of the source's gate
            table.setdefault("gate", {})[rule] = parsed
        else:
            table[key.strip()] = parsed
    return name, source_recipe(table, f"--source-recipe {name}")


def _one_line(text: str) -> str:
    return " ".join(text.split())


def _is_url(path: str) -> bool:
    return "://" in path or path.startswith("hf:")


def check_family(recipe: SourceRecipe, where: str, thinking_kwarg: str | None) -> None:
    """Thinking off (or a mix) for a family whose template has no switch: refused."""
    share = recipe.thinking_share()
    if thinking_kwarg is None and share is not None and share < 1:
        raise RecipeError(
            f"{where}: thinking = {recipe.thinking}, but the model's family has no thinking "
            "switch in its chat template"
        )


def samples_of(record: PromptRecord, recipe_name: str, recipe: SourceRecipe) -> list[PromptRecord]:
    """The prompt records a prompt becomes: one per sample, each with its policy."""
    share = recipe.thinking_share()
    seed = recipe.sampling.get("seed")
    out = []
    for index in range(recipe.samples):
        own = sample_id(record.prompt_id, index)
        sampling = recipe.sampling if seed is None else {**recipe.sampling, "seed": seed + index}
        policy: dict[str, Any] = {"recipe": recipe_name, "sampling": sampling}
        if recipe.gate:
            policy["gate"] = recipe.gate
        if share is not None:
            policy["thinking"] = share >= 1 or (share > 0 and thinking_for(own, share))
        out.append(replace(record, prompt_id=own, policy=policy))
    return out


def with_recipes(
    specs: list[SourceSpec],
    recipe: Recipe | None,
    overrides: list[tuple[str, SourceRecipe]],
    thinking_kwarg: str | Literal[False] | None = False,
) -> tuple[str, list[SourceSpec]]:
    """(the recipe's name, the sources to publish, each with its recipe): the sources named on
    the command line, else the recipe file's; each gets the defaults, then the file's entry of
    the same source name, then its --source-recipe. `thinking_kwarg` (when the family is known,
    as `run` knows it): its thinking switch, or None for a family without one."""

    if recipe is None and not overrides:
        return "", specs
    recipe = recipe or Recipe(COMMAND_LINE)
    if not specs:
        specs = [SourceSpec(str(s.path), s.weight) for s in recipe.sources]
    by_name = {source_name(SourceSpec(str(s.path))): s for s in recipe.sources}
    named = {source_name(spec) for spec in specs} | {spec.path for spec in specs}
    for name, _ in overrides:
        if name not in named:
            raise RecipeError(f"--source-recipe {name}: no source of that name is published")
    out = []
    for spec in specs:
        own = merged(
            recipe.defaults, by_name.get(source_name(spec), SourceRecipe.model_validate({}))
        )
        for name, override in overrides:
            if name in (source_name(spec), spec.path):
                own = merged(own, override)
        if thinking_kwarg is not False:
            check_family(own, source_name(spec), thinking_kwarg)
        weight = spec.weight if spec.weight is not None else own.weight
        out.append(replace(spec, weight=weight, recipe=own))
    return recipe.name, out
