"""A sample's generation policy: the sampling parameters and thinking mode its source's recipe
asks for (producers/recipes.py), carried in its prompt record (`PromptRecord.policy`). Any
generate worker serves any policy, so one fleet and one consumer group build a mixed dataset;
a worker's own flags (`--temperature`, `--no-thinking`, …) are the defaults a policy overrides
(`effective_sampling`, `effective_thinking`).

A source that asks for several answers per prompt publishes each as a prompt record of its own:
sample k > 0 of prompt P has the id ``P~k`` (`sample_id`), deterministic from the prompt and the
index, so the ledger, the shards and replay keep the samples apart, and a seed, when the policy
has one, is the recipe's seed + k (else every sample would be the same answer).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Any, Literal, get_args

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from streams.core.record_fields import RecordError
from streams.core.settings.policy import SamplePolicy

# The tokenize stage's rules a recipe may set per source (SamplePolicy's `on_RULE` settings:
# `gate = { repetition = "flag" }`), with the verdicts each takes; the rest are the stage's flags
GATE_RULES: dict[str, tuple[str, ...]] = {
    name.removeprefix("on_"): get_args(info.annotation)
    for name, info in SamplePolicy.model_fields.items()
    if name.startswith("on_")
}


def gate_error(gate: Any) -> str | None:
    """What is wrong with a recipe's or a policy's `gate` (None: nothing)."""
    if not isinstance(gate, dict):
        return "gate must be a table of RULE = VERDICT"
    for rule, verdict in gate.items():
        if rule not in GATE_RULES:
            return f"gate.{rule} is not a rule (one of: {', '.join(GATE_RULES)})"
        if verdict not in GATE_RULES[rule]:
            return f"gate.{rule} = {verdict!r}: one of {', '.join(GATE_RULES[rule])}"
    return None


# The sampling parameters a policy may set, with SGLang's own ranges (SamplingParams.verify;
# vLLM checks the same): a value out of range is refused at publish, not by every server.
SAMPLING_HELP = {
    "temperature": "≥ 0 (0: greedy)",
    "top_p": "in (0, 1]",
    "top_k": "-1 (off) or ≥ 1",
    "min_p": "in [0, 1]",
    "presence_penalty": "in [-2, 2]",
    "frequency_penalty": "in [-2, 2]",
    "repetition_penalty": "in (0, 2]",
    "max_tokens": "≥ 1",
    "seed": "an integer",
}
# sent as the OpenAI chat API's own fields; the others in the request body beside them
# (SGLang and vLLM read top_k, min_p and repetition_penalty there)
OPENAI_FIELDS = frozenset(
    {"temperature", "top_p", "max_tokens", "seed", "presence_penalty", "frequency_penalty"}
)
# SGLang's /generate names (streams/generate/native.py)
NATIVE_NAMES = {"max_tokens": "max_new_tokens", "seed": "sampling_seed"}
SAMPLE_SEPARATOR = "~"
MAX_SAMPLES = 64


class Sampling(BaseModel):
    """A policy's sampling parameters; None: the worker's default."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    temperature: float | None = Field(None, ge=0, allow_inf_nan=False)
    top_p: float | None = Field(None, gt=0, le=1)
    top_k: int | None = Field(None, ge=-1)
    min_p: float | None = Field(None, ge=0, le=1)
    presence_penalty: float | None = Field(None, ge=-2, le=2)
    frequency_penalty: float | None = Field(None, ge=-2, le=2)
    repetition_penalty: float | None = Field(None, gt=0, le=2)
    max_tokens: int | None = Field(None, ge=1)
    seed: int | None = None

    @field_validator("top_k")
    @classmethod
    def _top_k(cls, value: int | None) -> int | None:
        if value == 0:
            raise ValueError("0")
        return value

    def as_dict(self) -> dict[str, Any]:
        return self.model_dump(exclude_none=True)


def sampling_error(err: ValidationError) -> str:
    """One line for a refused sampling parameter: its name, value and range."""
    first = err.errors()[0]
    name = ".".join(str(part) for part in first["loc"])
    if first["type"] == "extra_forbidden":
        return f"{name} is not a sampling parameter (one of: {', '.join(SAMPLING_HELP)})"
    return f"{name} = {first.get('input')!r}: must be {SAMPLING_HELP.get(name, first['msg'])}"


class RecipeError(ValueError):
    """A recipe that cannot be used, in one line."""


class SourceRecipe(BaseModel):
    """One source's part of a recipe (producers/recipes.py; its sampling parameters apart,
    in `sampling`)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    path: str | None = None
    weight: float | None = Field(None, gt=0, allow_inf_nan=False)
    id_field: str | None = Field(None, min_length=1, max_length=200)
    regen: Literal["final", "every-turn"] | None = None
    samples: int = Field(1, ge=1, le=MAX_SAMPLES)
    # a share in [0, 1] of samples that think, or all (true) or none (false)
    thinking: bool | float | None = None
    sampling: dict[str, Any] = Field(default_factory=dict)
    # the tokenize stage's verdict per rule for this source's samples (GATE_RULES)
    gate: dict[str, str] = Field(default_factory=dict)

    @field_validator("gate")
    @classmethod
    def _known_rules(cls, gate: dict[str, str]) -> dict[str, str]:
        if (error := gate_error(gate)) is not None:
            raise ValueError(error)
        return gate

    def thinking_share(self) -> float | None:
        if self.thinking is None or isinstance(self.thinking, bool):
            return None if self.thinking is None else float(self.thinking)
        if not 0 <= self.thinking <= 1:
            raise RecipeError(f"thinking = {self.thinking}: a share must be in [0, 1]")
        return self.thinking


@dataclass(frozen=True)
class Policy:
    """What a prompt record asks of the worker that answers it."""

    recipe: str = ""  # the recipe's name, for provenance
    sampling: dict[str, Any] = field(default_factory=dict)  # Sampling.as_dict()
    thinking: bool | None = None  # None: the worker's
    gate: dict[str, str] = field(default_factory=dict)  # GATE_RULES; unset: the stage's flags

    def to_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = {"recipe": self.recipe, "sampling": self.sampling}
        if self.thinking is not None:
            data["thinking"] = self.thinking
        if self.gate:
            data["gate"] = self.gate
        return data

    @classmethod
    def from_dict(cls, data: Any) -> Policy:
        """The policy of a record's `policy` field; RecordError("bad_policy") when it is not
        one (a record written by hand, or by a newer publisher)."""
        if not isinstance(data, dict):
            raise RecordError("bad_policy", "policy must be an object")
        thinking = data.get("thinking")
        if thinking is not None and not isinstance(thinking, bool):
            raise RecordError("bad_policy", "policy.thinking must be true or false")
        try:
            sampling = Sampling.model_validate(data.get("sampling") or {})
        except ValidationError as err:
            raise RecordError("bad_policy", f"policy.sampling: {sampling_error(err)}") from None
        gate = data.get("gate") or {}
        if (error := gate_error(gate)) is not None:
            raise RecordError("bad_policy", f"policy.{error}")
        return cls(str(data.get("recipe") or ""), sampling.as_dict(), thinking, dict(gate))


def sample_id(prompt_id: str, index: int) -> str:
    """The id of a prompt's sample `index` (0: the prompt's own id)."""
    return prompt_id if index == 0 else f"{prompt_id}{SAMPLE_SEPARATOR}{index}"


def thinking_for(sample: str, share_on: float) -> bool:
    """Whether a sample thinks, in a mix with `share_on` of them thinking: decided by the
    sample's id, so a republish or a resumed run decides the same."""
    draw = int.from_bytes(hashlib.sha256(sample.encode()).digest()[:8], "big") / 2**64
    return draw < share_on


def effective_sampling(defaults: dict[str, Any], policy: Policy | None) -> dict[str, Any]:
    """The sampling parameters sent: the worker's, overridden by the policy's."""
    return defaults if policy is None or not policy.sampling else {**defaults, **policy.sampling}


def effective_thinking(default: bool, policy: Policy | None) -> bool:
    return default if policy is None or policy.thinking is None else policy.thinking


def thinking_sent(sampling: dict[str, Any]) -> bool | None:
    """The thinking switch a completion's recorded sampling sent (in `chat_template_kwargs`,
    under the family's name for it); None when it sent none."""
    kwargs = sampling.get("chat_template_kwargs")
    if not isinstance(kwargs, dict):
        return None
    switches = [v for v in kwargs.values() if isinstance(v, bool)]
    return switches[0] if switches else None
