"""A generate worker's group identity: --instance-id, else its host's slot, or dynamic."""

from __future__ import annotations

from pathlib import Path

from streams.core.settings import GenerateSettings, KafkaSettings, ObserveSettings
from streams.generate.app import member_id

GROUP = "p-draftgen-generate"
URL = "http://10.0.0.7:30000"


def test_the_worker_s_identity_flag_default_and_opt_out(tmp_path: Path) -> None:
    kafka = KafkaSettings(bootstrap="127.0.0.1:9")
    observe = ObserveSettings(state_dir=str(tmp_path))
    named = GenerateSettings(server=URL, kafka=kafka, instance_id="gen-a")
    assert member_id(named, observe, GROUP) == "gen-a"
    assert not (tmp_path / "members").exists()  # a given id claims no slot
    dynamic = GenerateSettings(server=URL, kafka=kafka, static_membership=False)
    assert member_id(dynamic, observe, GROUP) is None
    default = GenerateSettings(server=URL, kafka=kafka)
    first, second = member_id(default, observe, GROUP), member_id(default, observe, GROUP)
    assert first is not None and second is not None
    assert first.endswith("-10.0.0.7_30000-0") and second.endswith("-10.0.0.7_30000-1")
