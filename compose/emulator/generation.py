"""Deterministic "sampling": the output token ids a prompt gets, as a thinking model would write.

The text is built first (thinking, `</think>`, answer or tool call), then encoded canonically and
ended with the end-of-turn token. Every choice is seeded by a hash of the rendered prompt and the
emulator's seed, so the same prompt always gets the same output.

A script (`--script`) gives the text for chosen prompts instead: the model "samples" the
canonical encoding of that text, then its end-of-turn token, and `max_new_tokens` cuts it as
usual. Tests use it to check the pipeline on outputs they choose.
"""

from __future__ import annotations

import hashlib
import json
import math
import random
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Any

from compose.emulator import textgen
from compose.emulator.model import EmulatedModel
from compose.emulator.settings import EmulatorSettings


class ThinkMode(Enum):
    PREFILLED = "prefilled"  # the prompt ends with <think>: the model starts inside the block
    OPENS = "opens"  # the model writes <think> itself
    OFF = "off"  # no thinking (template closed an empty block, or thinking is off)


@dataclass(frozen=True)
class GenerationRequest:
    prompt_text: str
    prompt_len: int
    max_new_tokens: int | None
    # whether the model thinks when the prompt neither prefills nor closes a think block
    thinking: bool
    # as the template got them: function dicts, or {"type", "function"} tool dumps
    tools: list[dict[str, Any]] | None = None
    history_tool_calls: int = 0


@dataclass(frozen=True)
class Generation:
    output_ids: list[int]
    finish_reason: str  # "stop" or "length"
    matched_stop: int | None
    mode: ThinkMode
    drift: bool
    tool_call: bool


def prompt_unit(seed: int, prompt_text: str, salt: str) -> float:
    """A number in [0, 1) fixed by the prompt, for per-prompt decisions."""
    digest = hashlib.sha256(f"{seed}\0{salt}\0{prompt_text}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64


def think_mode(prompt_text: str, think_open: str, think_close: str, thinking: bool) -> ThinkMode:
    tail = prompt_text.rstrip()
    if tail.endswith(think_close):
        return ThinkMode.OFF
    if tail.endswith(think_open):
        return ThinkMode.PREFILLED
    return ThinkMode.OPENS if thinking else ThinkMode.OFF


class Generator:
    def __init__(self, model: EmulatedModel, settings: EmulatorSettings) -> None:
        self.model = model
        self.settings = settings
        # the think tags with the whitespace the family's model writes around them
        self._open_text, self._close_text = model.family.think_texts()
        self._open_cost = self._count(self._open_text)
        self._close_cost = self._count(self._close_text)
        self._split_cache: dict[int, list[int] | None] = {}
        self._script = load_script(settings.script) if settings.script else []
        # a scripted text's ids, encoded once: a real server decodes, it never re-encodes
        self._script_ids: dict[str, list[int]] = {}

    def _count(self, text: str) -> int:
        return len(self.model.encode(text))

    def generate(self, request: GenerationRequest) -> Generation:
        s = self.settings
        family = self.model.family
        prompt = request.prompt_text
        rng = random.Random(hashlib.sha256(f"{s.seed}\0text\0{prompt}".encode()).digest())
        mode = think_mode(prompt, family.think_open, family.think_close, request.thinking)
        if not family.thinking_kwarg and mode is ThinkMode.OPENS:
            mode = ThinkMode.OFF  # a generic model has no thinking format
        scripted = self._scripted(prompt)
        if scripted is not None:
            ids = self._script_ids.get(scripted)
            if ids is None:
                ids = self._script_ids[scripted] = self.model.encode(scripted)
            return self._finish(ids, request, mode, False, False)
        drift = prompt_unit(s.seed, prompt, "drift") < s.drift_rate
        tool_call = bool(request.tools) and prompt_unit(s.seed, prompt, "tool") < s.tool_call_rate
        if tool_call and not family.tool_start:
            tool_call = False
        unclosed = (
            mode is not ThinkMode.OFF
            and not tool_call
            and prompt_unit(s.seed, prompt, "unclosed") < s.unclosed_think_rate
        )
        junk = not (tool_call or unclosed)
        loops = junk and prompt_unit(s.seed, prompt, "loop") < s.loop_rate
        leaks = junk and not loops and prompt_unit(s.seed, prompt, "leak") < s.think_leak_rate

        # The length is drawn in tokens; the fixed tags are paid for out of the answer's share.
        total = self._output_length(rng, prompt)
        share = min(s.thinking_fraction, 0.3) if loops else s.thinking_fraction
        think_tokens = round(total * share) if mode is not ThinkMode.OFF else 0
        overhead = 1 + (self._close_cost if mode is not ThinkMode.OFF else 0)
        overhead += self._open_cost if mode is ThinkMode.OPENS else 0
        answer_tokens = max(1, total - think_tokens - overhead)
        count = self._count
        text = self._open_text if mode is ThinkMode.OPENS else ""
        if mode is not ThinkMode.OFF:
            text += textgen.prose(rng, max(1, think_tokens), count, thinking=True)
            if not unclosed:
                text += self._close_text
        if not unclosed:
            if tool_call:
                text += self._tool_call_text(rng, request)
            elif loops:
                text += textgen.loop(rng, answer_tokens, count)
            else:
                answer = textgen.answer(rng, answer_tokens, count)
                if leaks:  # the parser split at the first close; this one stays in the answer
                    middle = len(answer) // 2
                    answer = f"{answer[:middle]}{family.think_close}{answer[middle:]}"
                text += answer

        ids = self.model.encode(text)
        if drift:
            ids = self._drift(ids, rng)
        return self._finish(ids, request, mode, drift, tool_call)

    def _finish(
        self,
        ids: list[int],
        request: GenerationRequest,
        mode: ThinkMode,
        drift: bool,
        tool_call: bool,
    ) -> Generation:
        """The end-of-turn token, then the length limit."""
        s = self.settings
        eot = self.model.special.eot
        if eot is not None:
            ids = [*ids, eot]
        limit = request.max_new_tokens
        if limit is None:  # SGLang's default: whatever the context leaves
            limit = max(1, s.max_model_len - request.prompt_len)
        # SGLang checks the length before the stop token: hitting both at once is "length".
        if len(ids) >= limit:
            return Generation(ids[:limit], "length", None, mode, drift, tool_call)
        return Generation(ids, "stop", eot, mode, drift, tool_call)

    # -- pieces -----------------------------------------------------------------------------

    def _scripted(self, prompt: str) -> str | None:
        for match, output in self._script:
            if match in prompt:
                return output
        return None

    def _output_length(self, rng: random.Random, prompt: str) -> int:
        s = self.settings
        if s.long_fraction and prompt_unit(s.seed, prompt, "long") < s.long_fraction:
            return rng.randint(*s.long_output_tokens)
        if s.mean_output_tokens is None:
            return rng.randint(s.min_output_tokens, s.max_output_tokens)
        sigma = 0.6  # a long-tailed spread, like real reasoning lengths
        mu = math.log(max(1, s.mean_output_tokens)) - sigma**2 / 2
        value = int(rng.lognormvariate(mu, sigma))
        return min(s.max_output_tokens, max(s.min_output_tokens, value))

    def _tool_call_text(self, rng: random.Random, request: GenerationRequest) -> str:
        tools = [tool.get("function", tool) for tool in request.tools or []]
        chosen = rng.sample(tools, k=1 if len(tools) == 1 or rng.random() < 0.8 else 2)
        calls = [
            (str(tool.get("name")), textgen.arguments_for(rng, tool.get("parameters")))
            for tool in chosen
        ]
        return self.model.family.write_tool_calls(calls, first_index=request.history_tool_calls)

    def _drift(self, ids: list[int], rng: random.Random) -> list[int]:
        """Re-spell a few tokens as their characters' tokens: same text, different ids."""
        positions = [i for i, t in enumerate(ids) if t not in self.model.unsplittable]
        rng.shuffle(positions)
        wanted = max(1, len(positions) // 50)  # real drift is rare: about 2% of tokens
        replaced: dict[int, list[int]] = {}
        for position in positions:
            split = self._split(ids[position])
            if split is not None:
                replaced[position] = split
                if len(replaced) >= wanted:
                    break
        out: list[int] = []
        for position, token in enumerate(ids):
            out.extend(replaced.get(position, (token,)))
        return out

    def _split(self, token: int) -> list[int] | None:
        if token in self._split_cache:
            return self._split_cache[token]
        text = self.model.token_text(token)
        split: list[int] | None = None
        if len(text) >= 2 and "\ufffd" not in text:
            pieces = [i for char in text for i in self.model.encode(char)]
            if pieces != [token] and self.model.decode(pieces, skip_special_tokens=False) == text:
                split = pieces
        self._split_cache[token] = split
        return split


def load_script(path: Path) -> list[tuple[str, str]]:
    """(match, output) pairs of a JSON-lines script file, in file order."""
    entries = []
    for number, line in enumerate(Path(path).read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        entry = json.loads(line)
        if not (isinstance(entry.get("match"), str) and isinstance(entry.get("output"), str)):
            raise ValueError(f"{path}:{number}: need string fields 'match' and 'output'")
        entries.append((entry["match"], entry["output"]))
    return entries
