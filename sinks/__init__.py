"""Arrow shards and commit markers on any fsspec URL (local path, file://, s3://)."""
