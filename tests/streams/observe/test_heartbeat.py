"""When a worker's heartbeat is due (streams/observe/heartbeat.py `BeatSchedule`)."""

from __future__ import annotations

from streams.observe.heartbeat import BeatSchedule


def test_a_beat_every_interval_whatever_the_timer_jitter() -> None:
    schedule = BeatSchedule(5.0, check_s=1.0)
    ticks = [0.0, 1.0, 2.0, 3.0, 4.01, 4.98, 6.0, 7.0, 8.0, 9.0, 9.99, 11.0]
    sent = [t for t in ticks if schedule.due(t, {})]
    assert sent == [0.0, 4.98, 9.99]  # a tick a hair early still sends: never a 6-s gap


def test_a_changed_note_is_sent_at_the_next_check_then_the_interval_starts_over() -> None:
    schedule = BeatSchedule(5.0, check_s=1.0)
    assert schedule.due(0.0, {})
    assert not schedule.due(1.0, {})
    exact = {"exact_ids": "exact via prompt_token_ids + choices[].token_ids (return_token_ids)"}
    assert schedule.due(2.0, exact)  # not at 5: a short run may be over by then
    assert not schedule.due(3.0, exact) and not schedule.due(6.0, exact)
    assert schedule.due(7.0, exact)


def test_the_check_is_never_slower_than_the_interval() -> None:
    assert BeatSchedule(0.5).check_s == 0.5
    assert BeatSchedule(5.0).check_s == 1.0
