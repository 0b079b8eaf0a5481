"""What the tokenize stage keeps: the sample policy, its flags, and the builder that applies it.

Each rule is a flag with a default. A dropped completion becomes a dead letter of stage
``tokenize`` and kind ``policy_<rule>`` (so every prompt still ends as a sample or a dead
letter, and `draftgen run` counts the drops by rule):

- ``length``: ``finish_reason=length``, a truncated output (default drop; or keep).
- ``unclosed_think``: the output never closed ``</think>``, so the whole answer landed in
  ``reasoning_content`` (default drop). Checked on finished outputs only.
- ``empty_answer``: no content and no tool calls (default drop). Finished outputs only: a
  truncated output is judged by ``length`` alone.
- ``max_seq_len``: more tokens than ``--max-seq-len`` (default no limit; drop or truncate).
- ``min_loss_run``: fewer consecutive supervised tokens than ``--min-loss-run`` (default 2:
  DFlash trains on blocks and needs at least two).

The quality gate (its measures in gate.py), each ``drop`` (default), ``flag`` (kept, the rule
in the sample's ``flags`` column) or ``keep``:

- ``think_markers``: the answer still holds a think marker (finished outputs).
- ``repetition``: the output loops (``--repetition-max`` of its n-grams seen before in it).
- ``tool_args``: a tool call's arguments are not a JSON object. Always dropped: no template
  renders such a call as the model wrote it (nor would a server take it back as history).

Length, the think and empty rules, think markers and tool arguments are decided from the
completion, before any encoding; the lengths in tokens and repetition from the built sample.
A recipe may set any rule's verdict for its source (its `gate`, carried in the completion's
policy): that sample is judged by the stage's policy with those verdicts.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import numpy as np

from sinks.shards import Tokens
from streams.core.records import POLICY_PREFIX, CompletionRecord
from streams.core.settings import SamplePolicy
from streams.tokenize.gate import bad_tool_arguments, repeated_share, think_marker
from streams.tokenize.samples import Sample, SampleBuilder, SampleError

RULES = (
    "length",
    "unclosed_think",
    "empty_answer",
    "max_seq_len",
    "min_loss_run",
    "think_markers",
    "tool_args",
    "repetition",
)


class PolicyDrop(SampleError):
    """A completion the policy drops: a SampleError, so it is dead-lettered like one."""

    def __init__(self, rule: str, message: str):
        super().__init__(POLICY_PREFIX + rule, message)
        self.rule = rule


# -- applying it ------------------------------------------------------------------------------


class PolicySampleBuilder(SampleBuilder):
    """A SampleBuilder that applies a SamplePolicy: drops come back as `PolicyDrop` results."""

    def __init__(
        self, tokenizer: Any, *args: Any, policy: SamplePolicy | None = None, **kwargs: Any
    ) -> None:
        super().__init__(tokenizer, *args, **kwargs)
        self.policy = policy or SamplePolicy()
        # the policy of each recipe's `gate` (streams/core/recipes.py), built once
        self._recipe_policies: dict[tuple[tuple[str, str], ...], SamplePolicy] = {}
        self._think_close_id = _token_id(tokenizer, self.profile.think_close)
        self._think_markers = (self.profile.think_open, self.profile.think_close)

    def build_many(self, completions: Sequence[CompletionRecord]) -> list[Sample | SampleError]:
        # Completions the policy drops are never rendered nor encoded.
        verdicts = [self.check_completion(c) for c in completions]
        kept = [c for c, v in zip(completions, verdicts, strict=True) if isinstance(v, tuple)]
        built = iter(super().build_many(kept))
        results: list[Sample | SampleError] = []
        for completion, verdict in zip(completions, verdicts, strict=True):
            if isinstance(verdict, PolicyDrop):
                results.append(verdict)
                continue
            result = next(built)
            if isinstance(result, SampleError):
                results.append(result)
                continue
            if verdict:
                result = replace(result, flags=(*result.flags, *verdict))
            results.append(self.check(result, self.policy_for(completion)))
        return results

    def policy_for(self, completion: CompletionRecord) -> SamplePolicy:
        """The stage's policy with the verdicts the completion's recipe sets (its `gate`)."""
        gate = (completion.policy or {}).get("gate")
        if not gate:
            return self.policy
        key = tuple(sorted(gate.items()))
        if key not in self._recipe_policies:
            update = {f"on_{rule}": verdict for rule, verdict in key}
            self._recipe_policies[key] = self.policy.model_copy(update=update)
        return self._recipe_policies[key]

    def check_completion(self, completion: CompletionRecord) -> PolicyDrop | tuple[str, ...]:
        """A drop, or the rules the completion is flagged by (none: `()`)."""
        policy = self.policy_for(completion)
        if completion.finish_reason == "length":
            if policy.on_length == "drop":
                return PolicyDrop("length", "finish_reason=length: the output was cut short")
            return ()
        flags: list[str] = []
        left = think_marker(completion.content, *self._think_markers)
        if left is not None:
            found = _gate(policy, "think_markers", left, flags)
            if found is not None:
                return found
        if (why := bad_tool_arguments(completion.tool_calls)) is not None:
            return PolicyDrop("tool_args", why)
        if completion.tool_calls or (completion.content or "").strip():
            return tuple(flags)
        if self._unclosed(completion):
            if policy.on_unclosed_think == "drop":
                return PolicyDrop(
                    "unclosed_think", "no </think>: the whole output landed in the reasoning"
                )
            return tuple(flags)
        if policy.on_empty_answer == "drop":
            return PolicyDrop("empty_answer", "no content and no tool calls")
        return tuple(flags)

    def _unclosed(self, completion: CompletionRecord) -> bool:
        """An answer-less output with reasoning: unclosed, unless the server's ids show the
        think close (then the model closed it and wrote nothing: an empty answer)."""
        if not (completion.reasoning_content or "").strip():
            return False
        output = completion.output_token_ids
        if output is None or self._think_close_id is None:
            return True
        return self._think_close_id not in output

    def check(self, sample: Sample, policy: SamplePolicy | None = None) -> Sample | PolicyDrop:
        policy = policy or self.policy
        limit = policy.max_seq_len
        if limit is not None and sample.num_tokens > limit:
            if policy.on_max_seq_len == "drop":
                return PolicyDrop(
                    "max_seq_len", f"{sample.num_tokens} tokens > --max-seq-len {limit}"
                )
            sample = replace(
                sample,
                input_ids=sample.input_ids[:limit],
                loss_mask=sample.loss_mask[:limit],
                truncated=True,
            )
        run = longest_run(sample.loss_mask)
        if run < policy.min_loss_run:
            return PolicyDrop(
                "min_loss_run",
                f"{run} consecutive supervised tokens (< {policy.min_loss_run})"
                + (" after truncation" if sample.truncated else ""),
            )
        if policy.on_repetition != "keep":
            output = np.asarray(sample.input_ids)[np.asarray(sample.loss_mask, dtype=bool)]
            if output.size >= policy.repetition_min_tokens:
                share = repeated_share(output, policy.repetition_ngram)
                if share > policy.repetition_max:
                    flags: list[str] = []
                    message = (
                        f"{share:.0%} of its {policy.repetition_ngram}-token n-grams repeat "
                        f"earlier ones (> --repetition-max {policy.repetition_max:g})"
                    )
                    if (drop := _gate(policy, "repetition", message, flags)) is not None:
                        return drop
                    sample = replace(sample, flags=(*sample.flags, *flags))
        return sample


def _gate(policy: SamplePolicy, rule: str, message: str, flags: list[str]) -> PolicyDrop | None:
    """A quality-gate rule that fired: its drop, or its flag added to `flags`."""
    action = getattr(policy, f"on_{rule}")
    if action == "drop":
        return PolicyDrop(rule, message)
    if action == "flag":
        flags.append(rule)
    return None


def longest_run(mask: Tokens) -> int:
    """Longest run of ones in a 0/1 mask, from where runs start and end (numpy, no loop per
    token; splitting the bytes at zeros made an object per prompt token: 46 µs → 17 µs)."""
    ones = np.asarray(mask, dtype=np.int8)
    if ones.size == 0:
        return 0
    edges = np.diff(ones, prepend=0, append=0)
    starts, ends = np.flatnonzero(edges == 1), np.flatnonzero(edges == -1)
    return int((ends - starts).max()) if starts.size else 0


def _token_id(tokenizer: Any, token: str) -> int | None:
    """The id of a single token, or None when the vocabulary has no such token."""
    if not token:
        return None
    try:
        token_id = tokenizer.convert_tokens_to_ids(token)
        back = tokenizer.convert_ids_to_tokens(token_id) if token_id is not None else None
    except Exception:  # a tokenizer without the conversion: fall back to the text rule
        return None
    return token_id if isinstance(token_id, int) and back == token else None
