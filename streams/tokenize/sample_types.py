"""What the tokenize stage makes of a completion: a `Sample` (ids, loss mask, drift) or a
`SampleError` (a dead letter's kind and message)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np
import numpy.typing as npt

from streams.core.records import equal_fields

TokenSource = Literal["server", "rendered"]
TOKEN_SOURCES: tuple[TokenSource, ...] = ("server", "rendered")
# a sample's ids and mask are numpy arrays of the shard's column types, from the record's
# packed ids or the encoder's lists straight to Arrow, with no Python int per token between
Ids = npt.NDArray[np.int32]
Mask = npt.NDArray[np.int8]


@dataclass(frozen=True)
class DriftCause:
    """Where the server's ids and the rendering first differ: in the prompt if the prompt ids
    differ (else in the turn), the position in the sample, and the token there on each side,
    decoded and repr'd (None: that side ended there, one is a prefix of the other)."""

    side: Literal["prompt", "turn"]
    position: int
    server: str | None
    rendered: str | None
    # the server's prompt is what another SGLang version's preprocessing renders (that
    # profile's name): a normalization difference, not the template's or the tokenizer's
    normalization: str | None = None

    @property
    def label(self) -> str:
        if self.normalization is not None:
            return "prompt normalization"
        length = self.server is None or self.rendered is None
        return f"{self.side} length" if length else self.side

    @property
    def key(self) -> str:
        """Without the position, so that counts of the same cause add up across samples."""
        if self.normalization is not None:
            return f"{self.label}: the server rendered as {self.normalization}"
        return (
            f"{self.label}: server {self.server or '(end)'} vs rendered {self.rendered or '(end)'}"
        )

    def __str__(self) -> str:
        return (
            f"{self.label}: at {self.position} server {self.server or '(end)'} "
            f"vs rendered {self.rendered or '(end)'}"
        )


@dataclass
class Sample:
    input_ids: Ids
    loss_mask: Mask
    token_source: TokenSource
    # rendered ids differ from the server's (None: not measured)
    drift: bool | None = None
    # first position where they differ (None: no drift or not measured)
    drift_position: int | None = None
    # why it drifted (None: no drift or not measured)
    drift_cause: DriftCause | None = None
    # cut to the policy's --max-seq-len (streams/policies.py)
    truncated: bool = False
    # the server's preprocessing profile the prompt was rendered with (streams/core/serving/)
    normalization: str = ""
    # quality-gate rules it broke, kept by a `flag` setting (streams/tokenize/policies.py)
    flags: tuple[str, ...] = ()

    def __eq__(self, other: object) -> bool:
        return equal_fields(self, other) if isinstance(other, Sample) else NotImplemented

    @property
    def num_tokens(self) -> int:
        return len(self.input_ids)

    @property
    def num_loss_tokens(self) -> int:
        return int(np.count_nonzero(self.loss_mask))


class SampleError(Exception):
    """A completion that cannot become a sample; `kind` names the failure for dead letters."""

    def __init__(self, kind: str, message: str):
        super().__init__(f"{kind}: {message}")
        self.kind = kind
        self.message = message
