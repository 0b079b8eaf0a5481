"""Which way a server's chat endpoint returns the exact token ids, and reading them.

The ways, read from the servers' source (sglang entrypoints/openai/serving_chat.py and
protocol.py, vllm entrypoints/openai/chat_completion/protocol.py, Nov 2026):

- `sglext` (SGLang, sgl-project/sglang#34488): request fields `return_input_ids_in_sglext` and
  `return_output_ids_in_sglext` (what the server flags --return-input-ids / --return-output-ids
  force for every request) answer `sglext.input_ids`, the prompt, once per response, and
  `sglext.output_ids`, one list per choice. Works when streaming too.
- `return_token_ids`: SGLang (sgl-project/sglang#30917, non-streaming chat) answers per choice
  `prompt_token_ids` and `token_ids`, renamed `response_token_ids` by sgl-project/sglang#35225;
  vLLM answers `prompt_token_ids` once per response and `token_ids` per choice.
- `return_prompt_token_ids` (older SGLang): the choice's `prompt_token_ids`, the prompt only.

Output ids are the raw sampled ids, stop token included, before reasoning and tool-call parsing.
Both servers ignore request fields they do not know, so one probe can ask every way at once.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any


@dataclass(frozen=True)
class IdsWay:
    """One way of asking for exact ids: its name, the request fields, what it gives."""

    name: str
    request: dict[str, bool]
    # both sides (prompt and output); False: the prompt side only, or nothing
    exact: bool
    # where a probe's answer had them, e.g. ("prompt_token_ids", "choices[].token_ids")
    fields: tuple[str, ...] = ()

    @property
    def asked(self) -> dict[str, bool]:
        """What each request asks: nothing when the ids would be incomplete, as a completion
        record holds both sides or neither (the tokenize stage renders the others)."""
        return self.request if self.exact else {}


SGLEXT = IdsWay(
    "sglext", {"return_input_ids_in_sglext": True, "return_output_ids_in_sglext": True}, True
)
TOKEN_IDS = IdsWay("return_token_ids", {"return_token_ids": True}, True)
PROMPT_IDS = IdsWay("return_prompt_token_ids", {"return_prompt_token_ids": True}, False)
NO_IDS = IdsWay("none", {}, False)
# `--api native`: the worker renders the prompt and posts its ids (streams/generate/native.py)
NATIVE = IdsWay("native /generate", {}, True, ("input_ids", "output_ids"))

# the probe asks for all of them; the first one the answer shows wins
PREFERRED = (SGLEXT, TOKEN_IDS, PROMPT_IDS)
PROBE_REQUEST: dict[str, bool] = {k: v for way in PREFERRED for k, v in way.request.items()}


@dataclass(frozen=True)
class FoundIds:
    """The ids of a response's first choice, and the fields they were found in."""

    prompt: list[int] | None
    output: list[int] | None
    fields: tuple[str, ...]


def _first(places: tuple[tuple[str, Any], ...]) -> tuple[str, list[int]] | None:
    for name, value in places:
        if isinstance(value, list):
            return name, value
    return None


def find_ids(body: dict[str, Any]) -> FoundIds:
    """Every place a server may put them: sglext first, then the choice, then the response."""
    choices = body.get("choices")
    choice = choices[0] if isinstance(choices, list) and choices else {}
    ext = body.get("sglext") or {}
    per_choice = ext.get("output_ids")
    sglext_output = per_choice[0] if isinstance(per_choice, list) and per_choice else None
    prompt = _first(
        (
            ("sglext.input_ids", ext.get("input_ids")),
            ("choices[].prompt_token_ids", choice.get("prompt_token_ids")),
            ("prompt_token_ids", body.get("prompt_token_ids")),
        )
    )
    output = _first(
        (
            ("sglext.output_ids", sglext_output),
            ("choices[].response_token_ids", choice.get("response_token_ids")),
            ("choices[].token_ids", choice.get("token_ids")),
        )
    )
    return FoundIds(
        prompt[1] if prompt else None,
        output[1] if output else None,
        tuple(found[0] for found in (prompt, output) if found),
    )


def way_of(body: dict[str, Any]) -> IdsWay:
    """The way a probe's answer (asked with PROBE_REQUEST) shows the server has."""
    found = find_ids(body)
    if found.fields == ("sglext.input_ids", "sglext.output_ids"):
        way = SGLEXT
    elif found.prompt is not None and found.output is not None:
        way = TOKEN_IDS
    elif found.prompt is not None:
        way = PROMPT_IDS
    else:
        way = NO_IDS
    return replace(way, fields=found.fields)
