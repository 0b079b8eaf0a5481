"""A prompt's recipe policy (streams/core/recipes.py) against the emulated server: the worker
sends the policy's sampling and thinking over its own flags, through the chat endpoint and
/generate alike, and records what it sent, the recipe and who answered; the ledger keys the
prompt under those settings, as `draftgen audit` hashes its completion."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from streams.core.ledger import settings_hash
from streams.core.recipes import GATE_RULES, Policy
from streams.core.records import PromptRecord, RecordError
from streams.tools.audit_ids import completion_settings
from tests.streams.generate.fakes import (
    FakeClient,
    FakeKafka,
    once_worker,
    run,
    settings_key,
    until,
)
from tests.streams.generate.test_native import FAMILIES, StartEmulator, complete, generate_settings

POLICY = {
    "recipe": "kimi-mix",
    "sampling": {"temperature": 0.6, "top_k": 20, "min_p": 0.05, "presence_penalty": 0.5},
    "thinking": False,
}


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("api", ["chat", "native"])
def test_a_prompts_policy_overrides_the_workers_flags(
    start_emulator: StartEmulator, tiny_tokenizer_dirs: dict[str, Path], family: str, api: str
) -> None:
    messages = [{"role": "user", "content": "Explain write-ahead logs."}]
    own = PromptRecord(prompt_id="own", messages=messages)
    mixed = PromptRecord(prompt_id="mixed", messages=messages, policy=POLICY)
    native = {"api": "native", "tokenizer_dir": str(tiny_tokenizer_dirs[family])}

    async def scenario() -> None:
        async with start_emulator(family) as emu:
            settings = generate_settings(
                emu.base_url, thinking=True, **(native if api == "native" else {})
            )
            plain, recipe = await complete(settings, own), await complete(settings, mixed)
        assert plain.reasoning_content is not None  # the worker's flag: thinking on
        assert recipe.reasoning_content is None  # the policy's: off
        assert plain.recipe == "" and recipe.recipe == "kimi-mix"
        sent = dict(recipe.sampling)
        kwargs = sent.pop("chat_template_kwargs")
        assert list(kwargs.values()) == [False]
        # the policy's values over the worker's defaults (top_p, max_tokens stay the worker's)
        assert sent == {**settings.sampling.as_dict(), **POLICY["sampling"]}
        assert recipe.served["kind"] == "sglang" and recipe.served["version"]
        data = recipe.to_dict()
        assert completion_settings(data) == settings_hash(recipe.model, sent, False, "final"), (
            "audit hashes what was sent"
        )

    asyncio.run(asyncio.wait_for(scenario(), 60))


def test_the_ledger_keys_a_recipe_prompt_under_its_own_settings() -> None:
    """Generated before under the worker's own settings is not generated under the recipe's;
    a redelivery under the recipe's is skipped."""

    async def scenario() -> None:
        client, kafka = FakeClient(), FakeKafka()
        worker, ledger = await once_worker(client, kafka)
        assert worker.once is not None
        policy = Policy.from_dict(POLICY)
        key = worker.once.settings_key("final", policy)
        assert key != settings_key(worker)
        ledger.add("p", settings_key(worker))  # answered before without the recipe
        value = PromptRecord(prompt_id="p", messages=[{"role": "user", "content": "x"}])
        value.policy = POLICY
        await worker.submit(kafka.raw_event(0, b"p", value.encode()))
        await worker.submit(kafka.raw_event(1, b"p", value.encode()))
        await until(lambda: kafka.acked() == [0, 1], "both copies acked")
        assert client.requests == ["p"]
        assert kafka.outcomes() == [f"p@{key}"]
        await worker.stop()

    run(scenario)


def test_a_policys_gate_names_rules_and_verdicts_the_tokenize_stage_has() -> None:
    assert GATE_RULES["repetition"] == ("drop", "flag", "keep")
    assert GATE_RULES["length"] == ("drop", "keep")  # no flag for a cut output
    policy = Policy("r", {}, None, {"repetition": "flag"})
    assert Policy.from_dict(policy.to_dict()) == policy
    for gate, message in (
        ({"loops": "drop"}, "policy.gate.loops is not a rule"),
        ({"length": "flag"}, "policy.gate.length = 'flag': one of drop, keep"),
        ("drop", "policy.gate must be a table"),
    ):
        with pytest.raises(RecordError) as refused:
            Policy.from_dict({"recipe": "r", "sampling": {}, "gate": gate})
        assert refused.value.kind == "bad_policy" and str(refused.value.message).startswith(message)
