"""Token ids as plain lists for comparisons: decoded records and samples hold numpy arrays."""

from __future__ import annotations

from typing import Any

import numpy as np


def as_list(ids: Any) -> list[int]:
    """None (no ids) as []; an array or a list as a list of Python ints."""
    values: list[int] = [] if ids is None else np.asarray(ids).tolist()
    return values
