"""What every stage shares: records, topics, settings, errors, families, retry, Kafka helpers."""
