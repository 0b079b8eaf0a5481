"""The generate worker's command line the benchmarks start (`LocalStack.start_worker`)."""

from __future__ import annotations

from streams.core.settings import KafkaSettings


def generate_argv(url: str, kafka: KafkaSettings, concurrency: int, *extra: str) -> list[str]:
    """One worker bound to the server at `url`, on `kafka`'s topics and partitions."""
    return [
        "--log-level",
        "INFO",
        "worker",
        "generate",
        "--server",
        url,
        "--bootstrap",
        kafka.bootstrap,
        "--topic-prefix",
        kafka.topic_prefix,
        "--partitions",
        str(kafka.partitions),
        "--concurrency",
        str(concurrency),
        *extra,
    ]
