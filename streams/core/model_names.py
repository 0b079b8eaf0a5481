"""The name of a served model, whatever path its weights were loaded from.

SGLang and vLLM name the model they serve after its `--model-path` (`--model`) unless
`--served-model-name` says otherwise, so two nodes that mount the same weights at different
paths report different names. `model_name` makes such a path its model's name: it is the model
the ledger's settings hash covers (streams/core/ledger.py `settings_hash`, for the worker and
for `draftgen audit` alike) and the one a worker's start-up check compares with the run's
(streams/generate/identity.py).
"""

from __future__ import annotations

# Hugging Face's cache keeps repository `org/name` in `.../models--org--name/snapshots/<sha>`
# (a repository id never holds "--", so the split is exact)
_HF_CACHE = "models--"


def is_path(name: str) -> bool:
    """Whether a served name is a path: absolute, from home or the current directory, or of
    more components than a repository id's `org/name` (a relative `dir/name` reads as one)."""
    return name.startswith(("/", "~", "./", "../")) or name.count("/") > 1


def model_name(served: str) -> str:
    """A weights path -> its model's name: `org/name` of a Hugging Face cache path, else its
    last component (`/mnt/a/Kimi-K2.6` -> `Kimi-K2.6`). Any other name (`Kimi-K2.6`,
    `moonshotai/Kimi-K2.6`) is kept as is, so the ledger keys of such names stay as they were."""
    if not is_path(served):
        return served
    parts = [part for part in served.split("/") if part not in ("", ".", "..", "~")]
    for part in reversed(parts):
        if part.startswith(_HF_CACHE) and len(part) > len(_HF_CACHE):
            return part.removeprefix(_HF_CACHE).replace("--", "/")
    return parts[-1] if parts else served
