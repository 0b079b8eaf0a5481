"""What `draftgen audit` found, as lines for a terminal or one JSON object (audit.py decides)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from streams.tools.audit_dataset import VersionResult


@dataclass(frozen=True, slots=True)
class MissingPrompt:
    """A published prompt without an outcome, where its latest copy is in the prompts topic."""

    prompt_id: str
    source: str
    source_id: str | None
    partition: int
    offset: int
    # the generate group has not committed past its latest copy: it may still be generated
    pending: bool
    copies: int = 1
    # it has an outcome, but none since a copy published again to be regenerated
    # (`publish --regenerate`, `dead-letters --republish`): that copy is the one listed
    republished: bool = False

    @property
    def position(self) -> str:
        return f"{self.partition}@{self.offset}"

    @property
    def state(self) -> str:
        # lost: the generate group committed past it, so no worker will take it again
        state = "pending" if self.pending else "lost"
        return f"{state}-since-republished" if self.republished else state


@dataclass
class Retention:
    """What the prompts topic's retention deleted (its log start offsets), and what can be told
    of it: records the generate group never read, and prompts whose ids are known from a claim
    in the ledger (a request that started) with no outcome under any settings since."""

    deleted: int = 0  # records before the log start offsets
    unread: int = 0  # of those: at or past the generate group's committed offset
    # partitions with deleted records and no committed offset of the generate group (never
    # committed, or its offsets expired): how many of their deleted records it read is unknown
    unknown: list[int] = field(default_factory=list)
    claimed: list[str] = field(default_factory=list)  # ids: claimed, no outcome, gone
    answered: int = 0  # prompt ids with an outcome that are no longer in the topic

    @property
    def lost(self) -> int:
        return self.unread + len(self.claimed)


@dataclass
class AuditResult:
    prompts: int = 0  # distinct prompt ids in the prompts topic
    records: int = 0  # prompt records read (copies included)
    missing: int = 0  # prompt ids without an outcome (or none since they were republished)
    pending: int = 0  # of those: not committed past by the generate group yet
    # the missing prompts (at most MAX_LISTED), by partition and offset
    listed: list[MissingPrompt] = field(default_factory=list)
    republished: int = 0
    # the settings an outcome counted under (None: any); each with its model
    settings: dict[str, str] | None = None
    retention: Retention = field(default_factory=Retention)
    version: VersionResult | None = None

    @property
    def complete(self) -> bool:
        version = self.version is None or self.version.complete
        return (
            self.missing == 0
            and self.retention.lost == 0
            and not self.retention.unknown
            and version
        )

    def summary(self) -> str:
        under = "" if self.settings is None else f" under {_named(self.settings)}"
        if self.missing == 0:
            return f"every prompt has an outcome{under} ({self.prompts} prompts)"
        line = f"{self.missing} of {self.prompts} prompts have no outcome{under}"
        if self.pending:
            line += (
                f" ({self.pending} not yet committed by the generate workers: still pending "
                "while a run goes on)"
            )
        return line

    def lines(self, command: str) -> list[str]:
        """The summary; when prompts are missing, each one (prompt id, source, source id,
        partition@offset in the prompts topic, its state) and the command that republishes
        them; then what retention deleted and the version's check."""
        lines = [self.summary()]
        if self.missing:
            rows = [
                (m.prompt_id, m.source or "-", m.source_id or "-", m.position, m.state)
                for m in self.listed
            ]
            lines += _table(("prompt id", "source", "source id", "partition@offset", "state"), rows)
            if self.missing > len(self.listed):
                lines.append(f"  … and {self.missing - len(self.listed)} more")
            lines.append(f"republish them: {command}")
        lines += self._retention_lines()
        if self.version is not None:
            lines += _version_lines(self.version)
        return lines

    def _retention_lines(self) -> list[str]:
        kept = self.retention
        if not kept.deleted and not kept.claimed:
            return []
        lines = [
            f"retention deleted {kept.deleted} prompt records; {kept.unread} of them before the "
            f"generate group read them (their prompts' ids went with them)"
        ]
        if kept.unknown:
            lines.append(
                f"  partitions {', '.join(map(str, kept.unknown))}: records deleted and no "
                "committed offset of the generate group: unknown whether it read them"
            )
        if kept.claimed:
            lines.append(
                f"  {len(kept.claimed)} prompts claimed by a worker, never answered, now gone "
                "(publish them again from their source):"
            )
            lines += [f"    {prompt_id}" for prompt_id in kept.claimed]
        return lines

    def as_json(self, command: str) -> dict[str, Any]:
        kept = self.retention
        return {
            "prompts": self.prompts,
            "records": self.records,
            "missing": self.missing,
            "pending": self.pending,
            "missing_prompts": [
                {
                    "prompt_id": m.prompt_id,
                    "source": m.source,
                    "source_id": m.source_id,
                    "partition": m.partition,
                    "offset": m.offset,
                    "state": m.state,
                    "copies": m.copies,
                    "republished": m.republished,
                }
                for m in self.listed
            ],
            "listed": len(self.listed),
            "republished": self.republished,
            "republish_command": None if not self.missing else command,
            "settings": self.settings,
            "retention": {
                "deleted": kept.deleted,
                "unread": kept.unread,
                "unknown_partitions": kept.unknown,
                "claimed_gone": kept.claimed,
                "answered_gone": kept.answered,
            },
            "version": None if self.version is None else _version_json(self.version),
            "complete": self.complete,
        }


def _named(settings: dict[str, str]) -> str:
    if not settings:
        return "the version's settings (it has no samples)"
    return "settings " + ", ".join(f"{h} ({model or 'no model'})" for h, model in settings.items())


def _table(header: tuple[str, ...], rows: Sequence[tuple[str, ...]]) -> list[str]:
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header) - 1)]
    lines = []
    for row in [header, *rows]:
        cells = [f"{cell:{width}}" for cell, width in zip(row, widths, strict=False)]
        lines.append("  " + "  ".join([*cells, row[-1]]))
    return lines


def _version_lines(version: VersionResult) -> list[str]:
    how = "sealed" if version.sealed else "not sealed: its committed offsets now"
    lines = []
    if version.unaccounted == 0:
        lines.append(
            f"version {version.dataset} ({how}): each of its {version.checked} completions is "
            "a sample, a recorded drop or a dead letter"
        )
    else:
        lines.append(
            f"version {version.dataset} ({how}): {version.unaccounted} of {version.checked} "
            "completions are not a sample, a recorded drop or a dead letter"
        )
        rows = [
            (str(u.partition), str(u.offset), u.prompt_id or "-", u.why) for u in version.listed
        ]
        lines += _table(("partition", "offset", "prompt id", "why"), rows)
        if version.unaccounted > len(version.listed):
            lines.append(f"  … and {version.unaccounted - len(version.listed)} more")
    if version.mixed:
        counts = ", ".join(f"{h}: {n}" for h, n in version.settings.most_common())
        lines.append(f"  its samples mix generation settings (samples per settings: {counts})")
    return lines


def _version_json(version: VersionResult) -> dict[str, Any]:
    return {
        "dataset": version.dataset,
        "sealed": version.sealed,
        "checked": version.checked,
        "unaccounted": version.unaccounted,
        "unaccounted_completions": [
            {"partition": u.partition, "offset": u.offset, "prompt_id": u.prompt_id, "why": u.why}
            for u in version.listed
        ],
        "samples_by_settings": dict(version.settings),
        "mixed_settings": version.mixed,
    }


def retention_of(starts: dict[int, int], committed: dict[int, int]) -> Retention:
    """What the log start offsets say was deleted, against the generate group's offsets."""
    kept = Retention()
    for partition, start in sorted(starts.items()):
        kept.deleted += start
        if start and partition not in committed:
            kept.unknown.append(partition)
        elif start:
            kept.unread += max(0, start - committed[partition])
    return kept
