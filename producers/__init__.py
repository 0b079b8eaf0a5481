"""Prompt producers: read prompt sources, normalize them, give each prompt its stable id."""

from producers.sources import (
    SourceSpec,
    bundled_sample_path,
    iter_rows,
    mix_sources,
    parse_source_spec,
    row_error,
)
from streams.core.normalize import (
    make_prompt_record,
    normalize_conversation,
    prompt_id,
    validate_prompt_messages,
)

__all__ = [
    "SourceSpec",
    "bundled_sample_path",
    "iter_rows",
    "make_prompt_record",
    "mix_sources",
    "normalize_conversation",
    "parse_source_spec",
    "prompt_id",
    "row_error",
    "validate_prompt_messages",
]
