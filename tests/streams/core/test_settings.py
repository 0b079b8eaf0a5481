"""The settings package: every name still imported from `streams.core.settings`, one spelling
per setting, environment names that set one setting each, modules within their size."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from pydantic_settings import BaseSettings

import streams.core.settings as settings_package
from streams.cli.flags import env_names, flag_of
from streams.core.settings import (
    ExportSettings,
    RunSettings,
    SamplePolicy,
    SealSettings,
    TokenizeSettings,
)

PACKAGE = Path(settings_package.__file__).parent


def settings_classes() -> list[type[BaseSettings]]:
    found = [getattr(settings_package, name) for name in settings_package.__all__]
    return [c for c in found if isinstance(c, type) and issubclass(c, BaseSettings)]


def test_every_name_of_the_package_imports() -> None:
    for name in settings_package.__all__:
        assert getattr(settings_package, name) is not None, name


def test_a_flag_is_its_fields_name() -> None:
    for cls in settings_classes():
        for name, field in cls.model_fields.items():
            flag = flag_of(name, field)
            if flag is None:
                continue
            spelled = flag.removeprefix("--").removeprefix("no-").replace("-", "_")
            assert spelled in (name, name.removesuffix("s")), (cls.__name__, name, flag)


def test_a_setting_that_means_something_else_has_its_own_environment_name(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("DRAFTGEN_RUN_TIMEOUT_S", "7")
    monkeypatch.setenv("DRAFTGEN_SEAL_TIMEOUT_S", "9")
    monkeypatch.setenv("DRAFTGEN_RUN_IDLE_FLUSH_S", "3")
    monkeypatch.setenv("DRAFTGEN_IDLE_FLUSH_S", "4")
    monkeypatch.setenv("DRAFTGEN_ON_LENGTH", "keep")
    assert RunSettings().timeout_s == 7 and RunSettings().idle_flush_s == 3
    seal = SealSettings(storage={"out": "o"}, dataset="v", kafka={"bootstrap": "h:1"})
    assert seal.timeout_s == 9
    tokenize = TokenizeSettings(
        tokenizer_dir="t", dataset="v", storage={"out": "o"}, kafka={"bootstrap": "h:1"}
    )
    assert tokenize.idle_flush_s == 4 and tokenize.policy.on_length == "keep"
    assert env_names(SamplePolicy, "on_length") == ["DRAFTGEN_ON_LENGTH"]


def test_export_cuts_by_the_shared_length_rules_truncating_by_default() -> None:
    export = ExportSettings(storage={"out": "o"}, dataset="v", format="hf", to="x")
    assert export.cut.on_max_seq_len == "truncate" and SamplePolicy().on_max_seq_len == "drop"
    assert set(SamplePolicy.model_fields) > set(type(export.cut).model_fields)


def test_no_module_of_the_package_is_over_450_lines() -> None:
    for module in PACKAGE.glob("*.py"):
        assert len(module.read_text().splitlines()) <= 450, module.name


def test_the_top_level_help_imports_no_settings_class() -> None:
    """`draftgen --help` starts without pydantic (the command's flags are built when chosen)."""
    probe = (
        "import sys\n"
        "from streams.cli.main import main\n"
        "try:\n"
        "    main(['--help'])\n"
        "except SystemExit:\n"
        "    pass\n"
        "print(sorted(m for m in ('pydantic', 'aiokafka', 'faust') if m in sys.modules))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, check=True
    )
    assert done.stdout.strip().splitlines()[-1] == "[]"
