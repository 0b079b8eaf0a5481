"""The settings of the pipeline's workers: generate (with its ledger and stealing), tokenize,
and what every worker observes."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import SecretStr, model_validator

from streams.core.families import FAMILIES
from streams.core.serving import PROFILES
from streams.core.settings.base import (
    Concurrency,
    DatasetName,
    OneOf,
    SafeName,
    ServerUrl,
    Settings,
    TokenizerDir,
    dataset_setting,
    setting,
)
from streams.core.settings.kafka import KafkaSettings
from streams.core.settings.names import (
    DEFAULT_CONCURRENCY,
    GenerateApi,
    tokenize_group_name,
)
from streams.core.settings.policy import SamplePolicy
from streams.core.settings.storage import StorageSettings

# a registered model family (streams/core/families/registry.py FAMILIES)
FamilyName = Annotated[str, OneOf(FAMILIES)]
# a registered request-preprocessing profile (streams/core/serving/ PROFILES)
ProfileName = Annotated[str, OneOf(PROFILES)]


class SamplingSettings(Settings):
    temperature: float = setting(1.0, cli=True, ge=0)
    top_p: float = setting(0.95, cli=True, gt=0, le=1)
    max_tokens: int = setting(8192, cli=True, gt=0)
    seed: int | None = setting(None, cli=True, help="sampling seed sent with each request")

    def as_dict(self) -> dict[str, Any]:
        return {k: v for k, v in self.model_dump().items() if v is not None}


class GenerateSettings(Settings):
    server: ServerUrl = setting(cli=True, help="the SGLang server's base URL")
    kafka: KafkaSettings = setting(default_factory=lambda: KafkaSettings())
    concurrency: Concurrency = setting(
        DEFAULT_CONCURRENCY,
        cli=True,
        help="requests kept in flight against the server; auto: the server's "
        f"max_running_requests (from /server_info; {DEFAULT_CONCURRENCY} if it does not say)",
        metavar="N|auto",
    )
    sampling: SamplingSettings = setting(default_factory=lambda: SamplingSettings())
    # None: ask the server which model it serves
    model: str | None = setting(None, cli=True, help="served model name (default: ask the server)")
    # one model per run (streams/generate/identity.py): a server serving another model, revision
    # or tokenizer is refused at start. None: any model. `run` sets them from its first server
    expect_model: str | None = setting(
        None,
        cli=True,
        help="a generate worker refuses to start unless its server serves this model (a weights "
        "path counts as its last component, or org/name of a Hugging Face cache path; default: "
        "any; run: its first server's)",
        metavar="NAME",
    )
    expect_revision: str | None = setting(
        None,
        cli=True,
        help="with --expect-model: refuse a server that reports another revision",
        metavar="REVISION",
    )
    expect_tokenizer: str | None = setting(
        None,
        cli=True,
        help="with --expect-model: refuse a server that reports another tokenizer (a path counts "
        "as for --expect-model)",
        metavar="NAME",
    )
    # family name whose thinking kwarg is sent; None: detect from the model name
    family: FamilyName | None = setting(
        None,
        cli=True,
        help="model family for the thinking kwarg (default: from the model name)",
    )
    thinking: bool = setting(True, cli=True, help="generate with thinking off")
    # ask the server for its exact token ids (the way is probed at start: exact_ids.py)
    return_token_ids: bool = True
    # native: for servers whose chat endpoint returns no ids (streams/generate/native.py)
    api: GenerateApi = setting(
        "chat",
        cli=True,
        help="chat: /v1/chat/completions; native: render the prompt with --tokenizer-dir and post "
        "its ids to SGLang's /generate, so the output ids are exact on any server version",
    )
    tokenizer_dir: TokenizerDir | None = setting(
        None,
        cli=True,
        aliases=("--tokenizer",),
        help="the target's tokenizer directory, the one the server uses (for --api native)",
    )
    # None: the profile of the SGLang or vLLM version the server reports at start (the newest
    # SGLang one if it says none); recorded per completion, so the tokenize stage renders as
    # the server did
    normalization: ProfileName | None = setting(
        None,
        cli=True,
        help="render prompts as this SGLang or vLLM version range preprocesses chat requests "
        "(default: from the version the server reports; the newest SGLang one if it reports "
        "none)",
    )
    api_key: SecretStr | None = setting(None, env=("DRAFTGEN_API_KEY", "OPENAI_API_KEY"))
    request_timeout_s: float = setting(1800.0, cli=True, aliases=("--request-timeout",), gt=0)
    max_attempts: int = setting(
        5, cli=True, help="attempts for transient errors before a dead letter", gt=0
    )
    # every request's claim in the ledger (streams/generate/claims.py): other workers wait for
    # it instead of asking their servers; its holder renews it every third of this while the
    # request runs, so a killed or stalled worker's claims lapse within it
    claim_s: float = setting(
        15.0,
        cli=True,
        help="a request's claim, renewed while its request runs, lapses S seconds after its "
        "last renewal (a killed or stalled worker's)",
        gt=0,
    )
    # SIGTERM: requests running are finished for up to this long before the worker exits
    # (their partitions move at once; the new owners wait for the claims); a request whose
    # server is down or hung ends at once and its prompt goes back
    drain_s: float = setting(
        1800.0,
        cli=True,
        help="on SIGTERM, finish the requests running for up to S seconds, then release them "
        "to other workers (a server that is down ends them at once)",
        ge=0,
    )
    # while requests run, the server is probed this often (streams/generate/gate.py): a probe
    # that fails stops new requests; the running ones end only if the server refuses
    # connections or makes no progress (below)
    health_watch_s: float = setting(
        5.0,
        cli=True,
        help="probe the server every S seconds while requests run; while it does not answer, "
        "it gets no new requests",
        gt=0,
    )
    # a server whose probe fails and that has finished no request (and answered no probe) for
    # this long is taken for hung (SIGSTOP, a hung collective): its requests end and go to other
    # servers. Above the time a busy server can go without finishing one (few slots and long
    # answers, the first answers of a run), since ending them throws their work away
    health_stall_s: float = setting(
        120.0,
        cli=True,
        help="a server whose health probe fails and that finished no request for S seconds is "
        "taken for hung: its running requests go to other servers",
        gt=0,
    )
    backoff_initial_s: float = setting(1.0, gt=0)
    backoff_max_s: float = setting(60.0, gt=0)
    # longest gap between two health probes of a server that is down
    health_interval_s: float = setting(2.0, gt=0)
    # each health probe's wait for its answer; one not answered in time is "slow" (busy or
    # hung), not "down" (SGLang's own probe waits up to 20 s for a free slot, then says 503)
    health_timeout_s: float = setting(10.0, gt=0)
    # static membership (streams/core/membership.py): a restart with the same id takes its old
    # place and partitions without a rebalance. None: this host, the server and the first slot
    # free on this host for that server (a lock file in --state-dir), unless turned off below
    instance_id: SafeName | None = setting(
        None,
        cli=True,
        help="static group membership id, unique per live worker (default: this host's name, "
        "the server and a slot free on this host)",
    )
    # off: a stopped worker leaves the group at once (its partitions move without waiting for
    # the session timeout), and a restarted one is a new member: one rebalance each way
    static_membership: bool = setting(
        True,
        cli=True,
        help="join as a dynamic member: a stopped worker's partitions move at once, but every "
        "restart rebalances the group",
    )

    @property
    def starting_concurrency(self) -> int:
        """Requests in flight before the server is asked: the number given, or the default with
        --concurrency auto (the consumer's prefetch is set from it before the server answers)."""
        return self.concurrency if isinstance(self.concurrency, int) else DEFAULT_CONCURRENCY

    @model_validator(mode="after")
    def _native_needs_a_tokenizer(self) -> GenerateSettings:
        if self.api == "native" and not self.tokenizer_dir:
            raise ValueError("--api native needs --tokenizer-dir (the target's tokenizer)")
        return self


class OnceSettings(Settings):
    """Each prompt once per generation settings (the `generated` ledger), and work stealing."""

    ledger: bool = setting(
        True,
        cli=True,
        help="do not consult or write the `generated` ledger (generate every prompt received)",
    )
    # seconds with a free slot and no own prompt before stealing from the end of other
    # workers' backlogs (streams/generate/steal.py); 0: never steal. On by default: without it
    # the end of every finite run leaves servers idle while others work through their
    # partitions (BENCHMARKS.md, "The end of a finite run")
    steal_after_s: float = setting(
        2.0,
        cli=True,
        aliases=("--steal-after",),
        help="after S seconds with a free slot and no prompt of its own, take prompts from the "
        "end of other workers' backlogs (0: never)",
        ge=0,
    )
    # most prompts taken per steal (never more than the free slots); 0: the worker's concurrency
    steal_batch: int = setting(0, cli=True, help="most prompts per steal (0: --concurrency)", ge=0)


class TokenizeSettings(Settings):
    tokenizer_dir: TokenizerDir = setting(
        cli=True, aliases=("--tokenizer",), help="the target's tokenizer directory"
    )
    dataset: DatasetName = dataset_setting()
    storage: StorageSettings
    kafka: KafkaSettings = setting(default_factory=lambda: KafkaSettings())
    family: FamilyName | None = setting(
        None,
        cli=True,
        help="model family (default: detected from the tokenizer's template)",
    )
    chat_template_file: str | None = setting(
        None, cli=True, aliases=("--chat-template",), help="a .jinja file overriding the template"
    )
    # preferred source when the server's ids exist
    token_source: Literal["server", "rendered"] = setting(
        "server",
        cli=True,
        help="which ids to store when the server returned its own",
    )
    shard_max_records: int = setting(2000, cli=True, aliases=("--shard-records",), gt=0)
    shard_max_tokens: int = setting(8_000_000, cli=True, aliases=("--shard-tokens",), gt=0)
    idle_flush_s: float = setting(
        10.0,
        cli=True,
        aliases=("--idle-flush",),
        help="seconds before an idle partition's open shard is written",
        gt=0,
    )
    # what all open windows of a worker may hold together (a record counts twice its size: its
    # bytes and its decoded form); past it the largest window is flushed early: memory stays
    # bounded whatever the backlog (sinks/sink.py)
    max_open_bytes: int = setting(
        256 * 1024 * 1024,
        cli=True,
        help="memory all open windows of a worker hold at most (a record counts twice its "
        "size: its bytes and its decoded form)",
        gt=0,
    )
    # group per dataset version; None: derived from the dataset name
    group_id: SafeName | None = None
    from_beginning: bool = True
    # only the completions of the prompt ids in this file (a JSON list; a conversation's id
    # takes its turns): `run` gives its workers the run's prompts, so that its version holds
    # them and nothing else of a shared completions topic; None: every completion
    prompts_file: str | None = None
    # compare server ids with the rendering (costs a render + encode per server sample)
    measure_drift: bool = setting(
        True,
        cli=True,
        aliases=("--no-drift",),
        help="do not compare server ids with the rendering (saves a render + encode per sample)",
    )
    # the drift check re-encodes every turn (a model's own non-canonical spelling of its text is
    # drift); off: a turn the server's ids spell is not encoded (streams/tokenize/samples.py)
    encode_turns: bool = setting(
        True,
        cli=True,
        help="drift check: do not re-encode a turn the server's ids spell (cheaper; a model's "
        "own non-canonical spelling of its text is then not counted as drift)",
    )
    # auto: a tiktoken twin of the tokenizer when it encodes exactly as the tokenizer, checked
    # as it runs (streams/tokenize/encoder.py); tokenizer: always the tokenizer's own encoder
    encoder: Literal["auto", "tokenizer"] = setting(
        "auto",
        cli=True,
        help="auto: tiktoken's faster BPE when it matches the tokenizer exactly; "
        "tokenizer: the tokenizer's own",
    )
    policy: SamplePolicy = setting(default_factory=lambda: SamplePolicy())

    @property
    def consumer_group(self) -> str:
        return self.kafka.group(self.group_id or tokenize_group_name(self.dataset))


class ObserveSettings(Settings):
    """Worker metrics, heartbeats and local state."""

    # None: no /metrics endpoint; 0: a free port
    metrics_port: int | None = setting(
        None,
        cli=True,
        help="serve Prometheus /metrics on this port (0: a free one; default: off)",
        ge=0,
        le=65535,
    )
    metrics_host: str = setting(
        "127.0.0.1",
        cli=True,
        help="address /metrics binds to (0.0.0.0 for a scraper elsewhere)",
    )
    # 0: no heartbeats (the worker is then invisible to `status`)
    heartbeat_s: float = setting(
        5.0,
        cli=True,
        aliases=("--heartbeat-interval",),
        help="seconds between heartbeats to the worker-stats topic (0: none)",
        ge=0,
    )
    rate_window_s: float = setting(30.0, gt=0)
    # the crash record (streams/core/crash_guard.py) and a generate worker's member slot
    # (streams/core/membership.py); None: ~/.local/state/draftgen
    state_dir: str | None = setting(
        None,
        cli=True,
        help="where the worker notes a record it crashed on and holds its member slot "
        "(default ~/.local/state/draftgen)",
    )
