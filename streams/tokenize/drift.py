"""Where a rendering and the server's ids first differ, named for people (`DriftCause`)."""

from __future__ import annotations

from typing import Any, Literal

import numpy as np

from streams.tokenize.sample_types import DriftCause, Ids

# a decoded token in a drift cause, repr'd, is cut to this many characters
CAUSE_TOKEN_CHARS = 40


def drift_cause(tokenizer: Any, server: tuple[Ids, Ids], rendered: tuple[Ids, int]) -> DriftCause:
    """Only for drifted samples: two single-token decodes, no pass over the whole sample."""
    ids, prompt_len = rendered
    side: Literal["prompt", "turn"] = "prompt"
    ours, theirs, offset = ids[:prompt_len], server[0], 0
    if np.array_equal(ours, theirs):
        side, ours, theirs, offset = "turn", ids[prompt_len:], server[1], prompt_len
    at = first_difference(ours, theirs)
    server_token = int(theirs[at]) if at < len(theirs) else None
    rendered_token = int(ours[at]) if at < len(ours) else None
    server_text = token_text(tokenizer, server_token)
    rendered_text = token_text(tokenizer, rendered_token)
    if server_text is not None and server_text == rendered_text:
        # two ids of the same text (two byte pieces shown as '\ufffd'): tell them apart
        server_text += f" #{server_token}"
        rendered_text = f"{rendered_text} #{rendered_token}"
    return DriftCause(side, offset + at, server_text, rendered_text)


def token_text(tokenizer: Any, token: int | None) -> str | None:
    if token is None:
        return None
    try:
        text = repr(tokenizer.decode([token]))
    except Exception:  # a decode failure must not cost the sample; the id still says it
        return f"#{token}"
    if len(text) > CAUSE_TOKEN_CHARS:
        text = text[: CAUSE_TOKEN_CHARS - 1] + "…"
    return text


def first_difference(a: Ids, b: Ids) -> int:
    common = min(len(a), len(b))
    differ = np.flatnonzero(a[:common] != b[:common])
    return int(differ[0]) if differ.size else common
