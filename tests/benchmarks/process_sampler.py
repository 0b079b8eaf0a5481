"""RSS and CPU time of a benchmark's process and every process under it, over the whole run, by
what each process is (kafka, seaweedfs, a draftgen command, the benchmark)."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


def _proc_stat(pid: int) -> tuple[int, float, float] | None:
    """(parent pid, CPU seconds, RSS MiB) of a live process, else None."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    ticks = os.sysconf("SC_CLK_TCK")
    page = os.sysconf("SC_PAGE_SIZE")
    return (
        int(fields[1]),
        (int(fields[11]) + int(fields[12])) / ticks,
        int(fields[21]) * page / 2**20,
    )


def _label(pid: int) -> str:
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return "?"
    words = [a.decode(errors="replace") for a in argv if a]
    if any(w.endswith("java") for w in words[:1]):
        return "kafka"
    if words and words[0].endswith("weed"):
        return "seaweedfs"
    if "streams" in words:
        command = words[words.index("streams") + 1 :]
        command = [w for w in command if w not in ("--log-level", "INFO", "WARNING")]
        name = command[0] if command else "draftgen"
        if name == "replay":
            return "replay worker" if "--settings" in command else "replay (parent)"
        return name
    if pid == os.getpid():
        return "benchmark"
    if "multiprocessing" in " ".join(words):
        return "bench helper"  # the pool's maker, then the producers
    return Path(words[0]).name if words else "?"


@dataclass
class Series:
    label: str
    t: list[float] = field(default_factory=list)
    rss_mb: list[float] = field(default_factory=list)
    cpu_s: float = 0.0  # the latest reading


class Sampler:
    """Every `interval` s: RSS and CPU time of this process and every process under it."""

    def __init__(self, interval: float = 0.5):
        self.interval = interval
        self.started = time.monotonic()
        self.series: dict[int, Series] = {}
        self.stages: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Sampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def now(self) -> float:
        return time.monotonic() - self.started

    def _tree(self) -> dict[int, tuple[float, float]]:
        """pid → (CPU s, RSS MiB) of this process and its descendants."""
        stats = {}
        for entry in os.listdir("/proc"):
            if entry.isdigit() and (stat := _proc_stat(int(entry))) is not None:
                stats[int(entry)] = stat
        children: dict[int, list[int]] = {}
        for pid, (parent, _, _) in stats.items():
            children.setdefault(parent, []).append(pid)
        mine, frontier = {os.getpid()}, [os.getpid()]
        while frontier:
            for child in children.get(frontier.pop(), []):
                if child not in mine:
                    mine.add(child)
                    frontier.append(child)
        return {pid: stats[pid][1:] for pid in mine if pid in stats}

    def sample(self) -> dict[int, float]:
        """Read now; returns pid → CPU s."""
        t = self.now()
        tree = self._tree()
        with self._lock:
            for pid, (cpu, rss) in tree.items():
                series = self.series.get(pid)
                if series is None:
                    series = self.series[pid] = Series(_label(pid))
                series.t.append(t)
                series.rss_mb.append(rss)
                series.cpu_s = cpu
        return {pid: cpu for pid, (cpu, _) in tree.items()}

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self.sample()

    @contextmanager
    def stage(self, name: str) -> Iterator[dict[str, Any]]:
        """Times a stage and sums its CPU by process label (processes that ended during it
        count up to their last reading)."""
        before = self.sample()
        start = self.now()
        info: dict[str, Any] = {"stage": name, "start_s": start}
        try:
            yield info
        finally:
            after = self.sample()
            end = self.now()
            cpu: dict[str, float] = {}
            peak: dict[str, float] = {}
            with self._lock:
                for pid, series in self.series.items():
                    if series.t[-1] < start:
                        continue
                    used = after.get(pid, series.cpu_s) - before.get(pid, 0.0)
                    cpu[series.label] = cpu.get(series.label, 0.0) + used
                    during = [r for t, r in zip(series.t, series.rss_mb, strict=True) if t >= start]
                    peak[series.label] = max(peak.get(series.label, 0.0), *during, 0.0)
            info.update(
                end_s=end,
                wall_s=end - start,
                cpu_s={k: round(v, 2) for k, v in cpu.items()},
                rss_mb={k: round(v, 1) for k, v in peak.items()},
            )
            self.stages.append(info)

    def peaks(self) -> dict[str, float]:
        """Peak RSS MiB per label (the largest process of that label)."""
        with self._lock:
            peaks: dict[str, float] = {}
            for series in self.series.values():
                peaks[series.label] = max(peaks.get(series.label, 0.0), max(series.rss_mb))
        return peaks

    def plot(self, path: Path, limit_mb: float = 1536) -> None:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        figure, axes = plt.subplots(figsize=(13, 6))
        with self._lock:
            series = [s for s in self.series.values() if max(s.rss_mb) >= 20]
        colours: dict[str, Any] = {}
        for s in series:
            colour = colours.setdefault(s.label, f"C{len(colours) % 10}")
            label = s.label if s.label not in axes.get_legend_handles_labels()[1] else None
            axes.plot([t / 60 for t in s.t], s.rss_mb, color=colour, linewidth=1, label=label)
        for i, stage in enumerate(self.stages):
            axes.axvspan(stage["start_s"] / 60, stage["end_s"] / 60, alpha=0.06, color=f"C{i % 10}")
            height = limit_mb * (1.0 - 0.05 * (i % 4))  # staggered: short stages are close
            axes.text(stage["start_s"] / 60, height, stage["stage"], fontsize=7)
        axes.axhline(limit_mb, color="red", linestyle="--", linewidth=0.8)
        axes.set_xlabel("minutes")
        axes.set_ylabel("RSS (MiB)")
        axes.set_ylim(0, limit_mb * 1.1)
        axes.legend(loc="lower right", fontsize=8, ncols=3)
        figure.tight_layout()
        figure.savefig(path, dpi=110)
        plt.close(figure)
