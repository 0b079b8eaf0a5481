"""Talks to one SGLang server through the `openai` async client (one pooled client per worker).

Classifies every failure as permanent (dead letter at once), transient (retry with backoff) or
server-down (pause the worker until /health_generate answers), the three things a worker does.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any

import httpx2
import openai

from streams.core.families import FAMILIES, GENERIC, FamilyProfile
from streams.core.records import CompletionRecord, PromptRecord
from streams.core.settings import GenerateSettings
from streams.generate.exact_ids import NO_IDS, PROBE_REQUEST, IdsWay, find_ids, way_of

log = logging.getLogger(__name__)


class GenerationError(Exception):
    """A request that failed; `transient` says whether retrying can help."""

    def __init__(self, kind: str, message: str, transient: bool, server_down: bool = False):
        super().__init__(f"{kind}: {message}")
        self.kind = kind
        self.message = message
        self.transient = transient
        self.server_down = server_down


def classify(err: Exception) -> GenerationError:
    if isinstance(err, openai.APITimeoutError):
        return GenerationError("timeout", "request timed out", transient=True)
    if isinstance(err, openai.APIConnectionError):
        # Refused or reset: the server may be down; the caller probes health before counting it.
        return GenerationError("connection_error", _short(err), transient=True, server_down=True)
    if isinstance(err, openai.APIStatusError):
        status = err.status_code
        message = _error_message(err)
        if status == 400 and "context length" in message:
            return GenerationError("context_too_long", message, transient=False)
        if status in (408, 429) or status >= 500:
            return GenerationError(f"http_{status}", message, transient=True)
        return GenerationError(f"http_{status}", message, transient=False)
    return GenerationError(type(err).__name__, _short(err), transient=False)


def _error_message(err: openai.APIStatusError) -> str:
    body = err.body
    if isinstance(body, dict) and isinstance(body.get("message"), str):
        return body["message"][:500]
    return _short(err)


def _short(err: Exception) -> str:
    return (str(err) or type(err).__name__).splitlines()[0][:500]


def family_for_model(model: str, override: str | None) -> FamilyProfile:
    if override:
        return FAMILIES[override]
    lowered = model.lower()
    if "kimi" in lowered:
        return FAMILIES["kimi_k2"]
    if "qwen" in lowered:
        return FAMILIES["qwen3"]
    return GENERIC


@dataclass(frozen=True)
class Generated:
    """The generated fields of a completion record."""

    fields: dict[str, Any]


class SGLangClient:
    def __init__(self, settings: GenerateSettings):
        self.settings = settings
        self.base_url = settings.server.rstrip("/")
        limits = httpx2.Limits(
            max_connections=settings.concurrency + 4,
            max_keepalive_connections=settings.concurrency + 4,
        )
        self._http = httpx2.AsyncClient(
            limits=limits, timeout=httpx2.Timeout(settings.request_timeout_s, connect=10.0)
        )
        self._openai = openai.AsyncOpenAI(
            base_url=f"{self.base_url}/v1",
            api_key=settings.api_key.get_secret_value() if settings.api_key else "EMPTY",
            http_client=self._http,
            max_retries=0,  # retries are ours: they must know about pauses and attempt budgets
            timeout=settings.request_timeout_s,
        )
        self.model = settings.model or ""
        self.family = GENERIC
        # how this server returns exact ids (probe_ids); until probed, ask every way
        self.ids_way: IdsWay | None = None

    async def close(self) -> None:
        await self._openai.close()
        await self._http.aclose()

    async def healthy(self) -> bool:
        try:
            response = await self._http.get(f"{self.base_url}/health_generate", timeout=10.0)
        except httpx2.HTTPError:
            return False
        return response.status_code == 200

    async def discover(self) -> None:
        """Learn the served model name (unless given) and pick the thinking kwarg from it."""
        if not self.model:
            models = await self._openai.models.list()
            self.model = models.data[0].id
        self.family = family_for_model(self.model, self.settings.family)
        if self.family is GENERIC and self.settings.thinking:
            log.warning(
                "model %r matches no known family; sending both thinking kwargs "
                "(pass --family to choose one)",
                self.model,
            )

    async def probe_ids(self) -> IdsWay | None:
        """One tiny request asking for ids every way: the answer shows which way the server
        has. Transient failures raise (the caller retries); if the server refuses the probe,
        None: each request then asks every way, and the ids are read wherever they come."""
        if not self.settings.return_token_ids:
            self.ids_way = NO_IDS
            return NO_IDS
        request: dict[str, Any] = {
            "model": self.model,
            "messages": [{"role": "user", "content": "Hi"}],
            "max_tokens": 1,
            "extra_body": {"chat_template_kwargs": self._template_kwargs(), **PROBE_REQUEST},
        }
        try:
            response = await self._openai.chat.completions.create(**request)
        except Exception as err:
            failure = classify(err)
            if failure.transient:
                raise failure from None
            log.warning(
                "could not ask %s how it returns token ids (%s); asking every way each time",
                self.base_url,
                failure,
            )
            self.ids_way = None
            return None
        self.ids_way = way_of(response.model_dump())
        return self.ids_way

    def _template_kwargs(self) -> dict[str, Any]:
        if self.family.thinking_kwarg:
            return {self.family.thinking_kwarg: self.settings.thinking}
        return {"thinking": self.settings.thinking, "enable_thinking": self.settings.thinking}

    async def complete(self, prompt: PromptRecord) -> CompletionRecord:
        sampling = self.settings.sampling
        extra_body: dict[str, Any] = {
            "chat_template_kwargs": self._template_kwargs(),
            "separate_reasoning": True,
        }
        if self.settings.return_token_ids:
            extra_body.update(PROBE_REQUEST if self.ids_way is None else self.ids_way.asked)
        request: dict[str, Any] = {
            "model": self.model,
            "messages": prompt.messages,
            "temperature": sampling.temperature,
            "top_p": sampling.top_p,
            "max_tokens": sampling.max_tokens,
            "extra_body": extra_body,
        }
        if sampling.seed is not None:
            request["seed"] = sampling.seed
        if prompt.tools:
            request["tools"] = prompt.tools
        started = time.monotonic()
        try:
            response = await self._openai.chat.completions.create(**request)
        except Exception as err:
            raise classify(err) from None
        body = response.model_dump()
        if not body.get("choices"):
            raise GenerationError("empty_response", "server returned no choices", transient=True)
        choice = body["choices"][0]
        message = choice.get("message") or {}
        # vLLM names the field `reasoning`; SGLang `reasoning_content`.
        reasoning = message.get("reasoning_content")
        if reasoning is None:
            reasoning = message.get("reasoning")
        ids = find_ids(body)
        # a pair or nothing: the tokenize stage renders a sample without its output's ids
        exact = ids.prompt is not None and ids.output is not None
        return CompletionRecord.from_prompt(
            prompt,
            reasoning_content=reasoning,
            content=message.get("content") or "",
            tool_calls=message.get("tool_calls") or None,
            finish_reason=choice.get("finish_reason"),
            usage=body.get("usage") or {},
            prompt_token_ids=ids.prompt if exact else None,
            output_token_ids=ids.output if exact else None,
            model=self.model,
            server=self.base_url,
            sampling={**sampling.as_dict(), "chat_template_kwargs": self._template_kwargs()},
            latency_s=round(time.monotonic() - started, 4),
        )
