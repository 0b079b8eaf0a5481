"""Typed settings, one object per component. Secrets come from the environment, never from flags."""

from __future__ import annotations

import os
import ssl
from dataclasses import dataclass, field
from typing import Any, Literal

PROMPTS = "prompts"
COMPLETIONS = "completions"
DEAD_LETTERS = "dead-letters"
GENERATE_GROUP = "draftgen-generate"
# compacted: the latest heartbeat of each live worker, read by `draftgen status`
WORKER_STATS = "worker-stats"
# compacted: one record per (prompt_id, generation settings) generated (streams/core/ledger.py)
GENERATED = "generated"


def _env(name: str) -> str | None:
    value = os.environ.get(name)
    return value if value else None


@dataclass(frozen=True)
class Secret:
    """A value that prints as *** so it can never reach a log line or an error message."""

    value: str = field(repr=False)

    def __repr__(self) -> str:
        return "Secret('***')"

    __str__ = __repr__


@dataclass(frozen=True)
class KafkaSettings:
    bootstrap: str = "127.0.0.1:9092"
    # Lets several pipelines (and tests) share one broker without sharing topics or groups.
    topic_prefix: str = ""
    partitions: int = 64
    security_protocol: str = "PLAINTEXT"
    sasl_mechanism: str | None = None
    sasl_username: str | None = None
    sasl_password: Secret | None = None
    ssl_cafile: str | None = None
    max_message_bytes: int = 8 * 1024 * 1024
    # Group liveness: a crashed consumer's partitions move after the session timeout; a
    # generation may take minutes, so the poll interval is long (faust default: 300 s).
    session_timeout_s: float = 60.0
    rebalance_timeout_s: float = 60.0
    heartbeat_interval_s: float = 3.0
    max_poll_interval_s: float = 1000.0

    @classmethod
    def from_env(
        cls, bootstrap: str, topic_prefix: str = "", partitions: int = 64
    ) -> KafkaSettings:
        password = _env("DRAFTGEN_KAFKA_SASL_PASSWORD")
        session = float(_env("DRAFTGEN_KAFKA_SESSION_TIMEOUT_S") or 60.0)
        return cls(
            session_timeout_s=session,
            rebalance_timeout_s=session,
            heartbeat_interval_s=max(1.0, session / 10),
            bootstrap=bootstrap,
            topic_prefix=topic_prefix,
            partitions=partitions,
            security_protocol=_env("DRAFTGEN_KAFKA_SECURITY_PROTOCOL") or "PLAINTEXT",
            sasl_mechanism=_env("DRAFTGEN_KAFKA_SASL_MECHANISM"),
            sasl_username=_env("DRAFTGEN_KAFKA_SASL_USERNAME"),
            sasl_password=Secret(password) if password else None,
            ssl_cafile=_env("DRAFTGEN_KAFKA_SSL_CAFILE"),
        )

    def topic(self, name: str) -> str:
        return f"{self.topic_prefix}{name}"

    def group(self, name: str) -> str:
        return f"{self.topic_prefix}{name}"

    def ssl_context(self) -> ssl.SSLContext | None:
        if "SSL" not in self.security_protocol:
            return None
        return ssl.create_default_context(cafile=self.ssl_cafile)

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
            kwargs["sasl_plain_password"] = self.sasl_password.value if self.sasl_password else None
        return kwargs


@dataclass(frozen=True)
class StorageSettings:
    """Where shards go: a local path or any fsspec URL (s3://bucket/prefix)."""

    out: str
    s3_endpoint_url: str | None = None
    s3_access_key: Secret | None = None
    s3_secret_key: Secret | None = None
    s3_region: str | None = None

    @classmethod
    def from_env(cls, out: str) -> StorageSettings:
        access = _env("DRAFTGEN_S3_ACCESS_KEY") or _env("AWS_ACCESS_KEY_ID")
        secret = _env("DRAFTGEN_S3_SECRET_KEY") or _env("AWS_SECRET_ACCESS_KEY")
        return cls(
            out=out,
            s3_endpoint_url=_env("DRAFTGEN_S3_ENDPOINT_URL") or _env("AWS_ENDPOINT_URL"),
            s3_access_key=Secret(access) if access else None,
            s3_secret_key=Secret(secret) if secret else None,
            s3_region=_env("AWS_REGION") or _env("AWS_DEFAULT_REGION"),
        )

    def storage_options(self) -> dict[str, Any]:
        if not self.out.startswith(("s3://", "s3a://")):
            return {}
        options: dict[str, Any] = {}
        if self.s3_access_key and self.s3_secret_key:
            options["key"] = self.s3_access_key.value
            options["secret"] = self.s3_secret_key.value
        client_kwargs: dict[str, Any] = {}
        if self.s3_endpoint_url:
            client_kwargs["endpoint_url"] = self.s3_endpoint_url
        if self.s3_region:
            client_kwargs["region_name"] = self.s3_region
        if client_kwargs:
            options["client_kwargs"] = client_kwargs
        # Outages are waited out by our own retry loops; botocore's should fail fast instead.
        options["config_kwargs"] = {"connect_timeout": 10, "retries": {"max_attempts": 3}}
        return options


@dataclass(frozen=True)
class SamplingSettings:
    temperature: float = 1.0
    top_p: float = 0.95
    max_tokens: int = 8192
    seed: int | None = None

    def as_dict(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if v is not None}


KeepOrDrop = Literal["drop", "keep"]
OverLength = Literal["drop", "truncate"]


@dataclass(frozen=True)
class SamplePolicy:
    length: KeepOrDrop = "drop"
    unclosed_think: KeepOrDrop = "drop"
    empty_answer: KeepOrDrop = "drop"
    # None: no limit
    max_seq_len: int | None = None
    over_max_seq_len: OverLength = "drop"
    # longest run of supervised tokens a sample must have
    min_loss_run: int = 2


@dataclass(frozen=True)
class GenerateSettings:
    server: str
    kafka: KafkaSettings
    concurrency: int = 32
    sampling: SamplingSettings = field(default_factory=SamplingSettings)
    # None: ask the server which model it serves
    model: str | None = None
    # family name whose thinking kwarg is sent; None: detect from the model name
    family: str | None = None
    thinking: bool = True
    return_token_ids: bool = True
    api_key: Secret | None = None
    request_timeout_s: float = 1800.0
    max_attempts: int = 5
    backoff_initial_s: float = 1.0
    backoff_max_s: float = 60.0
    health_interval_s: float = 2.0
    # static membership: a restart with the same id does not rebalance the group
    instance_id: str | None = None


@dataclass(frozen=True)
class TokenizeSettings:
    tokenizer_dir: str
    dataset: str
    storage: StorageSettings
    kafka: KafkaSettings
    family: str | None = None
    chat_template_file: str | None = None
    token_source: str = "server"  # preferred source when the server's ids exist
    shard_max_records: int = 2000
    shard_max_tokens: int = 8_000_000
    idle_flush_s: float = 10.0
    # group per dataset version; None: derived from the dataset name
    group_id: str | None = None
    from_beginning: bool = True
    # compare server ids with the rendering (costs a render + encode per server sample)
    measure_drift: bool = True
    policy: SamplePolicy = field(default_factory=SamplePolicy)

    @property
    def consumer_group(self) -> str:
        return self.kafka.group(self.group_id or f"draftgen-tokenize-{self.dataset}")


@dataclass(frozen=True)
class ObserveSettings:
    metrics_port: int | None = None  # None: no /metrics endpoint; 0: a free port
    metrics_host: str = "127.0.0.1"
    heartbeat_s: float = 5.0  # 0: no heartbeats (the worker is then invisible to `status`)
    rate_window_s: float = 30.0
