"""Token ids as plain lists for comparisons: decoded records and samples hold numpy arrays."""

from __future__ import annotations

from typing import Any

import numpy as np


def as_list(ids: Any) -> list[int]:
    """None (no ids) as []; an array or a list as a list of Python ints."""
    return [] if ids is None else list(np.asarray(ids).tolist())
