"""What every normalization profile must be, checked over whatever `PROFILES` holds: a server
version range added in one module and one list is covered without editing a test."""

from __future__ import annotations

import dataclasses

import pytest
from pydantic import ValidationError

from streams.cli.main import build_parser
from streams.core.serving import (
    PROFILES,
    ServerNormalization,
    profile_for_version,
    profile_named,
    profiles_of,
)
from streams.core.settings import GenerateSettings, KafkaSettings

USER = [{"role": "user", "content": "What is 2 + 2?"}]
TOOLS = [{"type": "function", "function": {"name": "add", "parameters": {"type": "object"}}}]


@pytest.fixture(params=list(PROFILES))
def profile(request: pytest.FixtureRequest) -> ServerNormalization:
    return PROFILES[request.param]


def test_its_name_says_its_server_and_first_version(profile: ServerNormalization) -> None:
    """`sglang-0.5.9`: from 0.5.9 on; the oldest of a kind covers every version before the
    next and is named for the oldest it was checked against."""
    assert list(PROFILES).count(profile.name) == 1
    of_kind = profiles_of(profile.kind)
    if profile is of_kind[0]:
        assert profile.name.startswith(f"{profile.kind}-")
    else:
        assert profile.name == f"{profile.kind}-{'.'.join(map(str, profile.since))}"
        assert profile.since > of_kind[of_kind.index(profile) - 1].since  # newest last


def test_the_version_it_starts_at_picks_it_and_the_flag_takes_it(
    profile: ServerNormalization,
) -> None:
    version = ".".join(map(str, profile.since))
    assert profile_for_version(version, profile.kind) is profile
    argv = ["worker", "generate", "--normalization", profile.name]
    assert build_parser(argv).parse_args(argv).normalization == profile.name


def test_it_prepares_a_plain_request_as_a_template_takes_it(profile: ServerNormalization) -> None:
    messages, tools = profile.prepare(USER, TOOLS)
    assert [(m["role"], m["content"]) for m in messages] == [("user", USER[0]["content"])]
    # old SGLang hands the template the bare function, the others the OpenAI tool
    assert tools is not None and [t.get("function", t)["name"] for t in tools] == ["add"]
    assert profile.prepare(USER, None)[1] is None


def test_a_toy_profile_registered_here_alone_is_chosen_named_and_offered() -> None:
    """A profile is one entry of `PROFILES`: registered at run time (here, nowhere else), the
    version it starts at picks it, `--normalization` offers it, the setting takes it, and the
    version before it still picks the profile before."""
    newest = profiles_of("sglang")[-1]
    toy = dataclasses.replace(newest, name="sglang-9.9", since=(9, 9))
    with PROFILES.registered(toy.name, toy):
        assert profile_for_version("9.9.1") is toy
        assert profile_for_version("9.8") is newest
        assert profile_named("sglang-9.9") is toy
        argv = ["worker", "generate", "--normalization", toy.name]
        assert build_parser(argv).parse_args(argv).normalization == toy.name
        assert generate_settings(toy.name).normalization == toy.name
        test_its_name_says_its_server_and_first_version(toy)
        test_it_prepares_a_plain_request_as_a_template_takes_it(toy)
    assert profile_for_version("9.9.1") is newest
    with pytest.raises(ValidationError, match=r"sglang-9\.9"):
        generate_settings(toy.name)


def generate_settings(normalization: str) -> GenerateSettings:
    kafka = KafkaSettings(bootstrap="127.0.0.1:9")
    return GenerateSettings(server="http://s", kafka=kafka, normalization=normalization)
