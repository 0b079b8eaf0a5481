"""`--api native`: token-exact generation on servers whose chat endpoint returns no ids.

The prompt is rendered here with the target's chat template, as SGLang's chat endpoint of the
server's version renders it (streams/core/serving/: the same ids the chat endpoint would
use), and its ids are posted to SGLang's native `/generate` with the
same sampling parameters and the end-of-turn stop token. The output ids are recorded as
sampled, and the output is split into reasoning, content and tool calls with SGLang's own
parsers (streams/core/parsers.py), so the record reads as a chat completion would.

SGLang's `/generate` (io_struct.GenerateReqInput; schedule_batch FINISH_* .to_json()):
  {"input_ids": [...], "sampling_params": {"max_new_tokens", "temperature", "top_p",
   "stop_token_ids", "skip_special_tokens", ...}}
  → {"text": ..., "output_ids": [...], "meta_info": {"finish_reason": {"type": "stop",
     "matched": id} | {"type": "length", "length": n} | null, "prompt_tokens": n,
     "completion_tokens": n, ...}}
The stop token is in `output_ids` and trimmed from `text`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from streams.core.parsers import split_reasoning
from streams.core.recipes import NATIVE_NAMES
from streams.core.records import PromptRecord
from streams.core.serving import (
    NEWEST,
    NormalizationError,
    ServerNormalization,
)
from streams.core.tokenizers import LoadedTokenizer


class NativeError(ValueError):
    """The prompt cannot be rendered, or the answer is not /generate's shape."""

    def __init__(self, kind: str, message: str):
        super().__init__(message)
        self.kind = kind


@dataclass(frozen=True)
class NativePrompt:
    input_ids: list[int]
    tools: list[dict[str, Any]] | None  # as the template and the parser get them
    history_tool_calls: int
    thinking: bool = True  # the template kwarg it was rendered with; the answer is split by it


class NativeChat:
    """Renders prompts and reads /generate answers for one target tokenizer and family."""

    def __init__(
        self,
        loaded: LoadedTokenizer,
        thinking: bool,
        normalization: ServerNormalization = NEWEST,
    ):
        self.tokenizer = loaded.tokenizer
        self.profile = loaded.profile
        self.thinking = thinking
        # the server version's preprocessing (HttpServerClient.use_server_version sets it)
        self.normalization = normalization
        self.chat_template = getattr(self.tokenizer, "chat_template", None)
        eot = self.profile.end_of_turn
        ids = self.tokenizer.encode(eot, add_special_tokens=False) if eot else []
        stop = ids[0] if len(ids) == 1 else getattr(self.tokenizer, "eos_token_id", None)
        self.stop_token_ids = [int(stop)] if stop is not None else []

    def template_kwargs(self, thinking: bool | None = None) -> dict[str, Any]:
        thinking = self.thinking if thinking is None else thinking
        if self.profile.thinking_kwarg:
            return {self.profile.thinking_kwarg: thinking}
        return {"thinking": thinking, "enable_thinking": thinking}

    def render(self, prompt: PromptRecord, thinking: bool | None = None) -> NativePrompt:
        return self.render_messages(prompt.messages, prompt.tools, thinking=thinking)

    def render_messages(
        self, messages: Any, tools: Any, tool_choice: Any = "auto", thinking: bool | None = None
    ) -> NativePrompt:
        """The prompt ids SGLang's chat endpoint of the profile's versions would use for this
        request (the same preprocessing, template and kwargs; `thinking`: the worker's when
        None)."""
        thinking = self.thinking if thinking is None else thinking
        normalization = self.normalization
        try:
            prepared, template_tools = normalization.prepare(
                messages,
                tools,
                tool_choice=tool_choice,
                content_format=normalization.template_content_format(self.chat_template),
            )
        except NormalizationError as err:  # the server would refuse it with a 400
            raise NativeError("bad_request", str(err)) from None
        try:
            text = self.tokenizer.apply_chat_template(
                prepared,
                tools=template_tools,
                add_generation_prompt=True,
                tokenize=False,
                **normalization.template_kwargs(self.template_kwargs(thinking)),
            )
        except Exception as err:  # jinja errors, raise_exception(), bad message shapes
            raise NativeError("template_error", f"{type(err).__name__}: {err}") from None
        ids = self.tokenizer.encode(str(text), add_special_tokens=False)
        calls = sum(len(m.get("tool_calls") or []) for m in prepared if m["role"] == "assistant")
        return NativePrompt([int(i) for i in ids], template_tools, calls, thinking)

    def request(self, native: NativePrompt, sampling: dict[str, Any]) -> dict[str, Any]:
        """/generate's body; `sampling`: the parameters by their chat API names."""
        params: dict[str, Any] = {NATIVE_NAMES.get(k, k): v for k, v in sampling.items()}
        params |= {
            "stop_token_ids": self.stop_token_ids,
            # as the chat endpoint: special tokens kept when tools are given, for the parser
            "skip_special_tokens": not native.tools,
        }
        return {"input_ids": native.input_ids, "sampling_params": params}

    def completion_fields(self, native: NativePrompt, body: Any) -> dict[str, Any]:
        """The generated fields of a completion record from a /generate answer."""
        if not isinstance(body, dict) or not isinstance(body.get("output_ids"), list):
            raise NativeError("bad_response", "the /generate answer has no output_ids")
        text = str(body.get("text") or "")
        output_ids = body["output_ids"]
        meta = body.get("meta_info") or {}
        finish = (meta.get("finish_reason") or {}).get("type")
        reasoning, content = None, text
        profile = self.profile
        if profile.reasoning_parser and native.thinking:
            tool_start = profile.tool_start if native.tools else None
            split = split_reasoning(
                text, profile.think_open, profile.think_close, profile.prefills_think, tool_start
            )
            reasoning, content = split[0] or None, split[1]
        tool_calls = None
        if native.tools and profile.tool_call_parser:
            content, calls = profile.parse_tool_calls(
                content, native.tools, native.history_tool_calls
            )
            if calls:
                tool_calls = [call.to_openai(i) for i, call in enumerate(calls)]
                finish = "tool_calls" if finish == "stop" else finish
        prompt_tokens = int(meta.get("prompt_tokens") or len(native.input_ids))
        completion_tokens = int(meta.get("completion_tokens") or len(output_ids))
        return {
            "reasoning_content": reasoning,
            "content": content,
            "tool_calls": tool_calls,
            "finish_reason": finish,
            "usage": {
                "prompt_tokens": prompt_tokens,
                "completion_tokens": completion_tokens,
                "total_tokens": prompt_tokens + completion_tokens,
            },
            "prompt_token_ids": native.input_ids,
            "output_token_ids": output_ids,
        }
