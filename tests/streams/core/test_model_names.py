"""A served model's name, whatever path its weights were loaded from (streams/core/model_names.py):
the one model the settings hash covers, for the worker and for `draftgen audit` alike."""

from __future__ import annotations

import pytest

from streams.core.ledger import settings_hash
from streams.core.model_names import model_name
from streams.tools.audit_ids import completion_settings

HF_CACHE = "/root/.cache/huggingface/hub/models--moonshotai--Kimi-K2.6/snapshots/0a1b2c3d"
SAMPLING = {"temperature": 1.0, "top_p": 0.95}


@pytest.mark.parametrize(
    ("served", "name"),
    [
        ("/mnt/a/Kimi-K2.6", "Kimi-K2.6"),
        ("/mnt/a/Kimi-K2.6/", "Kimi-K2.6"),
        ("~/weights/Kimi-K2.6", "Kimi-K2.6"),
        ("./Kimi-K2.6", "Kimi-K2.6"),
        ("weights/v2/Kimi-K2.6", "Kimi-K2.6"),
        (HF_CACHE, "moonshotai/Kimi-K2.6"),
        (f"{HF_CACHE}/", "moonshotai/Kimi-K2.6"),
        ("/data/hub/models--gpt2/snapshots/e7da7f2", "gpt2"),
        # served names that are no paths stay as they are: their ledger keys too
        ("Kimi-K2.6", "Kimi-K2.6"),
        ("moonshotai/Kimi-K2.6", "moonshotai/Kimi-K2.6"),
        ("kimi", "kimi"),
        ("", ""),
        ("/", "/"),
    ],
)
def test_a_weights_path_is_its_models_name(served: str, name: str) -> None:
    assert model_name(served) == name


def test_two_path_spellings_of_one_model_hash_alike() -> None:
    """Nodes mounting the weights at different paths claim in one space."""
    here = settings_hash("/mnt/a/Kimi-K2.6", SAMPLING, True, "final")
    assert here == settings_hash("/data/weights/Kimi-K2.6/", SAMPLING, True, "final")
    assert here == settings_hash("Kimi-K2.6", SAMPLING, True, "final")
    assert settings_hash(HF_CACHE, SAMPLING, True, "final") == settings_hash(
        "moonshotai/Kimi-K2.6", SAMPLING, True, "final"
    )
    assert here != settings_hash("/mnt/a/Kimi-K2.5", SAMPLING, True, "final")


def test_a_plain_names_key_is_the_one_it_had() -> None:
    """Ledgers written before the names were normalized keep their keys (computed then)."""
    assert settings_hash("Kimi-K2.6", SAMPLING, True, "final") == "bd34f588292e22d0"
    assert settings_hash("moonshotai/Kimi-K2.6", SAMPLING, True, "final") == "f45e79769e715d8a"


def test_audit_hashes_a_completion_as_a_worker_of_another_path_did() -> None:
    """A completion records the name its server answered; audit finds it under the settings a
    worker whose server named the same weights by another path claimed it with."""
    completion = {"model": "/mnt/b/Kimi-K2.6", "sampling": dict(SAMPLING)}
    claimed = settings_hash("/mnt/a/Kimi-K2.6", SAMPLING, True, "final")
    assert completion_settings(completion) == claimed
