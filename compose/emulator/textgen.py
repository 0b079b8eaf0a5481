"""Deterministic filler text: thinking prose, answers with some code, tool-call arguments.

Only the shape matters (words, punctuation, newlines, a little non-ASCII, code), so that token ids,
loss masks and re-encoding behave as they do on real model output.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

TokenCounter = Callable[[str], int]

_WORD_TEXT = (
    "the a of to and in is that for it as with on this be are we by from or at an not can "
    "value result answer question problem step first then next so because therefore however "
    "consider check case number list string function return input output error test data "
    "model token sequence length index count sum total each other between before after while "
    "should would could must might need want know think see look find make take give use "
    "simple small large fast slow better worse correct wrong true false maybe probably "
    "example instance method class module file path line word character byte offset window "
    "request response server client stream batch queue worker partition record shard marker "
    "python rust kafka arrow thinking reasoning draft target prompt completion template"
)
_WORDS = tuple(_WORD_TEXT.split())
# a little non-ASCII, as real outputs have (and so that cuts can land inside a character)
_RARE_WORDS = ("café", "naïve", "déjà", "straße", "日本語", "中文", "emoji🙂", "→", "±", "½", "Ω")
_OPENERS = ("Let me", "Okay,", "Hmm,", "Wait,", "So", "First,", "Now", "Alright,", "Actually,")
_CODE_LINES = (
    "def solve(values):",
    "    total = 0",
    "    for i, v in enumerate(values):",
    "        total += v * i",
    "    return total",
    "x = [n ** 2 for n in range(10) if n % 3]",
    'print(f"{name}: {count}")',
    "assert result == expected, result",
    "if __name__ == '__main__':",
    "    main()",
)


def _sentence(rng: random.Random, opener: bool) -> str:
    words = [rng.choice(_WORDS) for _ in range(rng.randint(4, 14))]
    if rng.random() < 0.15:
        words[rng.randrange(len(words))] = rng.choice(_RARE_WORDS)
    if rng.random() < 0.2:
        words.insert(rng.randrange(len(words)), str(rng.randint(0, 9999)))
    text = " ".join(words)
    text = f"{rng.choice(_OPENERS)} {text}" if opener else text[0].upper() + text[1:]
    return text + rng.choice((".", ".", ".", "?", "!", ":"))


def prose(rng: random.Random, budget: int, count: TokenCounter, thinking: bool) -> str:
    """Paragraphs of sentences, about `budget` tokens long (at least one word)."""
    pieces: list[str] = []
    used = 0
    left_in_paragraph = rng.randint(1, 4)
    while used < budget:
        separator = ""
        if pieces:
            left_in_paragraph -= 1
            separator = " " if left_in_paragraph > 0 else "\n\n"
            if left_in_paragraph <= 0:
                left_in_paragraph = rng.randint(1, 4)
        sentence = _sentence(rng, opener=thinking and rng.random() < 0.4)
        cost = count(separator + sentence)
        if used + cost > budget:
            # the last sentence is cut to the words that fit (like a budget-bound writer)
            words = sentence.split(" ")
            while len(words) > 1 and used + count(separator + " ".join(words)) > budget:
                words.pop()
            if not pieces or used + count(separator + " ".join(words)) <= budget:
                pieces.append(separator + " ".join(words))
            break
        pieces.append(separator + sentence)
        used += cost
    return "".join(pieces)


def answer(rng: random.Random, budget: int, count: TokenCounter) -> str:
    """An answer of about `budget` tokens: prose, sometimes around a fenced code block."""
    if budget < 60 or rng.random() < 0.5:
        return prose(rng, budget, count, thinking=False)
    code = "\n".join(rng.sample(_CODE_LINES, rng.randint(2, 5)))
    block = f"\n\n```python\n{code}\n```\n\n"
    head = prose(rng, budget // 3, count, thinking=False)
    rest = budget - count(head) - count(block)
    if rest < 5:
        return head
    return head + block + prose(rng, rest, count, thinking=False)


def loop(rng: random.Random, budget: int, count: TokenCounter) -> str:
    """An answer that falls into a loop: a sentence, then one paragraph written over and over
    until about `budget` tokens (a low-temperature thinking model's failure)."""
    head = _sentence(rng, opener=False)
    paragraph = " ".join(_sentence(rng, opener=False) for _ in range(rng.randint(2, 4)))
    each = max(1, count(paragraph + "\n\n"))
    times = max(3, (budget - count(head)) // each)
    return head + "\n\n" + "\n\n".join([paragraph] * times)


def arguments_for(rng: random.Random, parameters: Any) -> dict[str, Any]:
    """Plausible arguments for a JSON-schema `parameters` object: required ones plus some more."""
    if not isinstance(parameters, dict):
        return {}
    properties = parameters.get("properties") or {}
    if not isinstance(properties, dict):
        return {}
    required = set(parameters.get("required") or [])
    args: dict[str, Any] = {}
    for name, schema in properties.items():
        if name in required or rng.random() < 0.5:
            args[name] = _value_for(rng, schema if isinstance(schema, dict) else {})
    return args


def _value_for(rng: random.Random, schema: dict[str, Any]) -> Any:
    if schema.get("enum"):
        return rng.choice(schema["enum"])
    kind = schema.get("type")
    if isinstance(kind, list):
        kind = next((k for k in kind if k != "null"), "string")
    if kind == "integer":
        return rng.randint(0, 100)
    if kind == "number":
        return round(rng.uniform(0, 100), 2)
    if kind == "boolean":
        return rng.random() < 0.5
    if kind == "array":
        return [_value_for(rng, schema.get("items") or {}) for _ in range(rng.randint(0, 3))]
    if kind == "object":
        return arguments_for(rng, schema)
    return " ".join(rng.choice(_WORDS) for _ in range(rng.randint(1, 4)))
