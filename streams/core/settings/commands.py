"""The settings of the one-shot and supervising commands: publish, run, status, dead-letters,
audit, export, report, seal, replay, and the log level all commands share."""

from __future__ import annotations

from typing import Literal

from pydantic import field_validator, model_validator
from pydantic_settings import SettingsConfigDict

from streams.core.settings.base import (
    DatasetName,
    OutputRoot,
    ServerUrl,
    Settings,
    TokenizerDir,
    dataset_setting,
    setting,
)
from streams.core.settings.kafka import KafkaSettings, kafka_if_configured
from streams.core.settings.names import LogLevel, RegenMode
from streams.core.settings.policy import ExportCut
from streams.core.settings.storage import StorageSettings


class PublishSettings(Settings):
    limit: int | None = setting(None, cli=True, help="publish at most this many prompts", gt=0)
    progress: bool = setting(True, cli=True, help="no progress bar")
    regenerate: bool = setting(
        False,
        cli=True,
        help="publish and generate prompts even if the `generated` ledger has them",
    )
    regen: RegenMode = setting(
        "final",
        cli=True,
        help="final: answer the last turn; every-turn: regenerate each assistant turn of "
        "conversations without tool results, one sample per turn",
    )
    id_field: str = setting(
        "id",
        cli=True,
        help="the source rows' field that holds their own id, carried to the shards as "
        "`source_id` (rows without it: null)",
        min_length=1,
        max_length=200,
    )
    # recipes (producers/recipes.py)
    recipe: str | None = setting(
        None,
        cli=True,
        help="a recipe file (TOML, or YAML if it ends in .yaml or .yml): each source's "
        "sampling, thinking (on, off or a share), samples per prompt, regen mode, weight, id "
        "field and quality-gate verdicts; its sources are published when none are named",
        metavar="FILE",
    )
    source_recipe: list[str] = setting(
        default_factory=list,
        cli=True,
        help="one source's recipe keys, over the recipe file's, e.g. "
        "code.jsonl:temperature=0.6,samples=2,thinking=0.7,gate.repetition=flag; repeatable",
        metavar="SOURCE:KEY=VALUE,...",
    )
    # cleaning (producers/clean.py)
    dedup_text: bool = setting(
        True,
        cli=True,
        help="publish prompts whose text (whitespace aside) equals an earlier prompt's "
        "(default: removed, a duplicate_text dead letter)",
    )
    decontaminate: list[str] = setting(
        default_factory=list,
        cli=True,
        help="an evaluation set (a file, directory or glob of jsonl/json/parquet, or "
        "hf:NAME[:SPLIT]) no published prompt may share a word n-gram with; repeatable",
    )
    contamination_ngram: int = setting(
        13, cli=True, help="words an n-gram for --decontaminate", ge=5, le=100
    )
    near_duplicates: float | None = setting(
        None,
        cli=True,
        help="also remove prompts whose words (system messages and tools aside) have a MinHash "
        "Jaccard similarity of at least this with an earlier prompt's, e.g. 0.8 (default: off)",
        ge=0.5,
        le=1.0,
        metavar="THRESHOLD",
    )


class LogSettings(Settings):
    log_level: LogLevel = setting("WARNING", cli=True, env=("DRAFTGEN_LOG_LEVEL",))

    @field_validator("log_level", mode="before")
    @classmethod
    def _any_case(cls, level: object) -> object:
        return level.upper() if isinstance(level, str) else level


class RunSettings(Settings):
    """`draftgen run`: what to start when it is not given."""

    servers: list[ServerUrl] = setting(
        default_factory=list,
        cli=True,
        help="an SGLang server URL, repeatable (default: start emulated servers)",
    )
    emulated_servers: int = setting(
        2,
        cli=True,
        aliases=("--servers",),
        help="how many emulated servers to start when no --server",
        gt=0,
    )
    out: OutputRoot | None = setting(None, cli=True, help="output root (default: runs/<time>/out)")
    dataset: DatasetName = dataset_setting(default="sample")
    tokenizer_dir: TokenizerDir | None = setting(
        None,
        cli=True,
        aliases=("--tokenizer",),
        help="tokenizer directory (default: the bundled tiny Qwen3.6-format one)",
    )
    workdir: str | None = setting(
        None, cli=True, help="logs and local services (default runs/<time>)"
    )
    # seal's timeout means another wait: each has its own environment name
    timeout_s: float = setting(
        3600.0,
        cli=True,
        aliases=("--timeout",),
        help="give up if not done after this many seconds",
        env=("DRAFTGEN_RUN_TIMEOUT_S",),
        gt=0,
    )
    # which server the emulated servers imitate (compose/emulator/: routes, ids, preprocessing)
    emulate: Literal["sglang", "vllm"] = setting(
        "sglang",
        cli=True,
        help="the server the emulated servers imitate: SGLang (0.5.23) or vLLM (0.34.0)",
    )
    emulator_tokens_per_s: float = setting(
        2000.0,
        cli=True,
        help="decode speed of emulated servers, per request",
        gt=0,
    )
    # what `run` gives its tokenize workers (theirs: DRAFTGEN_IDLE_FLUSH_S)
    idle_flush_s: float = setting(2.0, env=("DRAFTGEN_RUN_IDLE_FLUSH_S",), gt=0)
    tokenize_workers: int = setting(
        1,
        cli=True,
        help="tokenize workers to start (they share the completions partitions)",
        gt=0,
    )
    # a child forked from a process that imported the workers once skips its own imports
    # (1.3-1.9 CPU s each): on few cores, the start of a fleet started together
    fork: bool = setting(
        True,
        cli=True,
        help="exec each worker and emulated server rather than fork it from one process "
        "that imported their modules once",
    )


class StatusSettings(Settings):
    """`draftgen status`."""

    kafka: KafkaSettings = setting(default_factory=lambda: KafkaSettings())
    out: OutputRoot | None = setting(
        None, cli=True, help="output root of the dataset versions (for samples and tokens)"
    )
    datasets: list[DatasetName] = setting(
        default_factory=list,
        cli=True,
        help="a dataset version, repeatable (default: every one found under --out)",
    )
    watch_s: float | None = setting(
        None,
        cli=True,
        aliases=("--watch",),
        help="refresh every SECONDS (default 5) until interrupted",
        nargs="?",
        const=5.0,
        metavar="SECONDS",
        gt=0,
    )
    as_json: bool = setting(
        False, cli=True, aliases=("--json",), help="one JSON object (a line per refresh)"
    )

    @field_validator("datasets")
    @classmethod
    def _once_each(cls, datasets: list[str]) -> list[str]:
        return list(dict.fromkeys(datasets))

    @model_validator(mode="after")
    def _datasets_need_out(self) -> StatusSettings:
        if self.datasets and not self.out:
            raise ValueError("--dataset needs --out (where the dataset versions are)")
        return self

    @property
    def storage(self) -> StorageSettings | None:
        return StorageSettings(out=self.out) if self.out else None


class DeadLetterSelection(Settings):
    """`draftgen dead-letters`."""

    stage: Literal["publish", "generate", "tokenize"] | None = setting(
        None, cli=True, help="only the dead letters of this stage"
    )
    kind: str | None = setting(None, cli=True, help="reason kind, a glob (e.g. 'http_*')")
    republish: bool = setting(
        False,
        cli=True,
        help="send the selected letters' payloads back to their stage's input topic",
    )
    as_json: bool = setting(
        False,
        cli=True,
        aliases=("--json",),
        help="one JSON object: the counts and every failed prompt",
    )


class AuditSettings(Settings):
    """`draftgen audit`; with `out` and `dataset`, that version is checked too and an outcome
    counts only under its samples' generation settings (streams/tools/audit.py)."""

    out: OutputRoot | None = setting(
        None, cli=True, help="output root of the dataset version to check (with --dataset)"
    )
    dataset: DatasetName | None = dataset_setting(default=None)

    republish: bool = setting(
        False,
        cli=True,
        help="send every prompt that has no outcome back to the prompts topic, as it was",
    )
    as_json: bool = setting(
        False,
        cli=True,
        aliases=("--json",),
        help="one JSON object: the counts and every prompt without an outcome",
    )

    @model_validator(mode="after")
    def _version_needs_both(self) -> AuditSettings:
        if (self.out is None) != (self.dataset is None):
            raise ValueError("--out and --dataset go together (the version to check)")
        return self

    @property
    def storage(self) -> StorageSettings | None:
        return StorageSettings(out=self.out) if self.out else None


class ExportSettings(Settings):
    """`draftgen export`: a dataset version as the file a trainer takes (tools/export.py)."""

    model_config = SettingsConfigDict(env_prefix="DRAFTGEN_EXPORT_")

    storage: StorageSettings
    dataset: DatasetName = dataset_setting()
    # a name in streams/tools/export_formats.py EXPORT_FORMATS, which offers the choices and
    # their help; the command line checks it (these settings sit below the registry)
    format: str = setting(cli=True, help="what to write")
    to: str = setting(
        cli=True,
        aliases=("--output",),
        env=("DRAFTGEN_EXPORT_TO", "DRAFTGEN_EXPORT_OUTPUT"),
        metavar="PATH",
        help="the file or directory (a format that writes one, such as hf, or any format "
        "split by --rows-per-file/--tokens-per-file) to write; new",
    )
    # split into files of at most this many rows / tokens (prompt included, after the cut),
    # so a trainer can load one file at a time
    rows_per_file: int | None = setting(
        None, cli=True, help="at most this many rows a file (default: one file)", ge=1
    )
    tokens_per_file: int | None = setting(
        None,
        cli=True,
        help="at most this many tokens a file, prompt included (a longer sample gets a file of "
        "its own; default: one file)",
        ge=1,
    )
    # the completions topic, read by --format conversations
    kafka: KafkaSettings | None = setting(default_factory=lambda: kafka_if_configured())
    sources: list[str] = setting(
        default_factory=list, cli=True, help="only samples of this source (repeatable)"
    )
    finish_reasons: list[str] = setting(
        default_factory=list,
        cli=True,
        help="only samples with this finish reason (repeatable)",
    )
    min_len: int | None = setting(
        None, cli=True, help="fewest tokens, prompt included, before truncation", ge=1
    )
    max_len: int | None = setting(
        None, cli=True, help="most tokens, prompt included, before truncation", ge=1
    )
    # the length rules, as the tokenize stage's (SamplePolicy) but truncating by default
    cut: ExportCut = setting(default_factory=lambda: ExportCut())


class ReportSettings(Settings):
    """`draftgen report`: what a dataset version holds, before GPU-days are spent on it."""

    model_config = SettingsConfigDict(env_prefix="DRAFTGEN_REPORT_")

    storage: StorageSettings
    dataset: DatasetName = dataset_setting()
    to: str | None = setting(
        None,
        cli=True,
        aliases=("--output",),
        env=("DRAFTGEN_REPORT_TO", "DRAFTGEN_REPORT_OUTPUT"),
        metavar="DIR",
        help="directory for report.json, the PNG plots and report.html (default report-DATASET)",
    )
    tokenizer_dir: TokenizerDir | None = setting(
        None,
        cli=True,
        aliases=("--tokenizer",),
        help="tokenizer directory for the reasoning/answer split (default: dataset.json's)",
    )
    # dead letters and tokenize heartbeats, when a broker is given
    kafka: KafkaSettings | None = setting(default_factory=kafka_if_configured)
    bins: int = setting(40, cli=True, help="bars per length histogram", gt=1)


class SealSettings(Settings):
    """`draftgen seal`."""

    kafka: KafkaSettings = setting(default_factory=lambda: KafkaSettings())
    storage: StorageSettings
    dataset: DatasetName = dataset_setting()
    timeout_s: float = setting(
        600.0,
        cli=True,
        aliases=("--timeout",),
        env=("DRAFTGEN_SEAL_TIMEOUT_S",),
        help="give up if the version has not caught up after this many seconds",
        gt=0,
    )


class ReplaySettings(Settings):
    """`draftgen replay --workers N`: N replay workers on this machine, until the version has
    caught up with the completions topic (or for good, `--follow`)."""

    workers: int = setting(
        1,
        cli=True,
        help="replay workers to start here; they share the completions partitions",
        gt=0,
    )
    workdir: str | None = setting(
        None,
        cli=True,
        help="the workers' settings and logs (default runs/replay-<time>)",
    )
    follow: bool = setting(
        False,
        cli=True,
        help="keep following new completions once caught up (default: end when the version "
        "holds every completion stored when the replay started)",
    )
