"""Operations: status, metrics, heartbeats, progress and dead-letter reading."""
