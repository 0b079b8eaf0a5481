"""Which server a worker talks to: SGLang or vLLM, its version and the model's revision, read at
start from the routes where the server describes itself; completions carry it as provenance."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import httpx2
import orjson

from streams.core.serving import SGLANG, VLLM
from streams.generate.capacity import SERVER_INFO_PATHS
from streams.generate.failures import AUTH_STATUSES, classify, status_error


@dataclass(frozen=True)
class ServerIdentity:
    """What the server said it is; until asked, an SGLang server of no version."""

    # which server reported the version: SGLang (/server_info) or vLLM (/version)
    kind: str = SGLANG
    version: str | None = None
    revision: str | None = None  # SGLang's --revision, when it was given

    def served(self) -> dict[str, Any]:
        """Who answered, for the completion's provenance."""
        served = {"kind": self.kind, "version": self.version}
        return served | ({"revision": self.revision} if self.revision else {})


class ServerRoutes:
    """The server's routes about itself. A server that cannot be reached, fails (5xx) or refuses
    the credentials raises a GenerationError (the caller waits it out)."""

    def __init__(self, http: httpx2.AsyncClient, base_url: str, headers: dict[str, str]):
        self._http = http
        self.base_url = base_url
        self._headers = headers

    async def identify(self) -> ServerIdentity:
        """SGLang's `/server_info` `version`, else vLLM's `/version`; a server that says neither
        is taken for an SGLang server of no version."""
        info = await self.server_info()
        version = (info or {}).get("version")
        kind = SGLANG
        if not isinstance(version, str):
            version = await self.vllm_version()
            kind = VLLM if version is not None else SGLANG
        revision = (info or {}).get("revision")
        return ServerIdentity(kind, version, revision if isinstance(revision, str) else None)

    async def server_info(self) -> dict[str, Any] | None:
        """The server's `/server_info` (older servers: `/get_server_info`), None when it has
        neither or answers no JSON object."""
        for path in SERVER_INFO_PATHS:
            try:
                response = await self._http.get(
                    f"{self.base_url}{path}", headers=self._headers, timeout=30.0
                )
            except httpx2.HTTPError as err:
                raise classify(err) from None
            if response.status_code == 404:
                continue  # an older server: its older name
            if response.status_code >= 500 or response.status_code in AUTH_STATUSES:
                raise status_error(response.status_code, response.text[:500])
            if response.status_code != 200:
                return None
            try:
                info = orjson.loads(response.content)
            except orjson.JSONDecodeError:
                return None
            return info if isinstance(info, dict) else None
        return None

    async def vllm_version(self) -> str | None:
        """vLLM's `/version` ({"version": "0.34.0"}); None when the server has no such route or
        answers no version."""
        try:
            response = await self._http.get(
                f"{self.base_url}/version", headers=self._headers, timeout=30.0
            )
        except httpx2.HTTPError as err:
            raise classify(err) from None
        if response.status_code >= 500 or response.status_code in AUTH_STATUSES:
            raise status_error(response.status_code, response.text[:500])
        try:
            answer = orjson.loads(response.content) if response.status_code == 200 else None
        except orjson.JSONDecodeError:
            return None
        version = answer.get("version") if isinstance(answer, dict) else None
        return version if isinstance(version, str) else None
