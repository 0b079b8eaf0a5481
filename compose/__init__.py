"""Infrastructure launchers: Kafka (KRaft, Maven jars), SeaweedFS (S3), the SGLang emulator."""
