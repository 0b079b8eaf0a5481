"""`draftgen run --recipe FILE` on the bundled prompts: one fleet of generate workers serves a
mixed recipe, and every sample says in its provenance what made it: the recipe's name, its
source's temperature, its thinking mode (a 70/30 mix decided per sample), and for the source
that asks for two answers per prompt, two samples with their own ids and seeds."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import orjson
import pytest

from producers import bundled_sample_path
from sinks.reader import DatasetReader
from streams.core.normalize import make_prompt_record
from streams.core.recipes import sample_id, thinking_for

pytestmark = pytest.mark.integration

RECIPE = """
name = "mix"

[defaults]
thinking = 0.7
top_p = 0.95
seed = 100

[[sources]]
path = "code.jsonl"
temperature = 0.6
samples = 2

[[sources]]
path = "chat.jsonl"
temperature = 1.0
"""


def test_a_recipe_run_gives_samples_that_show_their_thinking_mix_and_sampling(
    pipeline, tmp_path: Path
) -> None:
    lines = bundled_sample_path().read_bytes().splitlines()
    files = {"code.jsonl": lines[:6], "chat.jsonl": lines[6:14]}
    temperatures, samples = {"code.jsonl": 0.6, "chat.jsonl": 1.0}, {"code.jsonl": 2}
    expected: dict[str, tuple[str, float, int]] = {}  # sample id → source, temperature, seed
    for name, rows in files.items():
        (tmp_path / name).write_bytes(b"\n".join(rows) + b"\n")
        for line in rows:
            prompt_id = make_prompt_record(orjson.loads(line), name).prompt_id
            for k in range(samples.get(name, 1)):
                expected[sample_id(prompt_id, k)] = (name, temperatures[name], 100 + k)
    recipe = tmp_path / "mix.toml"
    recipe.write_text(RECIPE)

    done = pipeline.draftgen(
        *("run", "--recipe", str(recipe), "--out", pipeline.out, "--dataset", "mixed"),
        *pipeline.common,
        timeout=600,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "recipe mix" in done.stdout, done.stdout

    table = DatasetReader(pipeline.store("mixed")).table(["prompt_id", "source", "provenance"])
    rows = table.to_pylist()
    assert sorted(r["prompt_id"] for r in rows) == sorted(expected)
    thinking: Counter[bool] = Counter()
    for row in rows:
        made = orjson.loads(row["provenance"])
        source, temperature, seed = expected[row["prompt_id"]]
        assert row["source"] == source
        assert made["recipe"] == "mix"
        sampling = made["sampling"]
        assert (sampling["temperature"], sampling["top_p"], sampling["seed"]) == (
            temperature,
            0.95,
            seed,
        )
        # the bundled tokenizer is Qwen3.6's: its switch is `enable_thinking`
        assert sampling["chat_template_kwargs"] == {"enable_thinking": made["thinking"]}
        assert made["thinking"] == thinking_for(row["prompt_id"], 0.7)
        assert made["served"]["kind"] == "sglang" and made["served"]["version"]
        assert len(made["tokenizer_sha256"]) == len(made["chat_template_sha256"]) == 64
        thinking[made["thinking"]] += 1
    assert thinking[True] and thinking[False], thinking  # both modes, from one fleet
