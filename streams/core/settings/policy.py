"""What a sample must be to be kept (the tokenize stage's policy, and export's cut), and how
long the pipeline's wait-out-a-failure loops wait (streams/core/retry.py)."""

from __future__ import annotations

from typing import Literal

from pydantic_settings import SettingsConfigDict

from streams.core.settings.base import Settings, setting
from streams.core.settings.names import KeepFlagDrop, KeepOrDrop, OverLength


class LengthPolicy(Settings):
    """The length rules, shared by the tokenize stage (SamplePolicy) and export (ExportCut)."""

    max_seq_len: int | None = setting(
        None,
        cli=True,
        help="longest sample in tokens, prompt included (default: no limit)",
        gt=0,
    )
    on_max_seq_len: OverLength = setting("drop", cli=True, help="samples longer than --max-seq-len")
    min_loss_run: int = setting(
        2,
        cli=True,
        help="fewest consecutive supervised tokens a sample needs (2: SpecForge's DFlash "
        "minimum; 1: EAGLE-3's)",
        gt=0,
    )


class SamplePolicy(LengthPolicy):
    """What the tokenize stage keeps (streams/tokenize/policies.py); drops become dead letters."""

    on_length: KeepOrDrop = setting(
        "drop", cli=True, help="outputs cut by max tokens, finish_reason=length"
    )
    on_unclosed_think: KeepOrDrop = setting(
        "drop", cli=True, help="outputs that never closed </think>: all reasoning"
    )
    on_empty_answer: KeepOrDrop = setting(
        "drop", cli=True, help="outputs without content or tool calls"
    )
    # the quality gate (streams/tokenize/gate.py); thresholds from real text, BENCHMARKS.md
    on_repetition: KeepFlagDrop = setting(
        "drop",
        cli=True,
        help="outputs that loop: more than --repetition-max of their n-grams occurred earlier "
        "in them",
    )
    repetition_ngram: int = setting(
        32, cli=True, help="tokens an n-gram for --on-repetition", ge=4, le=4096
    )
    repetition_max: float = setting(
        0.25,
        cli=True,
        help="the share of repeated n-grams above which an output loops (real code scored at "
        "most 0.19, a loop over 30%% of an output at least 0.27)",
        gt=0,
        lt=1,
    )
    repetition_min_tokens: int = setting(
        256, cli=True, help="outputs shorter than this are not checked for loops", ge=1
    )
    on_think_markers: KeepFlagDrop = setting(
        "drop", cli=True, help="answers that still hold a think marker (<think>, </think>)"
    )


class ExportCut(LengthPolicy):
    """Export's length rules: SpecForge cuts a long sample to its `data.max_length` keeping the
    head, so export truncates by default where the tokenize stage drops; its own environment
    names, as the default differs."""

    model_config = SettingsConfigDict(env_prefix="DRAFTGEN_EXPORT_")

    on_max_seq_len: OverLength = setting(
        "truncate", cli=True, help="samples longer than --max-seq-len"
    )


BackoffKind = Literal["outage", "poll", "ledger", "steal"]


class RetrySettings(Settings):
    """Backoff of every wait-out-a-failure loop (streams/core/retry.py `backoff`)."""

    model_config = SettingsConfigDict(env_prefix="DRAFTGEN_RETRY_")

    # an outage (storage, Kafka, a server): waited out, however long it lasts
    initial_s: float = setting(1.0, gt=0)
    max_s: float = setting(60.0, gt=0)
    # each delay is drawn from [1 - jitter, 1] × the step, so a fleet does not retry in lockstep
    jitter: float = setting(0.5, ge=0, lt=1)
    # a wait with a deadline of its own (run's progress, topic creation): retried quickly
    poll_initial_s: float = setting(0.5, gt=0)
    poll_max_s: float = setting(5.0, gt=0)
    # reading the `generated` ledger
    ledger_max_s: float = setting(30.0, gt=0)
    # a thief's next try at other workers' backlogs: soon, as its slots are idle meanwhile
    steal_max_s: float = setting(2.0, gt=0)

    def delays(self, kind: BackoffKind) -> tuple[float, float]:
        """(first delay, longest delay) of a loop of this kind."""
        return {
            "outage": (self.initial_s, self.max_s),
            "poll": (self.poll_initial_s, self.poll_max_s),
            "ledger": (self.initial_s, self.ledger_max_s),
            "steal": (self.poll_initial_s, self.steal_max_s),
        }[kind]
