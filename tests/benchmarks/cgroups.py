"""A CPU budget per benchmark process, with the cgroup v1 `cpu` controller (Linux, root).

    with cpu_caps(0.25) as caps:          # 0.25 core each: 25,000 µs of every 100,000 µs
        group = caps.cap(pid, "worker-0")  # the process and the children it forks later
        ...
        group.throttling()                 # cpu.stat: periods, throttled ones, throttled time

A group is /sys/fs/cgroup/cpu/draftgen-bench-<run uuid>-<name>, one per process capped. On the
way out, processes still in a group are moved back to the root group and each group is removed
(rmdir, by its path; only the groups this block created). `available()` says whether caps can
be applied here, and if not, why.
"""

from __future__ import annotations

import contextlib
import os
import re
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

CPU_ROOT = Path("/sys/fs/cgroup/cpu")
PERIOD_US = 100_000
PREFIX = "draftgen-bench-"


@dataclass(frozen=True)
class Availability:
    """Truthy when caps can be applied; `why` says why not."""

    ok: bool
    why: str = ""

    def __bool__(self) -> bool:
        return self.ok


def _v1_cpu_mounted(root: Path) -> bool:
    """`root` is a cgroup (v1) mount whose controllers include `cpu`."""
    target = os.path.realpath(root)  # often a symlink to cpu,cpuacct
    for line in Path("/proc/self/mounts").read_text().splitlines():
        fields = line.split()
        if len(fields) >= 4 and fields[1] == target and fields[2] == "cgroup":
            return "cpu" in fields[3].split(",")
    return False


def available(root: Path = CPU_ROOT) -> Availability:
    """Root, the v1 `cpu` controller mounted at `root`, and a group can be made there."""
    if not hasattr(os, "geteuid") or os.geteuid() != 0:
        return Availability(False, "not root (cgroup directories need root)")
    if not (root / "cpu.cfs_quota_us").exists() or not _v1_cpu_mounted(root):
        return Availability(False, f"no cgroup v1 `cpu` controller mounted at {root}")
    probe = root / f"{PREFIX}probe-{uuid.uuid4().hex[:8]}"
    try:
        probe.mkdir()
        try:
            (probe / "cpu.cfs_quota_us").write_text(str(PERIOD_US))
        finally:
            probe.rmdir()
    except OSError as err:
        return Availability(False, f"cannot make a group under {root}: {err}")
    return Availability(True)


@dataclass(frozen=True)
class Throttling:
    """A group's cpu.stat (cumulative since the group was made)."""

    periods: int = 0  # enforcement periods in which the group ran
    throttled: int = 0  # of those, the ones in which it hit its quota
    throttled_s: float = 0.0  # time its threads waited for the next period

    def __sub__(self, other: Throttling) -> Throttling:
        return Throttling(
            self.periods - other.periods,
            self.throttled - other.throttled,
            self.throttled_s - other.throttled_s,
        )

    def __add__(self, other: Throttling) -> Throttling:
        return Throttling(
            self.periods + other.periods,
            self.throttled + other.throttled,
            self.throttled_s + other.throttled_s,
        )


def read_throttling(group: Path) -> Throttling:
    """cpu.stat of a group (no cpuacct needed): nr_periods, nr_throttled, throttled_time."""
    stat: dict[str, int] = {}
    for line in (group / "cpu.stat").read_text().splitlines():
        name, _, value = line.partition(" ")
        if value.strip().isdigit():
            stat[name] = int(value)
    return Throttling(
        stat.get("nr_periods", 0), stat.get("nr_throttled", 0), stat.get("throttled_time", 0) / 1e9
    )


@dataclass(frozen=True)
class CpuGroup:
    path: Path
    quota_cores: float

    def throttling(self) -> Throttling:
        return read_throttling(self.path)

    def pids(self) -> list[int]:
        with contextlib.suppress(FileNotFoundError):
            return [int(p) for p in (self.path / "cgroup.procs").read_text().split()]
        return []


class CpuCaps:
    """The groups of one `cpu_caps` block (use that)."""

    def __init__(
        self,
        quota_cores: float,
        root: Path = CPU_ROOT,
        period_us: int = PERIOD_US,
        shares: int | None = None,
    ):
        if quota_cores <= 0:
            raise ValueError("a CPU quota must be positive")
        self.quota_cores = quota_cores
        self.root = root
        self.period_us = period_us
        self.shares = shares  # CPU weight of each group (None: the default, 1,024)
        self.run = uuid.uuid4().hex[:8]
        self.groups: list[CpuGroup] = []

    def cap(self, pid: int, name: str) -> CpuGroup:
        """A new group with the quota; `pid` (all its threads) moved into it. Children it
        forks afterwards start in the group too."""
        safe = re.sub(r"[^A-Za-z0-9_.-]", "_", name)
        path = self.root / f"{PREFIX}{self.run}-{safe}"
        path.mkdir()
        group = CpuGroup(path, self.quota_cores)
        self.groups.append(group)  # removed on exit even if what follows fails
        (path / "cpu.cfs_period_us").write_text(str(self.period_us))
        (path / "cpu.cfs_quota_us").write_text(str(round(self.quota_cores * self.period_us)))
        if self.shares is not None:
            (path / "cpu.shares").write_text(str(self.shares))
        (path / "cgroup.procs").write_text(str(pid))
        return group

    def set_quota(self, quota_cores: float) -> None:
        """A new quota for every group of this block, and for those made later."""
        self.quota_cores = quota_cores
        for group in self.groups:
            (group.path / "cpu.cfs_quota_us").write_text(str(round(quota_cores * self.period_us)))
        self.groups = [CpuGroup(g.path, quota_cores) for g in self.groups]

    def close(self) -> list[str]:
        """Move what is left to the root group and remove the groups; returns problems."""
        problems: list[str] = []
        for group in self.groups:
            for pid in group.pids():
                try:
                    (self.root / "cgroup.procs").write_text(str(pid))
                except ProcessLookupError:  # exited meanwhile
                    pass
                except OSError as err:
                    problems.append(f"pid {pid} not moved out of {group.path}: {err}")
            problems += remove_group(group.path)
        self.groups = []
        return problems


def remove_group(path: Path) -> list[str]:
    """Removes an emptied group by its path; returns the problem, if it would not go."""
    problem = ""
    for _ in range(50):  # a process that just exited may still be listed
        try:
            path.rmdir()
            return []
        except FileNotFoundError:
            return []
        except OSError as err:
            problem = f"{path} not removed: {err}"
            time.sleep(0.1)
    return [problem]


@contextlib.contextmanager
def priority(shares: int = 8 * 1024, root: Path = CPU_ROOT) -> Iterator[Path]:
    """This process, and every child it starts from now on, in a group of `shares` CPU weight
    and no quota: on a machine busy with other work, what a benchmark runs uncapped (broker,
    servers, producers) still gets the CPU first, and its capped groups (which get the same
    weight) reach their quota. A root-group process weighs 1,024."""
    path = root / f"{PREFIX}{uuid.uuid4().hex[:8]}-priority"
    path.mkdir()
    try:
        (path / "cpu.shares").write_text(str(shares))
        (path / "cgroup.procs").write_text(str(os.getpid()))
        yield path
    finally:
        for pid in (path / "cgroup.procs").read_text().split():
            with contextlib.suppress(ProcessLookupError):
                (root / "cgroup.procs").write_text(pid)
        for problem in remove_group(path):
            print(f"cgroups: {problem}", flush=True)


@contextlib.contextmanager
def cpu_caps(
    quota_cores: float, root: Path = CPU_ROOT, shares: int | None = None
) -> Iterator[CpuCaps]:
    """Groups of `quota_cores` each for the processes given to `.cap`, removed on exit."""
    caps = CpuCaps(quota_cores, root, shares=shares)
    try:
        yield caps
    finally:
        for problem in caps.close():
            print(f"cgroups: {problem}", flush=True)
