"""The progress meter of run, publish and replay: done/total, rate and ETA; plain lines with no
escape codes when not on a terminal; a final line unless the caller prints its own."""

from __future__ import annotations

import io

import pytest

from streams.core.meter import Meter


def test_plain_lines_say_done_total_rate_and_eta(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = iter([100.0, 110.0, 120.0, 130.0])
    monkeypatch.setattr("streams.core.meter.time.monotonic", lambda: next(clock))
    out = io.StringIO()
    meter = Meter("publish", "row", tty=False, every_s=5, stream=out)  # started at 100
    meter.update(50)  # at 110: no total yet
    meter.update(100, total=400)  # at 120
    assert out.getvalue().splitlines() == [
        "publish: 50 rows, 5.0/s",
        "publish: 100/400 rows (25%), 5.0/s, ETA 1m00s",
    ]
    meter.close()  # at 130: where it stands
    assert out.getvalue().splitlines()[-1] == "publish: 100/400 rows (25%), 3.3/s, ETA 1m30s"
    assert "\x1b" not in out.getvalue() and "\r" not in out.getvalue()


def test_close_with_a_final_line_or_none() -> None:
    said = io.StringIO()
    Meter("replay", "completion", 3, tty=False, stream=said).close("caught up")
    assert said.getvalue() == "caught up\n"
    silent = io.StringIO()
    meter = Meter("publish", "row", tty=False, every_s=3600, stream=silent)
    meter.update(7)
    meter.close("")  # the caller prints its summary
    assert silent.getvalue() == ""


def test_on_a_terminal_it_is_a_bar_whose_total_can_come_late() -> None:
    out = io.StringIO()
    meter = Meter("publish", "row", tty=True, stream=out)
    meter.update(3)
    meter.update(5, total=10)
    meter.close("")
    assert "5/10" in out.getvalue()
