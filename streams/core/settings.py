"""Every setting of the pipeline, declared once.

Each field says its default, its range, its command-line flag (`flag=`) and its environment
name (`DRAFTGEN_` + the field name unless `env=` says otherwise); the command line derives its
flags from these classes (streams/cli/flags.py) and `draftgen run` hands whole settings objects
to the workers it starts. Secrets are `SecretStr`: they come from the environment only, print as
`**********` and are left out when settings are written for a child process.
"""

from __future__ import annotations

import re
import ssl
from pathlib import Path
from typing import Annotated, Any, Literal
from urllib.parse import urlsplit

from aiokafka.record.default_records import DefaultRecordBatchBuilder
from pydantic import (
    AfterValidator,
    AliasChoices,
    BaseModel,
    BeforeValidator,
    Field,
    SecretStr,
    field_validator,
    model_validator,
)
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
)

from streams.core.stack_state import StackState, live_stack

PROMPTS = "prompts"
COMPLETIONS = "completions"
DEAD_LETTERS = "dead-letters"
GENERATE_GROUP = "draftgen-generate"
# compacted: the latest heartbeat of each live worker, read by `draftgen status`
WORKER_STATS = "worker-stats"
# compacted: one record per (prompt_id, generation settings) generated (streams/core/ledger.py)
GENERATED = "generated"

# Names that become paths, topics, consumer groups or member ids: Kafka's topic alphabet, a
# letter or digit first (so never "." or ".."), short enough for every use.
_SAFE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}")
_SAFE_PREFIX = re.compile(r"[A-Za-z0-9._-]{0,100}")
_ALPHABET = "letters, digits, '.', '_' and '-'"


def _safe_name(value: str) -> str:
    if not _SAFE_NAME.fullmatch(value):
        raise ValueError(
            f"{value!r} is not a safe name: use 1-100 of {_ALPHABET}, starting with a letter "
            "or digit"
        )
    return value


def _safe_prefix(value: str) -> str:
    if not _SAFE_PREFIX.fullmatch(value):
        raise ValueError(f"{value!r} is not a safe prefix: use at most 100 of {_ALPHABET}")
    return value


# a dataset version, an instance id, a group: used in paths, group and member ids
SafeName = Annotated[str, AfterValidator(_safe_name)]
# the topic and group prefix (may be empty)
SafePrefix = Annotated[str, AfterValidator(_safe_prefix)]

_HOST_PORT = re.compile(r"(?P<host>\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9._-]+):(?P<port>[0-9]{1,5})")


def _bootstrap(value: str) -> str:
    """host:port[,host:port]: checked here, as aiokafka fails on it with a traceback."""
    for server in value.split(","):
        found = _HOST_PORT.fullmatch(server.strip())
        if found is None or not 1 <= int(found["port"]) <= 65535:
            raise ValueError(
                f"{value!r} is not a list of servers: use host:port[,host:port], ports 1-65535"
            )
    return value


def _server_url(value: str) -> str:
    """An http(s) base URL with a host: anything else would be retried as a server that is
    down, forever."""
    try:
        url = urlsplit(value.strip())
        port_ok = url.port is None or url.port > 0  # .port raises on a bad one
    except ValueError:
        port_ok = False
    if not port_ok or url.scheme not in ("http", "https") or not url.hostname:
        raise ValueError(f"{value!r} is not a server URL: use http://host[:port] or https://…")
    return value.strip()


# what fsspec may write shards to; anything else fails late, or (memory://) loses them
_OUT_SCHEMES = ("file", "s3", "s3a")


def _output_root(value: str) -> str:
    scheme = value.partition("://")[0].lower() if "://" in value else None
    if not value.strip() or (scheme is not None and scheme not in _OUT_SCHEMES):
        raise ValueError(
            f"{value!r} is not an output root: use a local path, file://… or s3://bucket/prefix"
        )
    return value


Bootstrap = Annotated[str, AfterValidator(_bootstrap)]
ServerUrl = Annotated[str, AfterValidator(_server_url)]
OutputRoot = Annotated[str, AfterValidator(_output_root)]
SecurityProtocol = Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"]
# aiokafka's mechanisms
SaslMechanism = Literal["PLAIN", "GSSAPI", "SCRAM-SHA-256", "SCRAM-SHA-512", "OAUTHBEARER"]


def _concurrency(value: object) -> object:
    """A positive integer, or "auto" (the server's max_running_requests, read at start)."""
    if isinstance(value, str):
        text = value.strip().lower()
        if text == "auto":
            return "auto"
        if text.isdigit():
            value = int(text)
    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
        return value
    raise ValueError(f"{value!r} is not a concurrency: use a positive integer or 'auto'")


# requests in flight against one server when not given, or when "auto" finds no cap
DEFAULT_CONCURRENCY = 32


def generate_prefetch(concurrency: int) -> int:
    """Prompts a generate worker's consumer holds beyond its requests in flight: small, so a
    slow server does not sit on a backlog that idle workers could take."""
    return max(4, concurrency // 4)


def generate_window(concurrency: int) -> int:
    """The most prompts of its partitions a generate worker holds (in flight or prefetched)
    past its committed offsets, give or take the last second's acks not yet committed."""
    return concurrency + generate_prefetch(concurrency)


Concurrency = Annotated[int | Literal["auto"], BeforeValidator(_concurrency)]

Family = Literal["kimi_k2", "qwen3", "generic"]
KeepOrDrop = Literal["drop", "keep"]
OverLength = Literal["drop", "truncate"]
ExportFormat = Literal["specforge", "hf", "parquet", "conversations"]
RegenMode = Literal["final", "every-turn"]
GenerateApi = Literal["chat", "native"]
# SGLang request-preprocessing profiles (streams/core/serving.py PROFILE_NAMES; a test checks)
Normalization = Literal[
    "sglang-0.5.1",
    "sglang-0.5.4",
    "sglang-0.5.9",
    "sglang-0.5.10",
    "sglang-0.5.11",
    "sglang-0.5.23",
]
Compression = Literal["gzip", "none"]


def setting(
    default: Any = ...,
    *,
    flag: str | None = None,
    help: str | None = None,
    env: tuple[str, ...] = (),
    default_factory: Any = None,
    nargs: str | None = None,
    const: Any = None,
    metavar: str | None = None,
    **constraints: Any,
) -> Any:
    """A settings field: `flag` is its command-line option (a `--no-x` flag sets a bool to False),
    `env` its environment names when they differ from `DRAFTGEN_<FIELD>`."""
    cli = {"flag": flag, "help": help, "nargs": nargs, "const": const, "metavar": metavar}
    extra = {k: v for k, v in cli.items() if v is not None}
    if env:
        constraints["validation_alias"] = AliasChoices(*env)
    if default_factory is not None:
        return Field(default_factory=default_factory, json_schema_extra=extra, **constraints)
    return Field(default, json_schema_extra=extra, **constraints)


class Settings(BaseSettings):
    """Base of every settings class: `DRAFTGEN_` environment names, immutable, strict keys."""

    model_config = SettingsConfigDict(
        env_prefix="DRAFTGEN_",
        frozen=True,
        extra="forbid",
        populate_by_name=True,
        # An empty variable means "not set", as in the rest of the shell world.
        env_ignore_empty=True,
        # nan compares false with every bound and inf passes `gt=0`: neither is a setting
        # (an --idle-flush of nan never flushed)
        allow_inf_nan=False,
    )


class StackSettings(Settings):
    """Where the local stack (`draftgen stack up`) keeps its state file and data."""

    stack_dir: str = setting(
        "~/.local/state/draftgen/stack",
        flag="--stack-dir",
        help="the local stack's state and data (default ~/.local/state/draftgen/stack)",
    )

    @property
    def path(self) -> Path:
        return Path(self.stack_dir).expanduser()


def current_stack() -> StackState | None:
    """The local stack that runs now (`draftgen stack up`), if any."""
    return live_stack(StackSettings().path)


class _StackBootstrap(PydanticBaseSettingsSource):
    """The running local stack's broker: after the flag and the environment, before nothing."""

    def get_field_value(self, field: Any, field_name: str) -> tuple[Any, str, bool]:
        return None, field_name, False

    def __call__(self) -> dict[str, Any]:
        # the flag or the environment named one already (by the field's name or its alias)
        if self.current_state.keys() & {"bootstrap", "DRAFTGEN_BOOTSTRAP", "draftgen_bootstrap"}:
            return {}
        stack = current_stack()
        return {"bootstrap": stack.bootstrap} if stack is not None else {}


class KafkaSettings(Settings):
    model_config = SettingsConfigDict(env_prefix="DRAFTGEN_KAFKA_")

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        # a flag, then the environment, then the local stack (`draftgen stack up`)
        stack = _StackBootstrap(settings_cls)
        return init_settings, env_settings, dotenv_settings, file_secret_settings, stack

    bootstrap: Bootstrap = setting(
        flag="--bootstrap",
        help="Kafka bootstrap servers host:port[,host:port]",
        env=("DRAFTGEN_BOOTSTRAP",),
    )
    # Lets several pipelines (and tests) share one broker without sharing topics or groups.
    topic_prefix: SafePrefix = setting(
        "", flag="--topic-prefix", help="prefix for topic and group names"
    )
    partitions: int = setting(
        64, flag="--partitions", help="partitions for topics this command creates", gt=0
    )
    security_protocol: SecurityProtocol = "PLAINTEXT"
    sasl_mechanism: SaslMechanism | None = None
    sasl_username: str | None = None
    sasl_password: SecretStr | None = None
    ssl_cafile: str | None = None
    # The one size limit of a message: the producers' max_request_size, the topics'
    # max.message.bytes at creation and the consumers' fetch sizes all derive from it
    # (`producer_kwargs`, `consumer_kwargs`, streams/core/topics.py), so a message a producer
    # accepted is stored and fetchable. A larger completion is a `record_too_large` dead letter.
    max_message_bytes: int = setting(8 * 1024 * 1024, gt=0)
    # What the pipeline's producers compress with: a 128K-token completion is ~1.6 MB of JSON,
    # ~2.5x smaller gzipped. gzip needs no extra package (lz4/zstd/snappy need cramjam).
    compression: Compression = "gzip"
    # Group liveness: a crashed consumer's partitions move after the session timeout, and a
    # restarted one without --instance-id waits for its dead predecessor to expire. Heartbeats
    # are sent every session/10 s from the event loop, which never blocks (tokenizing runs in a
    # thread), so 10 s is safe and keeps recovery after kill -9 within ~15 s (README).
    session_timeout_s: float = setting(10.0, gt=0)
    # a generation may take minutes, so the poll interval is long (faust default: 300 s)
    max_poll_interval_s: float = setting(1000.0, gt=0)
    # Durability on a cluster (streams/core/topics.py): copies of each partition of the topics
    # this project creates, and how many of them must hold a write before it is acknowledged
    # (every producer of pipeline records writes with acks=all and idempotence). None: min(3,
    # brokers in the cluster) replicas, and replicas - 1 (at least 1) in sync for the topics
    # that hold data. A single local broker gets 1 and 1, as before.
    replication_factor: int | None = setting(
        None,
        flag="--replication-factor",
        help="replicas of each topic this command creates (default: min(3, brokers))",
        gt=0,
    )
    min_insync_replicas: int | None = setting(
        None,
        flag="--min-insync-replicas",
        help="replicas that must hold a write before Kafka acknowledges it, for the topics "
        "that hold data (default: replicas - 1, at least 1)",
        gt=0,
    )

    @field_validator("security_protocol", "sasl_mechanism", mode="before")
    @classmethod
    def _any_case(cls, value: object) -> object:
        return value.upper() if isinstance(value, str) else value

    @property
    def rebalance_timeout_s(self) -> float:
        return self.session_timeout_s

    @property
    def heartbeat_interval_s(self) -> float:
        return max(1.0, self.session_timeout_s / 10)

    def topic(self, name: str) -> str:
        return f"{self.topic_prefix}{name}"

    def group(self, name: str) -> str:
        return f"{self.topic_prefix}{name}"

    def sasl_secret(self) -> str | None:
        return self.sasl_password.get_secret_value() if self.sasl_password else None

    def ssl_context(self) -> ssl.SSLContext | None:
        if "SSL" not in self.security_protocol:
            return None
        return ssl.create_default_context(cafile=self.ssl_cafile)

    @property
    def topic_max_message_bytes(self) -> int:
        """The topics' max.message.bytes: the broker checks a compressed batch, which gzip can
        make a little larger than the message the producer checked (stored blocks of data that
        does not compress: 5 bytes per 64 KiB), plus the batch header."""
        return self.max_message_bytes + self.max_message_bytes // 8192 + 1024

    @property
    def compression_type(self) -> str | None:
        return None if self.compression == "none" else self.compression

    @model_validator(mode="after")
    def _insync_within_replicas(self) -> KafkaSettings:
        if (
            self.replication_factor is not None
            and self.min_insync_replicas is not None
            and self.min_insync_replicas > self.replication_factor
        ):
            raise ValueError(
                f"--min-insync-replicas {self.min_insync_replicas} is more than "
                f"--replication-factor {self.replication_factor}: no write could be acknowledged"
            )
        return self

    def replicas_for(self, brokers: int) -> tuple[int, int]:
        """(replication factor, min.insync.replicas of the data topics) on a cluster of
        `brokers` brokers: the settings, or min(3, brokers) and one less (at least 1)."""
        replicas = self.replication_factor or min(3, max(1, brokers))
        insync = self.min_insync_replicas or max(1, replicas - 1)
        return replicas, insync

    def producer_kwargs(self) -> dict[str, Any]:
        """Every producer of the pipeline's records: its size limit and compression, and
        acks from every in-sync replica with idempotence, so a write acknowledged survives the
        loss of a broker and a retried one is stored once."""
        return {
            "max_request_size": self.max_message_bytes,
            "compression_type": self.compression_type,
            "acks": "all",
            "enable_idempotence": True,
        }

    def too_large(self, key: bytes | None, value: bytes) -> str | None:
        """Why the producers would refuse this message (by their own estimate), or None."""
        size = DefaultRecordBatchBuilder.estimate_size_in_bytes(key, value, [])
        if size <= self.max_message_bytes:
            return None
        return (
            f"a {size}-byte message is over the {self.max_message_bytes}-byte limit "
            "(DRAFTGEN_KAFKA_MAX_MESSAGE_BYTES)"
        )

    def value_budget(self, key: bytes | None) -> int:
        """The largest value that goes with `key` under the producers' limit: what a dead
        letter is cut to (streams/core/delivery.py). The topics' limit is above the producers'
        (`topic_max_message_bytes`), so the producers' is the one that binds."""
        overhead = DefaultRecordBatchBuilder.estimate_size_in_bytes(key, b"", [])
        return self.max_message_bytes - overhead - 8  # the value's length varint grows

    def consumer_kwargs(self) -> dict[str, Any]:
        """Fetch sizes that take any message a topic accepts (the broker also returns a first
        batch larger than them, but a fetch that fits is the normal case)."""
        fetch = self.topic_max_message_bytes
        return {"max_partition_fetch_bytes": fetch, "fetch_max_bytes": max(fetch, 50 * 1024 * 1024)}

    def aiokafka_kwargs(self) -> dict[str, Any]:
        """Connection settings for aiokafka clients (producer, consumer, admin)."""
        kwargs: dict[str, Any] = {
            "bootstrap_servers": self.bootstrap,
            "security_protocol": self.security_protocol,
        }
        if self.ssl_context() is not None:
            kwargs["ssl_context"] = self.ssl_context()
        if self.sasl_mechanism:
            kwargs["sasl_mechanism"] = self.sasl_mechanism
            kwargs["sasl_plain_username"] = self.sasl_username
            kwargs["sasl_plain_password"] = self.sasl_secret()
        return kwargs


class StorageSettings(Settings):
    """Where shards go: a local path or any fsspec URL (s3://bucket/prefix)."""

    out: OutputRoot = setting(
        flag="--out", help="output root: a local path, file:// or s3://bucket/prefix"
    )
    s3_endpoint_url: str | None = setting(
        None, env=("DRAFTGEN_S3_ENDPOINT_URL", "AWS_ENDPOINT_URL")
    )
    s3_access_key: SecretStr | None = setting(
        None, env=("DRAFTGEN_S3_ACCESS_KEY", "AWS_ACCESS_KEY_ID")
    )
    s3_secret_key: SecretStr | None = setting(
        None, env=("DRAFTGEN_S3_SECRET_KEY", "AWS_SECRET_ACCESS_KEY")
    )
    s3_region: str | None = setting(None, env=("AWS_REGION", "AWS_DEFAULT_REGION"))

    def storage_options(self) -> dict[str, Any]:
        if not self.out.startswith(("s3://", "s3a://")):
            return {}
        options: dict[str, Any] = {}
        endpoint = self.s3_endpoint_url
        if self.s3_access_key and self.s3_secret_key:
            options["key"] = self.s3_access_key.get_secret_value()
            options["secret"] = self.s3_secret_key.get_secret_value()
        elif endpoint is None and (stack := current_stack()) is not None and stack.holds(self.out):
            # the local stack's bucket: its SeaweedFS and credentials, from its state file
            options["key"], options["secret"] = stack.s3_access_key, stack.s3_secret_key
            endpoint = stack.s3_endpoint_url
        client_kwargs: dict[str, Any] = {}
        if endpoint:
            client_kwargs["endpoint_url"] = endpoint
        if self.s3_region:
            client_kwargs["region_name"] = self.s3_region
        if client_kwargs:
            options["client_kwargs"] = client_kwargs
        # Outages are waited out by our own retry loops; botocore's should fail fast instead.
        options["config_kwargs"] = {"connect_timeout": 10, "retries": {"max_attempts": 3}}
        return options


class SamplingSettings(Settings):
    temperature: float = setting(1.0, flag="--temperature", ge=0)
    top_p: float = setting(0.95, flag="--top-p", gt=0, le=1)
    max_tokens: int = setting(8192, flag="--max-tokens", gt=0)
    seed: int | None = setting(None, flag="--seed")

    def as_dict(self) -> dict[str, Any]:
        return {k: v for k, v in self.model_dump().items() if v is not None}


class SamplePolicy(Settings):
    """What the tokenize stage keeps (streams/tokenize/policies.py); drops become dead letters."""

    length: KeepOrDrop = setting(
        "drop", flag="--on-length", help="outputs cut by max tokens, finish_reason=length"
    )
    unclosed_think: KeepOrDrop = setting(
        "drop", flag="--on-unclosed-think", help="outputs that never closed </think>: all reasoning"
    )
    empty_answer: KeepOrDrop = setting(
        "drop", flag="--on-empty-answer", help="outputs without content or tool calls"
    )
    max_seq_len: int | None = setting(
        None,
        flag="--max-seq-len",
        help="longest sample in tokens, prompt included (default: no limit)",
        gt=0,
    )
    over_max_seq_len: OverLength = setting(
        "drop", flag="--on-max-seq-len", help="samples longer than --max-seq-len"
    )
    min_loss_run: int = setting(
        2,
        flag="--min-loss-run",
        help="fewest consecutive supervised tokens a sample needs",
        gt=0,
    )


class RetrySettings(Settings):
    """Backoff of every outage loop (streams/core/retry.py)."""

    model_config = SettingsConfigDict(env_prefix="DRAFTGEN_RETRY_")

    initial_s: float = setting(1.0, gt=0)
    max_s: float = setting(60.0, gt=0)
    jitter: float = setting(0.5, ge=0, lt=1)


class GenerateSettings(Settings):
    server: ServerUrl = setting(flag="--server", help="the SGLang server's base URL")
    kafka: KafkaSettings = setting(default_factory=lambda: KafkaSettings())
    concurrency: Concurrency = setting(
        DEFAULT_CONCURRENCY,
        flag="--concurrency",
        help="requests kept in flight against the server; auto: the server's "
        f"max_running_requests (from /server_info; {DEFAULT_CONCURRENCY} if it does not say)",
        metavar="N|auto",
    )
    sampling: SamplingSettings = setting(default_factory=lambda: SamplingSettings())
    # None: ask the server which model it serves
    model: str | None = setting(
        None, flag="--model", help="served model name (default: ask the server)"
    )
    # family name whose thinking kwarg is sent; None: detect from the model name
    family: Family | None = setting(
        None,
        flag="--family",
        help="model family for the thinking kwarg (default: from the model name)",
    )
    thinking: bool = setting(True, flag="--no-thinking", help="generate with thinking off")
    # ask the server for its exact token ids (the way is probed at start: exact_ids.py)
    return_token_ids: bool = True
    # native: for servers whose chat endpoint returns no ids (streams/generate/native.py)
    api: GenerateApi = setting(
        "chat",
        flag="--api",
        help="chat: /v1/chat/completions; native: render the prompt with --tokenizer and post "
        "its ids to SGLang's /generate, so the output ids are exact on any server version",
    )
    tokenizer_dir: str | None = setting(
        None,
        flag="--tokenizer",
        help="the target's tokenizer directory, the one the server uses (for --api native)",
    )
    # None: the profile of the SGLang version the server reports at start (newest if it says
    # none); recorded per completion, so the tokenize stage renders as the server did
    normalization: Normalization | None = setting(
        None,
        flag="--normalization",
        help="render prompts as this SGLang version range preprocesses chat requests "
        "(default: from the version the server reports; the newest if it reports none)",
    )
    api_key: SecretStr | None = setting(None, env=("DRAFTGEN_API_KEY", "OPENAI_API_KEY"))
    request_timeout_s: float = setting(1800.0, flag="--request-timeout", gt=0)
    max_attempts: int = setting(
        5, flag="--max-attempts", help="attempts for transient errors before a dead letter", gt=0
    )
    backoff_initial_s: float = setting(1.0, gt=0)
    backoff_max_s: float = setting(60.0, gt=0)
    # longest gap between two health probes of a server that is down
    health_interval_s: float = setting(2.0, gt=0)
    # static membership: a restart with the same id does not rebalance the group
    instance_id: SafeName | None = setting(
        None,
        flag="--instance-id",
        help="static group membership id: a restart does not rebalance",
    )

    @model_validator(mode="after")
    def _native_needs_a_tokenizer(self) -> GenerateSettings:
        if self.api == "native" and not self.tokenizer_dir:
            raise ValueError("--api native needs --tokenizer (the target's tokenizer directory)")
        return self


class OnceSettings(Settings):
    """Each prompt once per generation settings (the `generated` ledger), and work stealing."""

    ledger: bool = setting(
        True,
        flag="--no-ledger",
        help="do not consult or write the `generated` ledger (generate every prompt received)",
    )
    # seconds with a free slot and no own prompt before stealing from the end of other
    # workers' backlogs (streams/generate/steal.py); 0: never steal. On by default: without it
    # the end of every finite run leaves servers idle while others work through their
    # partitions (BENCHMARKS.md, "The end of a finite run")
    steal_after_s: float = setting(
        2.0,
        flag="--steal-after",
        help="after S seconds with a free slot and no prompt of its own, take prompts from the "
        "end of other workers' backlogs (0: never)",
        ge=0,
    )
    # never steal the owner's next `steal_margin` prompts of a partition: its committed offset
    # lags its position by up to its whole window (requests in flight, prefetched prompts),
    # so a thief taking less far ahead takes prompts the owner holds already (a duplicate
    # request each). None: that window, `generate_window(concurrency)` of the thief's own
    steal_margin: int | None = setting(
        None,
        flag="--steal-margin",
        help="leave the next N prompts of each partition to its owner (default: a worker's "
        "window, --concurrency plus its prefetch)",
        ge=0,
    )
    # most prompts taken per steal (never more than the free slots); 0: the worker's concurrency
    steal_batch: int = setting(
        0, flag="--steal-batch", help="most prompts per steal (0: --concurrency)", ge=0
    )


class TokenizeSettings(Settings):
    tokenizer_dir: str = setting(flag="--tokenizer", help="the target's tokenizer directory")
    dataset: SafeName = setting(flag="--dataset", help="dataset version name")
    storage: StorageSettings
    kafka: KafkaSettings = setting(default_factory=lambda: KafkaSettings())
    family: Family | None = setting(
        None,
        flag="--family",
        help="model family (default: detected from the tokenizer's template)",
    )
    chat_template_file: str | None = setting(
        None, flag="--chat-template", help="a .jinja file overriding the template"
    )
    # preferred source when the server's ids exist
    token_source: Literal["server", "rendered"] = setting(
        "server",
        flag="--token-source",
        help="which ids to store when the server returned its own",
    )
    shard_max_records: int = setting(2000, flag="--shard-records", gt=0)
    shard_max_tokens: int = setting(8_000_000, flag="--shard-tokens", gt=0)
    idle_flush_s: float = setting(
        10.0,
        flag="--idle-flush",
        help="seconds before an idle partition's open shard is written",
        gt=0,
    )
    # what all open windows of a worker may hold together (a record counts twice its size: its
    # bytes and its decoded form); past it the largest window is flushed early: memory stays
    # bounded whatever the backlog (sinks/sink.py)
    max_open_bytes: int = setting(
        256 * 1024 * 1024,
        flag="--max-open-bytes",
        help="memory all open windows of a worker hold at most (a record counts twice its "
        "size: its bytes and its decoded form)",
        gt=0,
    )
    # group per dataset version; None: derived from the dataset name
    group_id: SafeName | None = None
    from_beginning: bool = True
    # compare server ids with the rendering (costs a render + encode per server sample)
    measure_drift: bool = setting(
        True,
        flag="--no-drift",
        help="do not compare server ids with the rendering (saves a render + encode per sample)",
    )
    # auto: a tiktoken twin of the tokenizer when it encodes exactly as the tokenizer, checked
    # as it runs (streams/tokenize/encoder.py); tokenizer: always the tokenizer's own encoder
    encoder: Literal["auto", "tokenizer"] = setting(
        "auto",
        flag="--encoder",
        help="auto: tiktoken's faster BPE when it matches the tokenizer exactly; "
        "tokenizer: the tokenizer's own",
    )
    policy: SamplePolicy = setting(default_factory=lambda: SamplePolicy())

    @property
    def consumer_group(self) -> str:
        return self.kafka.group(self.group_id or f"draftgen-tokenize-{self.dataset}")


class ObserveSettings(Settings):
    """Worker metrics, heartbeats and local state."""

    # None: no /metrics endpoint; 0: a free port
    metrics_port: int | None = setting(
        None,
        flag="--metrics-port",
        help="serve Prometheus /metrics on this port (0: a free one; default: off)",
        ge=0,
        le=65535,
    )
    metrics_host: str = setting(
        "127.0.0.1",
        flag="--metrics-host",
        help="address /metrics binds to (0.0.0.0 for a scraper elsewhere)",
    )
    # 0: no heartbeats (the worker is then invisible to `status`)
    heartbeat_s: float = setting(
        5.0,
        flag="--heartbeat-interval",
        help="seconds between heartbeats to the worker-stats topic (0: none)",
        ge=0,
    )
    rate_window_s: float = setting(30.0, gt=0)
    # the crash record (streams/core/crash_guard.py); None: ~/.local/state/draftgen
    state_dir: str | None = setting(
        None,
        flag="--state-dir",
        help="where the worker notes a record it crashed on (default ~/.local/state/draftgen)",
    )


class PublishSettings(Settings):
    limit: int | None = setting(
        None, flag="--limit", help="publish at most this many prompts", gt=0
    )
    progress: bool = setting(True, flag="--no-progress", help="no progress bar")
    regenerate: bool = setting(
        False,
        flag="--regenerate",
        help="publish and generate prompts even if the `generated` ledger has them",
    )
    regen: RegenMode = setting(
        "final",
        flag="--regen",
        help="final: answer the last turn; every-turn: regenerate each assistant turn of "
        "conversations without tool results, one sample per turn",
    )
    id_field: str = setting(
        "id",
        flag="--id-field",
        help="the source rows' field that holds their own id, carried to the shards as "
        "`source_id` (rows without it: null)",
        min_length=1,
        max_length=200,
    )


def secrets_removed(settings: BaseModel) -> dict[str, Any]:
    """The settings as JSON-able values without their secrets (a child reads those from its
    environment, as its parent did)."""
    values: dict[str, Any] = {}
    for name in type(settings).model_fields:
        value = getattr(settings, name)
        if isinstance(value, SecretStr):
            continue
        values[name] = secrets_removed(value) if isinstance(value, BaseModel) else value
    return values


class LogSettings(Settings):
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = setting(
        "WARNING", flag="--log-level", env=("DRAFTGEN_LOG_LEVEL",)
    )

    @field_validator("log_level", mode="before")
    @classmethod
    def _any_case(cls, level: object) -> object:
        return level.upper() if isinstance(level, str) else level


class RunSettings(Settings):
    """`draftgen run`: what to start when it is not given."""

    server_urls: list[ServerUrl] = setting(
        default_factory=list,
        flag="--server",
        help="an SGLang server URL, repeatable (default: start emulated servers)",
    )
    servers: int = setting(
        2, flag="--servers", help="how many emulated servers to start when no --server", gt=0
    )
    out: OutputRoot | None = setting(
        None, flag="--out", help="output root (default: runs/<time>/out)"
    )
    dataset: SafeName = setting("sample", flag="--dataset", help="dataset version name")
    tokenizer: str | None = setting(
        None,
        flag="--tokenizer",
        help="tokenizer directory (default: the bundled tiny Qwen3.6-format one)",
    )
    workdir: str | None = setting(
        None, flag="--workdir", help="logs and local services (default runs/<time>)"
    )
    timeout_s: float = setting(
        3600.0, flag="--timeout", help="give up if not done after this many seconds", gt=0
    )
    emulator_tokens_per_s: float = setting(
        2000.0,
        flag="--emulator-tokens-per-s",
        help="decode speed of emulated servers, per request",
        gt=0,
    )
    idle_flush_s: float = setting(2.0, gt=0)
    tokenize_workers: int = setting(
        1,
        flag="--tokenize-workers",
        help="tokenize workers to start (they share the completions partitions)",
        gt=0,
    )


class StatusSettings(Settings):
    """`draftgen status`."""

    kafka: KafkaSettings = setting(default_factory=lambda: KafkaSettings())
    out: OutputRoot | None = setting(
        None, flag="--out", help="output root of the dataset versions (for samples and tokens)"
    )
    datasets: list[SafeName] = setting(
        default_factory=list,
        flag="--dataset",
        help="a dataset version, repeatable (default: every one found under --out)",
    )
    watch_s: float | None = setting(
        None,
        flag="--watch",
        help="refresh every SECONDS (default 5) until interrupted",
        nargs="?",
        const=5.0,
        metavar="SECONDS",
        gt=0,
    )
    as_json: bool = setting(False, flag="--json", help="one JSON object (a line per refresh)")

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

    stage: Literal["publish", "generate", "tokenize"] | None = setting(None, flag="--stage")
    kind: str | None = setting(None, flag="--kind", help="reason kind, a glob (e.g. 'http_*')")
    republish: bool = setting(
        False,
        flag="--republish",
        help="send the selected letters' payloads back to their stage's input topic",
    )
    as_json: bool = setting(
        False, flag="--json", help="one JSON object: the counts and every failed prompt"
    )


class ExportSettings(Settings):
    """`draftgen export`: a dataset version as the file a trainer takes (streams/ops/export.py)."""

    model_config = SettingsConfigDict(env_prefix="DRAFTGEN_EXPORT_")

    storage: StorageSettings
    dataset: str = setting(flag="--dataset", help="dataset version name", env=("DRAFTGEN_DATASET",))
    format: ExportFormat = setting(
        flag="--format",
        help="specforge: JSON lines of prompt_id, input_ids, loss_mask; hf: a datasets "
        "save_to_disk directory; parquet: one Parquet file; conversations: each sample's "
        "regenerated conversation (OpenAI messages) from the completions topic, JSON lines "
        "(Parquet when --output ends in .parquet)",
    )
    output: str = setting(
        flag="--output",
        help="the file (specforge, parquet, conversations) or directory (hf, or any format "
        "split by --rows-per-file/--tokens-per-file) to write; new",
    )
    # split into files of at most this many rows / tokens (prompt included, after the cut),
    # so a trainer can load one file at a time
    rows_per_file: int | None = setting(
        None, flag="--rows-per-file", help="at most this many rows a file (default: one file)", ge=1
    )
    tokens_per_file: int | None = setting(
        None,
        flag="--tokens-per-file",
        help="at most this many tokens a file, prompt included (a longer sample gets a file of "
        "its own; default: one file)",
        ge=1,
    )
    # the completions topic, read by --format conversations
    kafka: KafkaSettings | None = setting(default_factory=lambda: _kafka_if_configured())
    sources: list[str] = setting(
        default_factory=list, flag="--source", help="only samples of this source (repeatable)"
    )
    finish_reasons: list[str] = setting(
        default_factory=list,
        flag="--finish-reason",
        help="only samples with this finish reason (repeatable)",
    )
    min_len: int | None = setting(
        None, flag="--min-len", help="fewest tokens, prompt included, before truncation", ge=1
    )
    max_len: int | None = setting(
        None, flag="--max-len", help="most tokens, prompt included, before truncation", ge=1
    )
    max_seq_len: int | None = setting(
        None,
        flag="--max-seq-len",
        help="cut samples to this many tokens, keeping the head (use SpecForge's "
        "data.max_length; default: no limit)",
        gt=0,
    )
    over_max_seq_len: OverLength = setting(
        "truncate", flag="--on-max-seq-len", help="samples longer than --max-seq-len"
    )
    min_loss_run: int = setting(
        2,
        flag="--min-loss-run",
        help="drop samples without this many consecutive supervised tokens after truncation "
        "(2: SpecForge's DFlash minimum; 1: EAGLE-3's)",
        ge=1,
    )


def _kafka_if_configured() -> KafkaSettings | None:
    """The broker's settings when the environment names one, else None (optional Kafka); a
    bad one is an error, not a reason to go without."""
    from pydantic import ValidationError

    try:
        return KafkaSettings()
    except ValidationError as err:
        if all(error["type"] == "missing" for error in err.errors()):
            return None
        raise


class ReportSettings(Settings):
    """`draftgen report`: what a dataset version holds, before GPU-days are spent on it."""

    model_config = SettingsConfigDict(env_prefix="DRAFTGEN_REPORT_")

    storage: StorageSettings
    dataset: str = setting(flag="--dataset", help="dataset version name", env=("DRAFTGEN_DATASET",))
    output: str | None = setting(
        None,
        flag="--output",
        help="directory for report.json, the PNG plots and report.html (default report-DATASET)",
    )
    tokenizer_dir: str | None = setting(
        None,
        flag="--tokenizer",
        help="tokenizer directory for the reasoning/answer split (default: dataset.json's)",
    )
    # dead letters and tokenize heartbeats, when a broker is given
    kafka: KafkaSettings | None = setting(default_factory=_kafka_if_configured)
    bins: int = setting(40, flag="--bins", help="bars per length histogram", gt=1)


class SealSettings(Settings):
    """`draftgen seal`."""

    kafka: KafkaSettings = setting(default_factory=lambda: KafkaSettings())
    storage: StorageSettings
    dataset: str = setting(flag="--dataset", help="dataset version name")
    timeout_s: float = setting(
        600.0,
        flag="--timeout",
        help="give up if the version has not caught up after this many seconds",
        gt=0,
    )


class ReplaySettings(Settings):
    """`draftgen replay --workers N`: N replay workers on this machine."""

    workers: int = setting(
        1,
        flag="--workers",
        help="replay workers to start here; they share the completions partitions",
        gt=0,
    )
    workdir: str | None = setting(
        None,
        flag="--workdir",
        help="with --workers > 1: the workers' settings and logs (default runs/replay-<time>)",
    )
