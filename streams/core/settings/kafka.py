"""Where the broker is and how to talk to it, and where the local stack keeps its state."""

from __future__ import annotations

import ssl
from pathlib import Path
from typing import Any

from pydantic import SecretStr, ValidationError, field_validator, model_validator
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

from streams.core.settings.base import (
    Bootstrap,
    SafePrefix,
    Settings,
    default_state_dir,
    setting,
)
from streams.core.settings.names import Compression, SaslMechanism, SecurityProtocol
from streams.core.stack_state import StackState, live_stack

# Kafka's record batch format (v2, the only one its producers write since 0.11; "Record Batch"
# in https://kafka.apache.org/documentation/#recordbatch): a 61-byte batch header, then per
# record its length (varint, at most 5 bytes), attributes (1), timestamp delta (varlong, at
# most 10), offset delta (varint, at most 5), the key and the value each as a varint length and
# its bytes (a null one: the length -1, 1 byte), and a varint count of headers (ours: none, 1
# byte). The producers estimate a message's size the same way before they send it.
RECORD_BATCH_HEADER = 61
RECORD_MAX_OVERHEAD = 5 + 1 + 10 + 5


def _varint_size(value: int) -> int:
    """Bytes of `value` as a zigzag varint (Kafka's encoding of lengths in a record)."""
    zigzag = (value << 1) ^ (value >> 63)
    size = 1
    while zigzag >= 0x80:
        zigzag >>= 7
        size += 1
    return size


def record_size_bound(key: bytes | None, value: bytes | None) -> int:
    """At most the bytes a batch holding this one message takes, headers excluded."""
    fields = sum(
        1 if part is None else _varint_size(len(part)) + len(part) for part in (key, value)
    )
    return RECORD_BATCH_HEADER + RECORD_MAX_OVERHEAD + fields + _varint_size(0)


class StackSettings(Settings):
    """Where the local stack (`draftgen stack up`) keeps its state file and data."""

    # None: this user's state directory (`default_state_dir`, which honours XDG_STATE_HOME), so
    # two users of one machine never share (nor stop) one stack
    stack_dir: str | None = setting(
        None,
        cli=True,
        help="the local stack's state and data (default $XDG_STATE_HOME/draftgen/stack, else "
        "~/.local/state/draftgen/stack)",
    )

    @property
    def path(self) -> Path:
        if self.stack_dir:
            return Path(self.stack_dir).expanduser()
        return default_state_dir() / "stack"


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
        cli=True,
        help="Kafka bootstrap servers host:port[,host:port]",
        env=("DRAFTGEN_BOOTSTRAP",),
    )
    # Lets several pipelines (and tests) share one broker without sharing topics or groups.
    topic_prefix: SafePrefix = setting("", cli=True, help="prefix for topic and group names")
    partitions: int = setting(64, cli=True, help="partitions for topics this command creates", gt=0)
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
    # Group liveness: a crashed consumer's partitions move after the session timeout (also a
    # static member's that is not restarted: it sends no LeaveGroup, even when stopped), and a
    # dynamic one restarted waits for its dead predecessor to expire. Heartbeats are sent from
    # the event loop, which never blocks (tokenizing runs in a thread), so 10 s is safe and
    # keeps recovery after kill -9 within ~15 s (README), and a static worker restarted within
    # it is back on its partitions without a rebalance (streams/core/membership.py).
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
        cli=True,
        help="replicas of each topic this command creates (default: min(3, brokers))",
        gt=0,
    )
    min_insync_replicas: int | None = setting(
        None,
        cli=True,
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
        """A heartbeat's answer is how a member learns that a rebalance began (a worker joined
        or left): each rebalance waits up to one interval for every member to rejoin, so a
        short one lets a fleet that starts together settle within ~0.3 s of its last join
        (BENCHMARKS.md, "Fleet start"). A heartbeat is a few bytes; 4 a second per worker."""
        return min(0.25, self.session_timeout_s / 10)

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
        size = record_size_bound(key, value)
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
        overhead = record_size_bound(key, b"")
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


def kafka_if_configured() -> KafkaSettings | None:
    """The broker's settings when the environment names one, else None (optional Kafka); a
    bad one is an error, not a reason to go without."""
    try:
        return KafkaSettings()
    except ValidationError as err:
        if all(error["type"] == "missing" for error in err.errors()):
            return None
        raise
