"""Names and value sets of the settings that need no validation library: topic and group
names, the choices of a few settings, and the generate window's arithmetic. Importing this
module costs nothing, so the command line can show its help without pydantic."""

from __future__ import annotations

from typing import Literal

PROMPTS = "prompts"
COMPLETIONS = "completions"
DEAD_LETTERS = "dead-letters"
GENERATE_GROUP = "draftgen-generate"
# every dataset version's tokenize group starts so (tokenize_group_name)
TOKENIZE_GROUP_PREFIX = "draftgen-tokenize-"
# compacted: the latest heartbeat of each live worker, read by `draftgen status`
WORKER_STATS = "worker-stats"
# compacted: one record per (prompt_id, generation settings) generated (streams/core/ledger.py)
GENERATED = "generated"

LogLevel = Literal["DEBUG", "INFO", "WARNING", "ERROR"]
KeepOrDrop = Literal["drop", "keep"]
# a quality-gate rule: drop the sample, keep it with the rule in its `flags`, or keep it
KeepFlagDrop = Literal["drop", "flag", "keep"]
OverLength = Literal["drop", "truncate"]
RegenMode = Literal["final", "every-turn"]
GenerateApi = Literal["chat", "native"]
Compression = Literal["gzip", "none"]
SecurityProtocol = Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"]
# aiokafka's mechanisms
SaslMechanism = Literal["PLAIN", "GSSAPI", "SCRAM-SHA-256", "SCRAM-SHA-512", "OAUTHBEARER"]


def tokenize_group_name(dataset: str, nonce: str | None = None) -> str:
    """The consumer group of a dataset version's tokenize workers, before `--topic-prefix`
    (`KafkaSettings.group`): named after the version, or with a `nonce` a new group of its
    own, the version's name cut so that it stays a name of at most 100 characters."""
    if nonce is None:
        return f"{TOKENIZE_GROUP_PREFIX}{dataset}"
    room = 100 - len(TOKENIZE_GROUP_PREFIX) - len(nonce) - 1  # a SafeName (settings/base.py)
    return f"{TOKENIZE_GROUP_PREFIX}{dataset[:room]}-{nonce}"


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
