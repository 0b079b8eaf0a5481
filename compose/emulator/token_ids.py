"""How a chat completion carries the exact token ids, in each server's style (`--ids-style`).

Each style answers one way only, as a server that has only that way would, so the generate
worker's probe and parsing can be tested against each. Request fields of the other ways are
ignored, as real servers ignore request fields they do not know. The shapes, read from the
servers' source (sglang serving_chat.py / protocol.py, vllm chat_completion/protocol.py):

- `vllm` (the default): `return_token_ids` answers `prompt_token_ids` once per response and
  `token_ids` per choice (vLLM's ChatCompletionResponse / ChatCompletionResponseChoice).
- `choices`: SGLang's `return_token_ids` (sgl-project/sglang#30917): `prompt_token_ids` and
  `token_ids` per choice; `return_prompt_token_ids` alone gives the choice's prompt ids.
- `response_token_ids`: the same after sgl-project/sglang#35225 renamed the choice's
  `token_ids` to `response_token_ids`.
- `sglext`: SGLang's response-level extension (sgl-project/sglang#34488): request fields
  `return_input_ids_in_sglext` / `return_output_ids_in_sglext` answer `sglext.input_ids` (the
  prompt) and `sglext.output_ids` (one list per choice).
- `prompt_token_ids`: older SGLang: `return_prompt_token_ids` gives the choice's prompt ids; no
  output ids at all.
- `none`: no ids, whatever is asked.
"""

from __future__ import annotations

from typing import Any

IDS_STYLES = ("vllm", "choices", "response_token_ids", "sglext", "prompt_token_ids", "none")
# every request field that asks for ids, in any style
IDS_REQUEST_FIELDS = (
    "return_token_ids",
    "return_prompt_token_ids",
    "return_input_ids_in_sglext",
    "return_output_ids_in_sglext",
)


def attach_token_ids(
    style: str,
    asked: dict[str, Any],
    response: dict[str, Any],
    prompt_ids: list[int],
    output_ids: list[int],
) -> None:
    """Add the ids `asked` for (the request body) to `response`, as a server in `style` does."""
    choice = response["choices"][0]
    token_ids = bool(asked.get("return_token_ids"))
    prompt_only = bool(asked.get("return_prompt_token_ids"))
    if style == "vllm" and token_ids:
        response["prompt_token_ids"] = prompt_ids
        choice["token_ids"] = output_ids
    elif style in ("choices", "response_token_ids"):
        if token_ids or prompt_only:
            choice["prompt_token_ids"] = prompt_ids
        if token_ids:
            choice["token_ids" if style == "choices" else "response_token_ids"] = output_ids
    elif style == "sglext":
        ext: dict[str, Any] = {}
        if asked.get("return_input_ids_in_sglext"):
            ext["input_ids"] = prompt_ids
        if asked.get("return_output_ids_in_sglext"):
            ext["output_ids"] = [output_ids]  # one list per choice
        if ext:
            response["sglext"] = ext
    elif style == "prompt_token_ids" and prompt_only:
        choice["prompt_token_ids"] = prompt_ids
