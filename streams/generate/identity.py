"""Which server a worker talks to: SGLang or vLLM, its version and the model's revision, read at
start from the routes where the server describes itself; completions carry it as provenance.

One model per run: a worker whose server serves another model, revision or tokenizer than the
run's (`--expect-model`, `--expect-revision`, `--expect-tokenizer`; `draftgen run` sets them
from its first server) is refused at start (`refusal`), since its completions would be another
model's and, under another settings hash, would not coordinate with the others' claims.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import httpx2
import orjson

from streams.core.model_names import model_name
from streams.core.serving import SGLANG, VLLM
from streams.core.settings import GenerateSettings
from streams.generate.capacity import SERVER_INFO_PATHS
from streams.generate.failures import AUTH_STATUSES, classify, status_error


@dataclass(frozen=True)
class ServerIdentity:
    """What the server said it is; until asked, an SGLang server of no version."""

    # which server reported the version: SGLang (/server_info) or vLLM (/version)
    kind: str = SGLANG
    version: str | None = None
    revision: str | None = None  # SGLang's --revision, when it was given
    tokenizer: str | None = None  # SGLang's --tokenizer-path (its --model-path by default)

    def served(self) -> dict[str, Any]:
        """Who answered, for the completion's provenance."""
        served = {"kind": self.kind, "version": self.version}
        return served | ({"revision": self.revision} if self.revision else {})


@dataclass(frozen=True)
class ServedModel:
    """Which model a server serves: its name and its tokenizer's, each a weights path made a
    name (`model_name`), and its revision when it says one."""

    name: str
    revision: str | None = None
    tokenizer: str | None = None

    @classmethod
    def of(cls, model: str, revision: str | None, tokenizer: str | None) -> ServedModel:
        tokenizer_name = model_name(tokenizer) if tokenizer else None
        return cls(model_name(model), revision or None, tokenizer_name)

    @classmethod
    def expected(cls, settings: GenerateSettings) -> ServedModel | None:
        """The run's model, None when the worker was told none."""
        if settings.expect_model is None:
            return None
        return cls.of(settings.expect_model, settings.expect_revision, settings.expect_tokenizer)

    def __str__(self) -> str:
        said = [f"revision {self.revision}"] if self.revision else []
        said += [f"tokenizer {self.tokenizer}"] if self.tokenizer else []
        return f"{self.name} ({', '.join(said)})" if said else self.name


def refusal(server: str, expected: ServedModel | None, served: ServedModel) -> str | None:
    """Why a worker must not use `server`, in one line naming both models; None when it serves
    the run's model (or the run names none). Revision and tokenizer differ only when both
    sides say one: a server started without --revision may serve any."""
    if expected is None:
        return None
    pairs = ((expected.revision, served.revision), (expected.tokenizer, served.tokenizer))
    if expected.name == served.name and not any(a and b and a != b for a, b in pairs):
        return None
    return (
        f"server {server} serves {served}, not the run's model {expected}: the workers of a "
        "run serve one model (--expect-model, --expect-revision, --expect-tokenizer)"
    )


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
        revision, tokenizer = (info or {}).get("revision"), (info or {}).get("tokenizer_path")
        return ServerIdentity(
            kind,
            version,
            revision if isinstance(revision, str) else None,
            tokenizer if isinstance(tokenizer, str) else None,
        )

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
