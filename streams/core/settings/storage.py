"""Where shards go, and the credentials to write there."""

from __future__ import annotations

from typing import Any

from pydantic import SecretStr

from streams.core.settings.base import OutputRoot, Settings, setting
from streams.core.settings.kafka import current_stack


class StorageSettings(Settings):
    """Where shards go: a local path or any fsspec URL (s3://bucket/prefix)."""

    out: OutputRoot = setting(
        cli=True, help="output root: a local path, file:// or s3://bucket/prefix"
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
