"""Token-exact samples per model family and regeneration mode, on real Kafka and S3.

The emulated server is told to drift (ids that re-encode differently), to leave some thinking
unclosed, and to run past the generate worker's --max-tokens, so every policy rule and the
drift report have work. The expectations are computed from the completions topic: what the
target produced decides which samples, policy drops and regen_stopped letters there must be.
"""

from __future__ import annotations

import asyncio
import itertools
import random
from collections import Counter
from pathlib import Path
from typing import Any

import orjson
import pytest

from compose.tiny_tokenizers import TINY_MODELS
from producers.publish import publish
from producers.sources import parse_source_spec
from sinks.reader import DatasetReader
from streams.core.records import CompletionRecord
from streams.core.tokenizers import load_tokenizer
from streams.core.turns import EVERY_TURN, FINAL, STOPPED, parse_turn_id, turn_prompt_id
from streams.tools.progress import dataset_figures
from tests.ids import as_list

pytestmark = pytest.mark.integration

MAX_TOKENS = 90  # generate worker: outputs longer than this end with finish_reason=length
EMULATOR = (
    "--drift-rate",
    "0.3",
    "--unclosed-think-rate",
    "0.12",
    "--tool-call-rate",
    "0.5",
    "--min-output-tokens",
    "8",
    "--max-output-tokens",
    "110",
)
WORDS = [
    "explain", "the", "trade-offs", "of", "a", "write-ahead", "log", "for", "key", "value",
    "store", "and", "why", "my", "rust", "borrow", "checker", "complains", "about", "this",
    "closure;", "write", "function", "that", "merges", "intervals",
]  # fmt: skip
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "run_shell",
            "description": "Run a shell command",
            "parameters": {
                "type": "object",
                "properties": {"command": {"type": "string"}},
                "required": ["command"],
            },
        },
    }
]
# (max_seq_len, what to do past it) per mode: both sides of the rule get exercised
SEQ_RULE = {FINAL: ("200", "drop"), EVERY_TURN: ("200", "truncate")}


def sentence(rng: random.Random) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 10))).capitalize() + "?"


def conversation(index: int, rng: random.Random, tools_every: int) -> dict[str, Any]:
    """1-3 user turns with answers between them (placeholders for every-turn), some with a
    system prompt; every `tools_every`-th with a tool call and its result."""
    messages: list[dict[str, Any]] = []
    if index % 4 == 0:
        messages.append({"role": "system", "content": f"You are assistant #{index}."})
    for turn in range(1 + index % 3):
        if turn:
            messages.append({"role": "assistant", "content": sentence(rng)})
        messages.append({"role": "user", "content": f"[{index}.{turn}] {sentence(rng)}"})
    row: dict[str, Any] = {"messages": messages}
    if index % 6 == 1:
        row["tools"] = TOOLS  # declared; the model may call it (tool-call rate)
    if index % tools_every == 0:
        row["tools"] = TOOLS
        call = {
            "id": f"call_{index}",
            "type": "function",
            "function": {"name": "run_shell", "arguments": '{"command": "ls"}'},
        }
        messages += [
            {"role": "assistant", "content": "", "tool_calls": [call]},
            {"role": "tool", "tool_call_id": f"call_{index}", "content": "README.md\nsrc\n"},
        ]
    return row


@pytest.fixture(scope="session")
def tiny_dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Each family's tiny model (compose/tiny_tokenizers.py `TINY_MODELS`), built once."""
    return {
        family: model.build(tmp_path_factory.mktemp("tok") / f"{model.name}-tiny")
        for family, model in TINY_MODELS.items()
    }


# -- the oracle -----------------------------------------------------------------------------


class Oracle:
    """What the tokenize stage must make of each completion, under the policy in use."""

    def __init__(self, tokenizer: Any, max_seq_len: int, over: str):
        self.tokenizer = tokenizer
        self.max_seq_len = max_seq_len
        self.over = over
        self.think_close = tokenizer.convert_tokens_to_ids("</think>")

    def outcome(self, c: CompletionRecord) -> str:
        """'sample', 'truncated' or the policy drop kind."""
        output = as_list(c.output_token_ids)
        if c.finish_reason == "length":
            return "policy_length"
        if not c.tool_calls and not c.content.strip():
            unclosed = (c.reasoning_content or "").strip() and self.think_close not in output
            return "policy_unclosed_think" if unclosed else "policy_empty_answer"
        length = len(as_list(c.prompt_token_ids)) + len(output)
        if length <= self.max_seq_len:
            return "sample"
        if self.over == "drop":
            return "policy_max_seq_len"
        kept = self.max_seq_len - len(as_list(c.prompt_token_ids))
        return "truncated" if kept >= 2 else "policy_min_loss_run"

    def injected_drift(self, c: CompletionRecord) -> bool:
        """The emulator re-spelled some ids: the canonical encoding of the text differs."""
        output = as_list(c.output_token_ids)
        text = self.tokenizer.decode(output, skip_special_tokens=False)
        return bool(self.tokenizer.encode(text, add_special_tokens=False) != output)


def can_continue(c: CompletionRecord) -> bool:
    """The regen rule: a turn the next one can be generated against."""
    return c.finish_reason != "length" and not c.tool_calls and bool(c.content.strip())


# -- the test -------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", [FINAL, EVERY_TURN])
@pytest.mark.parametrize("family", sorted(TINY_MODELS))  # every family with a tiny model
def test_family_end_to_end(
    family: str,
    mode: str,
    pipeline: Any,
    tiny_dirs: dict[str, Path],
    tmp_path: Path,
) -> None:
    pipeline.tokenizer_dir = tiny_dirs[family]
    assert load_tokenizer(tiny_dirs[family]).profile.name == family  # one id for the family
    count = 50 if mode == FINAL else 40
    rng = random.Random(f"{TINY_MODELS[family].name}-{mode}")  # the conversations as before
    source = tmp_path / "prompts.jsonl"
    # every-turn: a few conversations with tool results, which fall back to the final turn
    tools_every = 5 if mode == FINAL else 10
    source.write_bytes(
        b"".join(orjson.dumps(conversation(i, rng, tools_every)) + b"\n" for i in range(count))
    )
    max_seq_len, over = SEQ_RULE[mode]

    url, _ = pipeline.emulator(*EMULATOR, "--seed", "3")
    workers = [
        pipeline.generate(url, "--max-tokens", str(MAX_TOKENS)),
        pipeline.tokenize("--max-seq-len", max_seq_len, "--on-max-seq-len", over),
    ]
    summary = asyncio.run(
        publish(pipeline.kafka, [parse_source_spec(str(source))], progress=False, regen=mode)
    )
    assert summary.published == count
    conversations = set(summary.prompt_ids)
    result = pipeline.wait(conversations, workers, timeout=90)

    completions = pipeline.completions()
    letters = pipeline.dead_letters()
    store = pipeline.store()
    table = DatasetReader(store).table()
    rows = {row["prompt_id"]: row for row in table.to_pylist()}
    assert len(rows) == table.num_rows  # each prompt id written once
    by_kind: dict[str, set[str]] = {}
    for letter in letters:
        by_kind.setdefault(f"{letter.stage}/{letter.kind}", set()).add(letter.prompt_id or "")

    # -- regeneration: which completions and regen_stopped letters there must be ---------
    stopped: set[str] = set()
    if mode == FINAL:
        assert set(completions) == conversations
        assert all("conversation_id" not in c.meta for c in completions.values())
    else:
        turns: dict[str, list[CompletionRecord]] = {}
        for completion in completions.values():
            parsed = parse_turn_id(completion.prompt_id)
            if parsed is None:  # tools in use: answered as a final turn
                assert completion.prompt_id in conversations
                assert any(m["role"] == "tool" for m in completion.messages)
                continue
            cid, turn, _ = parsed
            assert completion.meta["conversation_id"] == cid and completion.meta["turn"] == turn
            turns.setdefault(cid, []).append(completion)
        assert set(turns) | (set(completions) & conversations) == conversations
        multi = 0
        for cid, done in turns.items():
            done.sort(key=lambda c: c.meta["turn"])
            total = done[0].meta["turns"]
            assert [c.meta["turn"] for c in done] == list(range(len(done)))
            # each turn went on from the target's own earlier answers
            for previous, current in itertools.pairwise(done):
                assert can_continue(previous)
                answers = [m for m in current.messages if m["role"] == "assistant"]
                assert answers[-1]["content"] == previous.content
                multi += 1
            if len(done) < total:
                assert not can_continue(done[-1])
                stopped.update(turn_prompt_id(cid, t, total) for t in range(len(done), total))
        assert multi >= 5, "too few conversations went past their first turn"
    assert by_kind.pop(f"generate/{STOPPED}", set()) == stopped

    # -- policy: the samples and drops the completions call for --------------------------
    oracle = Oracle(load_tokenizer(pipeline.tokenizer_dir).tokenizer, int(max_seq_len), over)
    expected = {pid: oracle.outcome(c) for pid, c in completions.items()}
    outcomes = Counter(expected.values())
    drops = {f"tokenize/{k}": {p for p, o in expected.items() if o == k} for k in outcomes}
    drops = {k: v for k, v in drops.items() if k.startswith("tokenize/policy_")}
    assert by_kind == drops, "only policy drops besides regen_stopped letters"
    assert set(rows) == {p for p, o in expected.items() if o in ("sample", "truncated")}
    assert outcomes["policy_length"] and outcomes["policy_unclosed_think"]
    assert outcomes["policy_max_seq_len" if over == "drop" else "truncated"]
    assert result.dead_letters.policy_ids == set().union(*drops.values())

    # -- tokens: server samples are exactly the server's ids -----------------------------
    for pid, row in rows.items():
        completion = completions[pid]
        prompt_ids = as_list(completion.prompt_token_ids)
        output_ids = as_list(completion.output_token_ids)
        assert row["token_source"] == "server"
        whole = prompt_ids + output_ids
        if expected[pid] == "truncated":
            assert row["input_ids"] == whole[: int(max_seq_len)]
        else:
            masked = [t for t, m in zip(row["input_ids"], row["loss_mask"], strict=True) if m]
            assert masked == output_ids and row["input_ids"] == whole
        assert row["conversation_id"] == completion.meta.get("conversation_id")

    # -- drift: per sample, and aggregated in the markers and the run result -------------
    drifted = {pid for pid, row in rows.items() if row["drift"]}
    assert all(row["drift"] is not None for row in rows.values())  # all were compared
    # exactly the samples whose ids the emulator re-spelled: the rendering matches the
    # server's (tools included) wherever the server's ids are canonical
    assert drifted == {pid for pid in rows if oracle.injected_drift(completions[pid])}
    assert drifted, "the emulator was told to drift"
    figures = dataset_figures(store)
    assert (figures.compared, figures.drifted) == (len(rows), len(drifted))
    assert figures.truncated == outcomes["truncated"]
    assert (result.figures.compared, result.figures.drifted) == (len(rows), len(drifted))
