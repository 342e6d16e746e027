"""The completer's hand-over: a slot waits for its write and hears what it raised, and a
busy or ended completer sends the slot back to complete on its own connection
(``durable_jobs.runtime.completer``; the worker side is
tests/integration/test_claim_ahead.py)."""

from __future__ import annotations

import threading

import pytest

from durable_jobs.runtime.completer import Completer


@pytest.fixture
def completer():
    made = Completer("default")
    yield made
    made.close()


def test_a_write_runs_on_the_completers_thread_and_the_slot_hears_its_error(completer):
    ran_on = []

    def write():
        ran_on.append(threading.current_thread().name)
        raise ValueError("the completion failed")

    pending = completer.try_submit(write)

    assert pending is not None
    with pytest.raises(ValueError, match="the completion failed"):
        pending.wait()
    assert ran_on == ["durable-completer"]
    # Free again: the next claim ahead may use it.
    after = completer.try_submit(lambda: None)
    assert after is not None
    after.wait()


def test_a_busy_completer_sends_the_slot_back_to_complete_on_its_own(completer):
    release = threading.Event()
    first = completer.try_submit(release.wait)

    assert completer.try_submit(lambda: None) is None

    release.set()
    first.wait()


def test_a_write_that_ends_the_thread_stops_the_completer_and_no_later_write_waits_forever(
    completer,
):
    def write():
        raise SystemExit(3)

    pending = completer.try_submit(write)
    with pytest.raises(SystemExit):
        pending.wait()

    # A slot after it completes inline: nothing is queued for a thread that has ended.
    assert completer.try_submit(lambda: None) is None


def test_a_closed_completer_takes_no_write(completer):
    completer.try_submit(lambda: None).wait()
    completer.close()

    assert completer.try_submit(lambda: None) is None
