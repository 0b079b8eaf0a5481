"""The tokenize stage: completion records → samples with loss masks, fed to the shard sink.

The stage decides what each consumed completion becomes: an item of its partition's window
keyed by prompt_id (a later completion of the same prompt replaces it: latest answer wins), or
the dead letter of an undecodable record. At flush the sink hands the window back: samples are
built in batches of BUILD_TOKENS, those that fail become recorded drops (in the marker) and
dead letters (sent before the sink writes the marker). Windows, markers, fencing, retries of
storage I/O and acks are the sink's (`sinks/sink.py`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Hashable

from sinks.shards import SampleRow, ShardMarker, ShardStore
from sinks.sink import STORAGE_BACKOFF, Admitted, Prepared, ShardSink
from streams.core.crash_guard import CRASH_LOOP, CrashGuard
from streams.core.delivery import Send, letter_output, send_dead_letter
from streams.core.events import Event
from streams.core.faults import AFTER_DEAD_LETTERS, AFTER_MARKER, crash_point
from streams.core.records import CompletionRecord, DeadLetter, RecordError, origin_of
from streams.core.retry import Backoff
from streams.core.settings import TokenizeSettings
from streams.core.turns import among
from streams.tokenize.gate import GateTally
from streams.tokenize.policies import PolicyDrop
from streams.tokenize.samples import Sample, SampleBuilder, SampleError
from streams.tokenize.stats import TokenizeStats

log = logging.getLogger(__name__)

STAGE = "tokenize"


class Other:
    """A completion of a prompt the version does not hold (not in the worker's `prompts`): acked
    with its window, nothing written."""


OTHER = Other()
# a window's item: a completion to build, the dead letter of an undecodable record, or another
# prompt's completion
Item = CompletionRecord | DeadLetter | Other
# tokens of the completions built in one batch: a batch's texts and encoded ids (a Python int
# a token, ~36 bytes) live until it is assembled, so a whole window (up to --shard-tokens) at
# once would hold ~150 MB per 4M tokens; this keeps it ~10 MB and still feeds the encoder's
# threads batches of hundreds of texts
BUILD_TOKENS = 256 * 1024


class TokenizeStage:
    """The stage behind `sink` (a `SinkStage`): the agent feeds `sink.add`, a timer calls
    `sink.flush_idle`, a revocation `sink.on_revoked`."""

    def __init__(
        self,
        settings: TokenizeSettings,
        builder: SampleBuilder,
        store: ShardStore,
        send: Send,
        dead_letters_topic: str,
        *,
        backoff: Backoff = STORAGE_BACKOFF,
        clock: Callable[[], float] = time.monotonic,
        epoch: Callable[[], int] = lambda: 0,
        guard: CrashGuard | None = None,
        on_sealed: Callable[[str], None] | None = None,
        prompts: frozenset[str] | None = None,
        tokenized_with: dict[str, str] | None = None,
    ):
        self.guard = guard
        # the prompt ids (and conversations) the version holds; None: every completion
        self.prompts = prompts
        # the tokenizer's and template's hashes, in every row's provenance
        self.tokenized_with = tokenized_with or {}
        self.settings = settings
        self.builder = builder
        self.send = send
        self.dead_letters_topic = dead_letters_topic
        self.backoff = backoff
        self.stats = TokenizeStats()
        self.sink: ShardSink[Item] = ShardSink(
            store,
            self,
            max_records=settings.shard_max_records,
            max_tokens=settings.shard_max_tokens,
            idle_flush_s=settings.idle_flush_s,
            max_open_bytes=settings.max_open_bytes,
            epoch=epoch,
            backoff=backoff,
            clock=clock,
            **({"on_sealed": on_sealed} if on_sealed is not None else {}),
        )
        self.stats.sink = self.sink.stats

    # -- SinkStage -----------------------------------------------------------------------------

    def admit(self, tp: Hashable, event: Event) -> Admitted[Item]:
        """Decode one record (every field checked there): a dead letter for anything wrong
        with it, or for any exception while admitting it; never an exception."""
        raw = bytes(event.value)
        key = bytes(event.key).decode("utf-8", "replace") if event.key else None
        if self.prompts is not None and (key is None or not among(key, self.prompts)):
            # its bytes stay in the window until it is acked: counted against the budget
            return Admitted(OTHER, size=len(raw))
        where = (event.message.tp.topic, event.message.tp.partition, event.message.offset)
        origin = origin_of(*where)
        if self.guard and (error := self.guard.poisoned(*where)):
            letter = DeadLetter.for_payload(STAGE, CRASH_LOOP, error, raw, key, origin)
            return Admitted(letter, key=key or None, size=len(raw))
        try:
            return self._admit(tp, raw)
        except RecordError as err:
            letter = DeadLetter.for_payload(STAGE, err.kind, err.message, raw, key, origin)
            return Admitted(letter, key=key or None, size=len(raw))
        except Exception as err:  # a bug, not bad input: this record's dead letter
            log.exception("unexpected failure admitting a completion; dead-lettering it")
            text = f"{type(err).__name__}: {err}"
            letter = DeadLetter.for_payload(STAGE, "internal_error", text, raw, key, origin)
            return Admitted(letter, key=key or None, size=len(raw))

    def _admit(self, tp: Hashable, raw: bytes) -> Admitted[Item]:
        completion = CompletionRecord.decode(raw)
        # the window holds the event (the record's bytes) and the decoded record (its texts
        # and ids, about as large): twice its size, so the budget bounds what is held
        size = 2 * len(raw)
        return Admitted(completion, key=completion.prompt_id, tokens=_tokens(completion), size=size)

    async def prepare(self, items: list[Item]) -> Prepared:
        letters = [item for item in items if isinstance(item, DeadLetter)]
        completions = [item for item in items if isinstance(item, CompletionRecord)]
        built = await asyncio.to_thread(self._build_each, completions)
        rows: list[SampleRow] = []
        gate = GateTally()
        for completion, result in zip(completions, built, strict=True):
            if isinstance(result, PolicyDrop):
                gate.add("drop", result.rule, completion)
            elif not isinstance(result, SampleError):
                for rule in result.flags:
                    gate.add("flag", rule, completion)
            if not isinstance(result, SampleError):
                try:
                    rows.append(self._row(completion, result))
                    continue
                except Exception as err:  # a bug: this record's dead letter, not the window's
                    result = SampleError("internal_error", f"{type(err).__name__}: {err}")
            if isinstance(result, SampleError):
                letters.append(
                    DeadLetter.for_payload(
                        STAGE,
                        result.kind,
                        result.message,
                        completion.encode(),
                        completion.prompt_id,
                    )
                )
                self.stats.errors[result.kind] = self.stats.errors.get(result.kind, 0) + 1
        # Dead letters first: once the marker exists the window's offsets may be committed.
        for letter in letters:
            output = letter_output(self.settings.kafka, self.dead_letters_topic, letter)
            await send_dead_letter(self.send, output, self.backoff, log)
        if letters:
            crash_point(AFTER_DEAD_LETTERS)
        drops = {letter.prompt_id: letter.kind for letter in letters if letter.prompt_id}
        return Prepared(rows, drops, gate.counts, gate.examples)

    def committed(self, marker: ShardMarker, items: list[Item]) -> None:
        crash_point(AFTER_MARKER)
        # a file a time: the windows of one flush share one, the first of them at row 0
        self.stats.shards += 1 if marker.rows and marker.row_start == 0 else 0
        self.stats.samples += marker.rows
        self.stats.tokens += marker.tokens
        self.stats.loss_tokens += marker.loss_tokens
        # every item of its prompts became a row or a dead letter
        ours = sum(1 for item in items if not isinstance(item, Other))
        self.stats.dead_letters += ours - marker.rows

    def _build_each(self, completions: list[CompletionRecord]) -> list[Sample | SampleError]:
        """Built in batches of about BUILD_TOKENS tokens, in order."""
        results: list[Sample | SampleError] = []
        batch: list[CompletionRecord] = []
        tokens = 0
        for completion in completions:
            batch.append(completion)
            tokens += _tokens(completion)
            if tokens >= BUILD_TOKENS:
                results += self._build_batch(batch)
                batch, tokens = [], 0
        return results + self._build_batch(batch) if batch else results

    def _build_batch(self, completions: list[CompletionRecord]) -> list[Sample | SampleError]:
        """The batch build; if it raises, one by one, so an exception costs only its record."""
        try:
            return self.builder.build_many(completions)
        except Exception:
            log.exception("a sample batch failed; building its completions one by one")
        results: list[Sample | SampleError] = []
        for completion in completions:
            try:
                results += self.builder.build_many([completion])
            except Exception as err:
                results.append(SampleError("internal_error", f"{type(err).__name__}: {err}"))
        return results

    def _row(self, completion: CompletionRecord, sample: Sample) -> SampleRow:
        if sample.drift is not None:
            self.stats.drift_compared += 1
            self.stats.drifted += int(sample.drift)
        if sample.drift_cause is not None:
            # DEBUG: the marker counts causes; a bad template would flood INFO with one a row
            log.debug("drift in %s: %s", completion.prompt_id, sample.drift_cause)
        return SampleRow(
            prompt_id=completion.prompt_id,
            source=completion.source,
            input_ids=sample.input_ids,
            loss_mask=sample.loss_mask,
            finish_reason=completion.finish_reason or "",
            token_source=sample.token_source,
            drift=sample.drift,
            conversation_id=(completion.meta or {}).get("conversation_id"),
            source_id=completion.source_id,
            truncated=sample.truncated,
            drift_cause=sample.drift_cause.key if sample.drift_cause else None,
            normalization=sample.normalization,
            flags=sample.flags,
            provenance=completion.provenance(self.tokenized_with),
        )


def _tokens(completion: CompletionRecord) -> int:
    """The completion's tokens as its server counted them, else a guess from its text."""
    usage = completion.usage or {}
    return int(usage.get("total_tokens") or 0) or len(completion.content) // 3
