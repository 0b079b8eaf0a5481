"""How many requests a server runs at once, from SGLang's `/server_info` (`--concurrency auto`).

SGLang answers `/server_info` (older servers only `/get_server_info`) with its server arguments
flattened at the top level, where `max_running_requests` is the `--max-running-requests` flag
(null unless it was given), plus `internal_states`, one entry per data-parallel rank, whose
`effective_max_running_requests_per_dp` is the cap the scheduler actually uses (derived from
GPU memory when the flag is absent; newer servers). The scheduler's figure wins: it is what the
running batch holds.
"""

from __future__ import annotations

from typing import Any

# newest name first; a 404 moves on to the next
SERVER_INFO_PATHS = ("/server_info", "/get_server_info")
# per-rank cap in an `internal_states` entry, by server version
_RANK_CAP_FIELDS = ("effective_max_running_requests_per_dp", "max_running_requests")


def _positive(value: Any) -> int | None:
    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
        return value
    return None


def _rank_cap(state: Any) -> int | None:
    if not isinstance(state, dict):
        return None
    for name in _RANK_CAP_FIELDS:
        if (cap := _positive(state.get(name))) is not None:
            return cap
    return None


def running_cap(info: Any) -> int | None:
    """The server's running-request cap from its /server_info answer, or None if it says none:
    the per-rank caps summed over the ranks, else the top-level server argument."""
    if not isinstance(info, dict):
        return None
    states = info.get("internal_states")
    if isinstance(states, list) and states:
        caps = [_rank_cap(state) for state in states]
        if all(cap is not None for cap in caps):
            return sum(cap for cap in caps if cap is not None)
    return _positive(info.get("max_running_requests"))
