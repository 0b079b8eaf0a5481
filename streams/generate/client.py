"""Talks to one SGLang or vLLM server through the `openai` async client (one pooled client per
worker): its health, the served model, how it returns ids, and the completions. What a failure
means is failures.py's; which server it is, identity.py's.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any

import httpx2
import openai
import orjson

from streams.core.families import GENERIC, family_for_model
from streams.core.recipes import OPENAI_FIELDS, effective_sampling, effective_thinking
from streams.core.records import CompletionRecord, PromptRecord
from streams.core.serving import ServerNormalization, profile_for_version, profile_named
from streams.core.settings import GenerateSettings
from streams.core.tokenizers import load_tokenizer
from streams.generate.capacity import running_cap
from streams.generate.exact_ids import (
    NATIVE,
    NO_IDS,
    PROBE_REQUEST,
    IdsWay,
    find_ids,
    way_of,
)
from streams.generate.failures import AUTH_STATUSES, GenerationError, classify, status_error
from streams.generate.identity import ServedModel, ServerIdentity, ServerRoutes
from streams.generate.native import NativeChat, NativeError
from streams.generate.stats import AUTH, DOWN

log = logging.getLogger(__name__)

# the health probe was not answered in time, or answered "not now" (SGLang's 503 after its own
# wait, a server loading): busy, or hung; the gate tells them apart by progress (gate.py)
SLOW = "slow"


@dataclass(frozen=True)
class Generated:
    """The generated fields of a completion record."""

    fields: dict[str, Any]


class HttpServerClient:
    """The `ServerClient` of one SGLang or vLLM server, over HTTP: its chat API (or SGLang's
    `/generate` with `--api native`), what it is, how it returns exact ids, and its health."""

    def __init__(self, settings: GenerateSettings):
        self.settings = settings
        self.base_url = settings.server.rstrip("/")
        # with "auto" the worker's slots bound the requests; the pool need not know the number
        pool = settings.concurrency + 4 if isinstance(settings.concurrency, int) else None
        limits = httpx2.Limits(max_connections=pool, max_keepalive_connections=pool)
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
        # how the server preprocesses chat requests (use_server_version); forced by the setting
        self.normalization: ServerNormalization = profile_named(settings.normalization)
        self.routes = ServerRoutes(self._http, self.base_url, self._auth_headers())
        self.identity = ServerIdentity()  # what the server says it is (use_server_version)
        # `--api native`: prompts rendered here, posted to /generate (streams/generate/native.py)
        self.native: NativeChat | None = None
        if settings.api == "native":
            assert settings.tokenizer_dir is not None  # the settings check it
            loaded = load_tokenizer(settings.tokenizer_dir, family=settings.family)
            self.native = NativeChat(loaded, settings.thinking, self.normalization)

    @property
    def server_version(self) -> str | None:
        return self.identity.version

    @property
    def server_kind(self) -> str:
        return self.identity.kind

    async def close(self) -> None:
        await self._openai.close()
        await self._http.aclose()

    def _auth_headers(self) -> dict[str, str]:
        if not self.settings.api_key:
            return {}
        return {"Authorization": f"Bearer {self.settings.api_key.get_secret_value()}"}

    async def unavailable(self) -> str | None:
        """Why the server cannot take requests now: DOWN (it refuses or resets connections),
        SLOW (no answer in time, or not a healthy one: SGLang's probe waits for a free slot),
        AUTH, or None when it can. SGLang's `--api-key` exempts /health*, so the key is tried
        on /v1/models, which checks it. vLLM has no /health_generate: its /health says whether
        the engine serves."""
        timeout = self.settings.health_timeout_s
        try:
            response = await self._http.get(f"{self.base_url}/health_generate", timeout=timeout)
            if response.status_code == 404:
                response = await self._http.get(f"{self.base_url}/health", timeout=timeout)
            if response.status_code != 200:
                return SLOW
            response = await self._http.get(
                f"{self.base_url}/v1/models", headers=self._auth_headers(), timeout=timeout
            )
        except httpx2.TimeoutException:
            return SLOW
        except httpx2.HTTPError:
            return DOWN
        return AUTH if response.status_code in AUTH_STATUSES else None

    async def max_running_requests(self) -> int | None:
        """The server's running-request cap (streams/generate/capacity.py), or None when it
        does not say. A server that cannot be reached raises (the caller waits it out)."""
        return running_cap(await self.routes.server_info())

    async def use_server_version(self) -> ServerNormalization:
        """Ask the server its version (SGLang's `/server_info` `version`, else vLLM's
        `/version`) and render prompts as that server's version preprocesses chat requests,
        unless `--normalization` forces a profile; a server that says no version gets the
        newest SGLang profile."""
        self.identity = await self.routes.identify()
        if self.settings.normalization is None:
            self.normalization = profile_for_version(self.server_version, self.server_kind)
        if self.native is not None:
            self.native.normalization = self.normalization
        return self.normalization

    async def discover(self) -> None:
        """Learn the served model name (unless given) and pick the thinking kwarg from it."""
        if not self.model:
            try:
                models = await self._openai.models.list()
            except openai.APIStatusError as err:
                if err.status_code in AUTH_STATUSES:  # the worker waits for the key to work
                    raise classify(err) from None
                raise
            self.model = models.data[0].id
        if self.native is not None:  # the tokenizer's template says the family
            self.family = self.native.profile
            return
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
        if self.native is not None:
            self.ids_way = NATIVE
            return NATIVE
        if not self.settings.return_token_ids:
            self.ids_way = NO_IDS
            return NO_IDS
        request: dict[str, Any] = {
            "model": self.model,
            "messages": [{"role": "user", "content": "Hi"}],
            "max_tokens": 1,
            "extra_body": {
                "chat_template_kwargs": self._template_kwargs(self.settings.thinking),
                **PROBE_REQUEST,
            },
        }
        try:
            response = await self._openai.chat.completions.create(**request)
        except Exception as err:
            failure = classify(err)
            if failure.transient or failure.auth:
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

    def _template_kwargs(self, thinking: bool) -> dict[str, Any]:
        if self.family.thinking_kwarg:
            return {self.family.thinking_kwarg: thinking}
        return {"thinking": thinking, "enable_thinking": thinking}

    def asked(self, prompt: PromptRecord) -> tuple[dict[str, Any], bool, str]:
        """(sampling parameters, thinking, recipe name) of this prompt: the worker's settings,
        overridden by its recipe's policy (streams/core/recipes.py)."""
        policy = prompt.generation_policy()
        sampling = effective_sampling(self.settings.sampling.as_dict(), policy)
        thinking = effective_thinking(self.settings.thinking, policy)
        return sampling, thinking, policy.recipe if policy is not None else ""

    async def complete(self, prompt: PromptRecord) -> CompletionRecord:
        if self.native is not None:
            return await self._complete_native(prompt, self.native)
        sampling, thinking, recipe = self.asked(prompt)
        kwargs = self._template_kwargs(thinking)
        extra_body: dict[str, Any] = {
            **{k: v for k, v in sampling.items() if k not in OPENAI_FIELDS},
            "chat_template_kwargs": kwargs,
            "separate_reasoning": True,
        }
        if self.settings.return_token_ids:
            extra_body.update(PROBE_REQUEST if self.ids_way is None else self.ids_way.asked)
        request: dict[str, Any] = {
            "model": self.model,
            "messages": prompt.messages,
            **{k: v for k, v in sampling.items() if k in OPENAI_FIELDS},
            "extra_body": extra_body,
        }
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
            sampling={**sampling, "chat_template_kwargs": kwargs},
            recipe=recipe,
            served=self.identity.served(),
            normalization=self.normalization.name,
            latency_s=round(time.monotonic() - started, 4),
        )

    async def _complete_native(self, prompt: PromptRecord, native: NativeChat) -> CompletionRecord:
        sampling, thinking, recipe = self.asked(prompt)
        started = time.monotonic()
        try:
            rendered = native.render(prompt, thinking)
            headers = {"Content-Type": "application/json", **self._auth_headers()}
            body = orjson.dumps(native.request(rendered, sampling))
            try:
                response = await self._http.post(
                    f"{self.base_url}/generate", content=body, headers=headers
                )
            except httpx2.HTTPError as err:
                raise classify(err) from None
            if response.status_code != 200:
                raise status_error(response.status_code, _native_message(response))
            try:
                answer = orjson.loads(response.content)
            except orjson.JSONDecodeError:
                raise GenerationError("bad_response", "not JSON", transient=True) from None
            fields = native.completion_fields(rendered, answer)
        except NativeError as err:
            # a template that refuses the prompt is the prompt's fault; a bad answer the server's
            transient = err.kind == "bad_response"
            raise GenerationError(err.kind, str(err), transient=transient) from None
        return CompletionRecord.from_prompt(
            prompt,
            **fields,
            model=self.model,
            server=self.base_url,
            sampling={**sampling, "chat_template_kwargs": native.template_kwargs(thinking)},
            recipe=recipe,
            served=self.identity.served(),
            normalization=self.normalization.name,
            latency_s=round(time.monotonic() - started, 4),
        )


async def ask_served_model(settings: GenerateSettings) -> ServedModel:
    """The model `settings.server` serves, asked once as its worker asks at start (`draftgen
    run` makes the first answering server's the run's); raises if it does not answer."""
    client = HttpServerClient(settings)
    try:
        await client.discover()
        await client.use_server_version()
        return ServedModel.of(client.model, client.identity.revision, client.identity.tokenizer)
    finally:
        await client.close()


def _native_message(response: httpx2.Response) -> str:
    """/generate's errors: {"error": {"message"}} for a bad request, else OpenAI's shape."""
    try:
        body = orjson.loads(response.content)
    except orjson.JSONDecodeError:
        return response.text[:500]
    error = body.get("error") if isinstance(body, dict) else None
    if isinstance(error, dict) and isinstance(error.get("message"), str):
        return error["message"][:500]
    if isinstance(body, dict) and isinstance(body.get("message"), str):
        return body["message"][:500]
    return response.text[:500]
