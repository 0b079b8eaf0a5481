"""What a server's chat endpoint does to a request before the chat template, per server and
version: SGLang's profiles (sglang.py) and vLLM's (vllm.py; its content format detector in
vllm_format.py), one per version range.

A prompt rendered any other way than the server renders it is another prompt: the drift check,
the rendered path, `--api native` and the emulator all prepare requests with these profiles. A
profile is chosen from what the server reports (SGLang's `/server_info` `version`, vLLM's
`/version`), the newest SGLang one when it reports none (`profile_for_version`), or forced by
name (`--normalization`).
"""

from __future__ import annotations

import re
from typing import Any

from streams.core.registry import Registry
from streams.core.serving.base import ContentFormat, NormalizationError, ServerNormalization
from streams.core.serving.sglang import SGLANG_PROFILES, SglangNormalization, detect_content_format
from streams.core.serving.vllm import VLLM_PROFILES, VllmNormalization
from streams.core.serving.vllm_format import detect_vllm_content_format

SGLANG = "sglang"
VLLM = "vllm"
# every profile by name: SGLang's, then vLLM's, each newest last. A kind's version ranges are
# ordered by the version each starts at (`profiles_of`), so one registered later takes its place.
_BUILT_IN: tuple[ServerNormalization, ...] = (*SGLANG_PROFILES, *VLLM_PROFILES)
PROFILES: Registry[ServerNormalization] = Registry(
    "normalization profile", ((p.name, p) for p in _BUILT_IN)
)
# the default: records written before profiles, servers that report no version
NEWEST: ServerNormalization = SGLANG_PROFILES[-1]
NEWEST_VLLM: ServerNormalization = VLLM_PROFILES[-1]
_VERSION = re.compile(r"v?(\d+(?:\.\d+)*)")


def parse_version(text: Any) -> tuple[int, ...] | None:
    """`0.5.23`, `v0.5.23.post1`, `0.5.23rc0+cu128` → (0, 5, 23); None when not a version."""
    if not isinstance(text, str):
        return None
    match = _VERSION.match(text.strip())
    if match is None:
        return None
    return tuple(int(part) for part in match.group(1).split("."))


def profiles_of(kind: str) -> list[ServerNormalization]:
    """A server kind's profiles, oldest first: each covers the versions up to the next one's."""
    profiles = sorted((p for p in PROFILES.values() if p.kind == kind), key=lambda p: p.since)
    if not profiles:
        raise ValueError(f"no normalization profile for servers of kind {kind!r}")
    return profiles


def profile_for_version(version: Any, kind: str = SGLANG) -> ServerNormalization:
    """The profile of a version a server of `kind` reports; its newest for an unknown one."""
    profiles = profiles_of(kind)
    parsed = parse_version(version)
    if parsed is None:
        return profiles[-1]
    chosen = profiles[0]
    for profile in profiles:
        if parsed >= profile.since:
            chosen = profile
    return chosen


def profile_named(name: str | None) -> ServerNormalization:
    """A profile by name; the newest SGLang one for None or "" (records written before
    profiles)."""
    if not name:
        return NEWEST
    return PROFILES.named(name)


__all__ = [
    "NEWEST",
    "NEWEST_VLLM",
    "PROFILES",
    "SGLANG",
    "SGLANG_PROFILES",
    "VLLM",
    "VLLM_PROFILES",
    "ContentFormat",
    "NormalizationError",
    "ServerNormalization",
    "SglangNormalization",
    "VllmNormalization",
    "detect_content_format",
    "detect_vllm_content_format",
    "parse_version",
    "profile_for_version",
    "profile_named",
    "profiles_of",
]
