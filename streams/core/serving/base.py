"""What every server's request profile offers: the template's `messages`, `tools` and keywords
as the server hands them over, and how it flattens list content for a template."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal, Protocol

ContentFormat = Literal["string", "openai"]


class NormalizationError(ValueError):
    """The server would refuse the request (a 400): arguments that are not JSON, a bad tool."""


class ServerNormalization(Protocol):
    """One server's (SGLang's or vLLM's) request preprocessing for one version range."""

    @property
    def name(self) -> str: ...

    # the first server version it describes
    @property
    def since(self) -> tuple[int, ...]: ...

    # "sglang" or "vllm": which server's versions `since` counts in
    @property
    def kind(self) -> str: ...

    def template_content_format(self, template: str | None) -> ContentFormat: ...

    def tools(self, tools: Any, tool_choice: Any = "auto") -> list[dict[str, Any]] | None: ...

    def messages(
        self, messages: Any, content_format: ContentFormat = "string"
    ) -> list[dict[str, Any]]: ...

    def template_kwargs(
        self, chat_template_kwargs: Mapping[str, Any] | None, reasoning_effort: Any = None
    ) -> dict[str, Any]: ...

    def prepare(
        self,
        messages: Any,
        tools: Any,
        *,
        tool_choice: Any = "auto",
        content_format: ContentFormat = "string",
    ) -> tuple[list[dict[str, Any]], list[dict[str, Any]] | None]: ...
