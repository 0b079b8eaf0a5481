"""Which of the server's ids stand for the encoding of the rendered prompt and turn, so that
the sample builder does not encode that text again (samples.py's docstring says when)."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import cast

import numpy as np

from streams.tokenize.encoder import TextEncoder
from streams.tokenize.rendering import RenderedText
from streams.tokenize.sample_types import Ids, SampleError

log = logging.getLogger(__name__)

# the server's (prompt, turn) ids that stand for the rendering's encoding, None where not
Known = tuple[Ids | None, Ids | None]
NONE_KNOWN: Known = (None, None)


class KnownIds:
    """The server's ids a builder takes for encodings, and its trust in the server's prompt
    ids, which lasts until one that spells its prompt is not its encoding."""

    def __init__(self, encoder: TextEncoder, encode_turns: bool) -> None:
        self.encoder = encoder
        # the server's prompt ids stand for the rendered prompt's encoding when they spell it
        # (until one that spells it is not its encoding); which of a batch's is checked
        self.trust_server_prompts = True
        self._probes = 0
        # True: every turn encoded (a turn the model sampled in other tokens than its text's
        # encoding is drift); False: the server's turn ids that spell the turn stand for it
        self.encode_turns = encode_turns

    def find(
        self,
        servers: Mapping[int, tuple[Ids, Ids] | None],
        rendered: Mapping[int, RenderedText | SampleError],
    ) -> dict[int, Known]:
        """The server's ids that stand for the encoding of the rendered prompt and turn, by
        completion: prompt ids that spell the prompt, and, unless every turn is encoded, turn
        ids that spell the turn. One of the prompts is encoded by the tokenizer all the same,
        a different one each batch; if its ids differ, no prompt is trusted from then on."""
        prompts, turns = self.trust_server_prompts, not self.encode_turns
        if not (prompts or turns):
            return {}
        spells = self.encoder.spells
        known: dict[int, Known] = {}
        for i, item in rendered.items():
            server = servers.get(i)
            if server is None or not isinstance(item, RenderedText):
                continue
            prompt = server[0] if prompts and spells(server[0], item.prompt) else None
            turn = server[1] if turns and spells(server[1], item.turn, normalized=True) else None
            if prompt is not None or turn is not None:
                known[i] = (prompt, turn)
        spelled = {i: prompt for i, (prompt, _) in known.items() if prompt is not None}
        if not spelled:
            return known
        probe = list(spelled)[self._probes % len(spelled)]
        self._probes += 1
        try:
            [ids] = self.encoder.reference([cast(RenderedText, rendered[probe]).prompt])
        except Exception:  # encoded the usual way by the builder, where a failure is the sample's
            known[probe] = (None, known[probe][1])
            return known
        if not np.array_equal(np.asarray(ids, dtype=np.int32), spelled[probe]):
            self.distrust("a prompt of a batch")
            return {i: (None, turn) for i, (_, turn) in known.items() if turn is not None}
        return known

    def distrust(self, where: str) -> None:
        """The server's prompt ids spelled a prompt but were not its encoding: from now on every
        prompt is encoded."""
        if self.trust_server_prompts:
            log.warning(
                "the server's prompt ids are not the tokenizer's encoding of their own text on "
                "%s; encoding every prompt from now on",
                where,
            )
        self.trust_server_prompts = False
