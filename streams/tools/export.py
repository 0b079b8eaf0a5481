"""`draftgen export`: a dataset version as the file a trainer takes.

- `specforge`: JSON lines `{"prompt_id", "input_ids", "loss_mask"}`. SpecForge reads a JSONL
  whose first record has both `input_ids` and `loss_mask` as pre-tokenized
  (specforge/data/prompt_builder.py): it cuts each row to its `data.max_length` (keeping the
  head) and then skips rows with fewer supervised tokens than the strategy's minimum (2 for
  DFlash / DSpark / Domino, which also need two adjacent supervised tokens; 1 for EAGLE-3).
  The export applies the same two rules itself, `--max-seq-len` then `--min-loss-run`, so the
  file holds exactly the rows SpecForge will train on and the drops are counted here.
- `hf`: a `datasets` `save_to_disk` directory (its Arrow data files written here, shard by
  shard, and opened memory-mapped by `load_from_disk`); `parquet`: one Parquet file. Both keep
  every shard column (token lists cut to `--max-seq-len`, counts recomputed) plus `truncated`.
- `conversations`: the completion behind each exported row, as OpenAI messages
  (streams/tools/conversations.py); JSON lines, or Parquet for an `--to` ending in
  `.parquet`. The rules choose the rows as for the token formats; the conversation is whole.

Each format is a `Writer` (streams/tools/export_writers.py) registered in
streams/tools/export_formats.py, the one list of them. The rules are export_rules.py's, the
output files and their splitting export_parts.py's; this module runs them shard by shard.

Filters (`--source`, `--finish-reason`, `--min-len`/`--max-len` on the stored length) are
applied before the length rules. `--rows-per-file` / `--tokens-per-file` split the output into
numbered files (`--to` is then a directory of `part-NNNNN.*`; for `hf`, the data files of
the one `save_to_disk` directory). Everything is vectorized per shard and written before the
next shard is read: memory is one shard (plus, for `conversations`, its window's completions
of the exported rows), whatever the version's size. The output is written beside its final
name and renamed into place when complete.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pyarrow as pa

from sinks.reader import DatasetReader, ShardRef
from streams.tools.export_parts import FileSplit, SplitFiles
from streams.tools.export_rules import ExportRules, ExportSummary, apply_rules
from streams.tools.export_writers import Writer


@contextmanager
def _in_place(output: Path) -> Iterator[Path]:
    """A temporary directory beside `output`, whose entry named like it is renamed to it when
    the block succeeds."""
    if output.exists():
        raise FileExistsError(f"{output} exists; remove it or choose another --to")
    output.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{output.name}.", dir=output.parent))
    try:
        yield tmp / output.name
        os.replace(tmp / output.name, output)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


Completions = Callable[[ShardRef, pa.Table, ExportSummary], pa.Table]
_UNSPLIT = FileSplit()  # frozen, so one instance serves as every call's default


def export(
    reader: DatasetReader,
    writer: Writer,
    rules: ExportRules,
    split: FileSplit = _UNSPLIT,
    conversations: Completions | None = None,
) -> ExportSummary:
    """Shard by shard: read, filter and cut, (for a format that needs them, join with the
    completions that became the rows: `conversations`), write to `writer.output`. Memory is one
    shard and the writer of one output file."""
    summary = ExportSummary(format=writer.name, output=str(writer.output))
    with _in_place(writer.output) as tmp:
        if writer.directory or split.active:
            tmp.mkdir()
            files = SplitFiles(tmp, writer.open_part, split, summary, writer.part_name)
        else:
            files = SplitFiles(tmp.parent, writer.open_part, split, summary, lambda i: tmp.name)
        for ref in reader.shards():
            table = apply_rules(reader.read_shard(ref), rules, summary)
            if conversations is not None and table.num_rows:
                table = conversations(ref, table, summary)
            files.write(table)
        files.close()
        writer.finish(tmp, summary)
    return summary


# what `export` takes and returns (the command line builds the rules and the split)
__all__ = ["ExportRules", "ExportSummary", "FileSplit", "export"]
