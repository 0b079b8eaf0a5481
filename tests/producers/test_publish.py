"""publish's total for its progress meter: the sources' rows, or the limit if smaller."""

from __future__ import annotations

from pathlib import Path

from producers.publish import rows_to_publish
from producers.sources import SourceSpec


def test_publishrows_to_publish_is_the_sources_rows_or_the_limit_whichever_is_smaller(
    tmp_path: Path,
) -> None:
    source = tmp_path / "p.jsonl"
    source.write_text('{"prompt": "a"}\n{"prompt": "b"}\n{"prompt": "c"}\n')
    specs = [SourceSpec(str(source))]
    assert rows_to_publish(specs, None, None) == 3
    assert rows_to_publish(specs, 2, None) == 2
    assert rows_to_publish(specs, 10, None) == 3
    array = tmp_path / "a.json"
    array.write_text('[{"prompt": "a"}]')
    assert rows_to_publish([SourceSpec(str(array))], None, None) is None  # counted only by reading
    assert rows_to_publish([SourceSpec(str(array))], 5, None) == 5
    assert rows_to_publish([SourceSpec(str(tmp_path / "missing.jsonl"))], None, None) is None
