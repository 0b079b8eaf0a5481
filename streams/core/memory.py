"""Fewer malloc arenas for a worker whose threads churn through large buffers.

glibc gives each thread that allocates an arena of its own (up to eight per core). A tokenize
worker's threads (the sample builder's, the encoder's pool, s3fs's event loop) each allocate
and free a window's texts, ids and Arrow buffers over and over, and memory freed in one arena
is not reused by another: the worker's RSS settles hundreds of MB above what it holds
(BENCHMARKS.md, "The seed run at full size"). Two arenas, as `MALLOC_ARENA_MAX=2` does; a
MALLOC_ARENA_MAX the user set wins, and elsewhere than glibc this does nothing.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os

M_ARENA_MAX = -8  # glibc's malloc.h


def limit_malloc_arenas(arenas: int = 2) -> bool:
    """Before the worker's threads start; True if glibc took it."""
    if os.environ.get("MALLOC_ARENA_MAX"):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    except OSError:
        return False
    mallopt = getattr(libc, "mallopt", None)
    return bool(mallopt is not None and mallopt(M_ARENA_MAX, arenas) == 1)
