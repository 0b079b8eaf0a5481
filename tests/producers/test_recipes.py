"""Recipes (producers/recipes.py): per-source sampling, thinking, samples, regen and id field
from a TOML file and the command line; refused in one line when they cannot be used; each
prompt becomes its samples, ids deterministic from the prompt and the index."""

from __future__ import annotations

from pathlib import Path

import pytest

from producers.recipes import (
    RecipeError,
    load_recipe,
    parse_source_recipe,
    samples_of,
    source_recipe,
    with_recipes,
)
from producers.sources import SourceSpec
from streams.core.normalize import make_prompt_record
from streams.core.recipes import Policy
from streams.core.records import PromptRecord

RECIPE = """
name = "kimi-k26-mix"

[defaults]
thinking = 0.7
top_p = 0.95

[[sources]]
path = "code.jsonl"
temperature = 0.6
samples = 2
weight = 2

[[sources]]
path = "chat.jsonl"
temperature = 1.0
id_field = "uuid"
regen = "every-turn"
"""


def write(tmp_path: Path, text: str = RECIPE) -> str:
    path = tmp_path / "mix.toml"
    path.write_text(text)
    return str(path)


def test_a_recipe_files_sources_get_the_defaults_then_their_own_keys(tmp_path: Path) -> None:
    name, specs = with_recipes([], load_recipe(write(tmp_path)), [])
    assert name == "kimi-k26-mix"
    code, chat = specs
    assert code.path == str(tmp_path / "code.jsonl") and code.weight == 2  # beside the file
    assert code.recipe.sampling == {"top_p": 0.95, "temperature": 0.6}
    assert code.recipe.samples == 2 and code.recipe.thinking == 0.7
    assert chat.recipe.sampling == {"top_p": 0.95, "temperature": 1.0}
    assert (chat.recipe.id_field, chat.recipe.regen, chat.recipe.samples) == (
        "uuid",
        "every-turn",
        1,
    )


def test_the_command_line_overrides_a_source_and_names_only_published_ones(
    tmp_path: Path,
) -> None:
    override = parse_source_recipe("code.jsonl:temperature=0.2,thinking=false,top_k=20")
    _, specs = with_recipes([], load_recipe(write(tmp_path)), [override])
    assert specs[0].recipe.sampling == {"top_p": 0.95, "temperature": 0.2, "top_k": 20}
    assert specs[0].recipe.thinking is False and specs[0].recipe.samples == 2
    assert specs[1].recipe.sampling["temperature"] == 1.0  # the other source untouched
    # without a file: the named sources, the recipe called after the command line
    mine = parse_source_recipe("x.jsonl:top_p=0.9")
    name, only = with_recipes([SourceSpec("/data/x.jsonl")], None, [mine])
    assert name == "command-line" and only[0].recipe.sampling == {"top_p": 0.9}
    with pytest.raises(RecipeError, match="no source of that name"):
        with_recipes([SourceSpec("/data/x.jsonl")], None, [parse_source_recipe("y.jsonl:top_p=1")])


def test_sources_named_on_the_command_line_take_the_files_entry_of_their_name(
    tmp_path: Path,
) -> None:
    _, specs = with_recipes([SourceSpec("/elsewhere/code.jsonl")], load_recipe(write(tmp_path)), [])
    assert [s.path for s in specs] == ["/elsewhere/code.jsonl"]
    assert specs[0].recipe.samples == 2 and specs[0].weight == 2


@pytest.mark.parametrize(
    ("table", "message"),
    [
        ({"tempreature": 0.6}, "tempreature is not a recipe key"),
        ({"top_p": 1.5}, "top_p = 1.5: must be in (0, 1]"),
        ({"top_k": 0}, "top_k = 0: must be -1 (off) or ≥ 1"),
        ({"repetition_penalty": 0}, "repetition_penalty = 0: must be in (0, 2]"),
        ({"thinking": 1.5}, "a share must be in [0, 1]"),
        ({"samples": 0}, "samples = 0"),
        ({"regen": "all"}, "regen = 'all'"),
    ],
)
def test_what_no_server_accepts_is_refused_in_one_line(table: dict, message: str) -> None:
    with pytest.raises(RecipeError) as caught:
        source_recipe(table, "code.jsonl")
    assert message in str(caught.value) and "\n" not in str(caught.value)
    assert str(caught.value).startswith("code.jsonl: ")


def test_thinking_off_for_a_family_without_a_switch_is_refused(tmp_path: Path) -> None:
    recipe = load_recipe(write(tmp_path))
    with pytest.raises(RecipeError, match="has no thinking switch"):
        with_recipes([], recipe, [], thinking_kwarg=None)
    with_recipes([], recipe, [], thinking_kwarg="thinking")  # a family with one


def test_a_bad_file_is_one_line(tmp_path: Path) -> None:
    with pytest.raises(RecipeError, match="is not TOML"):
        load_recipe(write(tmp_path, "name = "))
    with pytest.raises(RecipeError, match="a source needs a path"):
        load_recipe(write(tmp_path, "[[sources]]\ntemperature = 1.0\n"))
    with pytest.raises(RecipeError, match="cannot read"):
        load_recipe(str(tmp_path / "missing.toml"))


def test_samples_have_their_own_ids_seeds_and_a_thinking_mix_near_its_share() -> None:
    recipe = source_recipe({"samples": 3, "seed": 7, "thinking": 0.3, "temperature": 0.6}, "s")
    records = [
        make_prompt_record({"messages": [{"role": "user", "content": f"q{i}"}]}, "s", {})
        for i in range(400)
    ]
    samples = [s for r in records for s in samples_of(r, "mix", recipe)]
    first = samples_of(records[0], "mix", recipe)
    assert [s.prompt_id for s in first] == [
        records[0].prompt_id,
        f"{records[0].prompt_id}~1",
        f"{records[0].prompt_id}~2",
    ]
    assert [Policy.from_dict(s.policy).sampling["seed"] for s in first] == [7, 8, 9]
    assert samples_of(records[0], "mix", recipe) == first  # deterministic
    thinking = [Policy.from_dict(s.policy).thinking for s in samples]
    assert 0.25 < sum(thinking) / len(thinking) < 0.35  # 1,200 samples at a share of 0.3
    assert all(Policy.from_dict(s.policy).recipe == "mix" for s in samples)
    assert len({s.prompt_id for s in samples}) == 1200


def test_a_sources_gate_is_merged_over_the_defaults_and_carried_by_its_samples(
    tmp_path: Path,
) -> None:
    recipe_file = tmp_path / "r.toml"
    recipe_file.write_text(
        '[defaults]\ngate = { repetition = "flag", think_markers = "keep" }\n'
        '[[sources]]\npath = "a.jsonl"\ngate = { repetition = "drop" }\n'
    )
    recipe = load_recipe(str(recipe_file))
    _, [spec] = with_recipes([], recipe, [])
    assert spec.recipe is not None
    assert spec.recipe.gate == {"repetition": "drop", "think_markers": "keep"}
    record = PromptRecord("p", [{"role": "user", "content": "hi"}])
    [sample] = samples_of(record, "r", spec.recipe)
    assert sample.policy is not None and sample.policy["gate"] == spec.recipe.gate
    recipe_file.write_text('[defaults]\ngate = { length = "flag" }\n')
    with pytest.raises(RecipeError, match=r"gate.length = 'flag': one of drop, keep"):
        load_recipe(str(recipe_file))
    name, given = parse_source_recipe("code:gate.repetition=flag,temperature=0.6")
    assert (name, given.gate, given.sampling) == (
        "code",
        {"repetition": "flag"},
        {"temperature": 0.6},
    )


def test_a_yaml_recipe_is_read_as_the_toml_one(tmp_path: Path) -> None:
    toml = tmp_path / "mix.toml"
    toml.write_text(RECIPE)
    yaml_file = tmp_path / "mix.yaml"
    yaml_file.write_text(
        "name: kimi-k26-mix\n"
        "defaults: {thinking: 0.7, top_p: 0.95}\n"
        "sources:\n"
        "  - {path: code.jsonl, temperature: 0.6, samples: 2, weight: 2}\n"
        "  - {path: chat.jsonl, temperature: 1.0, id_field: uuid, regen: every-turn}\n"
    )
    assert load_recipe(str(yaml_file)) == load_recipe(str(toml))
    yaml_file.write_text("- a list\n")
    with pytest.raises(RecipeError, match=r"mix\.yaml: a recipe is a table"):
        load_recipe(str(yaml_file))
    yaml_file.write_text("name: [unclosed\n")
    with pytest.raises(RecipeError, match=r"mix\.yaml is not YAML: "):
        load_recipe(str(yaml_file))
