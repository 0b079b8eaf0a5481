"""Replay after a template fix: a dataset version built with a broken chat template, then
`draftgen replay` with the fixed one builds a new version from the stored completions: same
prompt ids, the correct tokens, nothing regenerated, the earlier version untouched; after
catching up it keeps following new completions."""

from __future__ import annotations

import pytest

from compose.tiny_tokenizers import QWEN36_CHAT_TEMPLATE
from sinks.reader import DatasetReader
from streams.core.tokenizers import load_tokenizer
from streams.tokenize.samples import SampleBuilder
from tests.ids import as_list
from tests.integration.probes import requests_served, topic_size

pytestmark = pytest.mark.integration

# A plausible template bug: the generation prompt and the history's assistant turns lose
# their newline, so every rendered sample is wrong.
BROKEN = QWEN36_CHAT_TEMPLATE.replace(
    "{{- '<|im_start|>assistant\\n' }}", "{{- '<|im_start|>assistant ' }}"
).replace("'<|im_start|>assistant\\n' + content", "'<|im_start|>assistant ' + content")


def test_replay_with_a_fixed_template(pipeline, write_prompts, tmp_path) -> None:
    assert BROKEN != QWEN36_CHAT_TEMPLATE
    broken = tmp_path / "broken.jinja"
    broken.write_text(BROKEN)
    url, _ = pipeline.emulator("--seed", "0")
    generate = pipeline.generate(url)
    rendered = ("--token-source", "rendered")
    v1 = pipeline.tokenize(*rendered, "--chat-template", str(broken), dataset="v1", name="v1")
    expected = set(pipeline.publish(write_prompts(40)).prompt_ids)
    pipeline.wait(expected, [generate, v1], dataset="v1", timeout=90)
    pipeline.assert_exactly_once(expected, dataset="v1")
    v1_markers = sorted(m.encode() for m in pipeline.store("v1").markers())
    served, stored = requests_served(url), topic_size(pipeline.kafka)

    # an earlier version is never overwritten by a replay
    refused = pipeline.draftgen(
        "replay",
        "--tokenizer-dir",
        str(pipeline.tokenizer_dir),
        "--out",
        pipeline.out,
        "--dataset",
        "v1",
        *pipeline.common,
        timeout=60,
    )
    assert refused.returncode == 2 and "already exists" in refused.stderr

    replay = pipeline.replay("v2", *rendered)
    pipeline.wait(expected, [generate, v1, replay], dataset="v2", timeout=90)
    pipeline.assert_exactly_once(expected, dataset="v2")
    assert (requests_served(url), topic_size(pipeline.kafka)) == (served, stored)

    completions = pipeline.completions()
    loaded = load_tokenizer(pipeline.tokenizer_dir)
    correct = SampleBuilder(
        loaded.tokenizer, loaded.profile, prefer="rendered", measure_drift=False
    )
    old = {r["prompt_id"]: r for r in DatasetReader(pipeline.store("v1")).table().to_pylist()}
    new = {r["prompt_id"]: r for r in DatasetReader(pipeline.store("v2")).table().to_pylist()}
    assert set(old) == set(new) == expected
    for prompt_id, row in new.items():
        sample = correct.build(completions[prompt_id])
        assert row["token_source"] == "rendered"
        assert (row["input_ids"], row["loss_mask"]) == (
            as_list(sample.input_ids),
            as_list(sample.loss_mask),
        )
        assert old[prompt_id]["input_ids"] != row["input_ids"], "v1 was built broken"
    assert sorted(m.encode() for m in pipeline.store("v1").markers()) == v1_markers

    # caught up, the replay keeps following: new prompts reach both versions
    more = set(pipeline.publish(write_prompts(10, name="more.jsonl", start=100)).prompt_ids)
    pipeline.wait(expected | more, [generate, v1, replay], dataset="v2", timeout=60)
    pipeline.wait(expected | more, [generate, v1, replay], dataset="v1", timeout=60)
    pipeline.assert_exactly_once(expected | more, dataset="v2")
