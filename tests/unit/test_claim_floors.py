"""A worker's claim floors: where each level's scan starts, and when a claim sweeps instead
(``durable_jobs.runtime.claim_floors``; the database side is
tests/integration/test_claim_floors.py)."""

from __future__ import annotations

import datetime

import pytest

from durable_jobs.runtime import claim_floors
from durable_jobs.runtime.claim_floors import SWEEP_EVERY, SWEEP_SHARE, ClaimFloors

T0 = datetime.datetime(2026, 12, 3, 12, 0, tzinfo=datetime.UTC)


@pytest.fixture
def clock(monkeypatch):
    now = [1000.0]
    monkeypatch.setattr(claim_floors.time, "monotonic", lambda: now[0])
    return now


def test_the_first_claim_sweeps_and_the_others_read_from_floors_meanwhile(clock):
    floors = ClaimFloors()

    assert floors.for_claim() is None  # nothing known yet: read every level from its start
    assert floors.for_claim() == []  # one sweep at a time; no floor known yet either


def test_each_levels_floor_is_the_oldest_run_time_its_last_claim_took(clock):
    floors = ClaimFloors()
    floors.for_claim()
    floors.claimed(
        [
            ("default", 0, T0 + datetime.timedelta(seconds=3)),
            ("default", 0, T0),
            ("default", 5, T0 + datetime.timedelta(seconds=9)),
            ("mail", 0, T0 + datetime.timedelta(seconds=1)),
        ]
    )
    floors.swept(0.001)
    floors.claimed([("default", 5, T0 + datetime.timedelta(seconds=20))])

    assert sorted(floors.for_claim()) == [
        ("default", 0, T0),
        ("default", 5, T0 + datetime.timedelta(seconds=20)),
        ("mail", 0, T0 + datetime.timedelta(seconds=1)),
    ]


def test_a_cheap_sweep_comes_back_every_sweep_interval(clock):
    floors = ClaimFloors()
    assert floors.for_claim() is None
    floors.swept(0.002)

    clock[0] += SWEEP_EVERY - 0.01
    assert floors.for_claim() is not None
    clock[0] += 0.02
    assert floors.for_claim() is None


def test_a_costly_sweep_comes_back_only_when_sweeps_take_their_share(clock):
    floors = ClaimFloors()
    assert floors.for_claim() is None
    floors.swept(0.5)  # a pinned horizon: the whole queue read from its start

    clock[0] += 0.5 / SWEEP_SHARE - 0.1
    assert floors.for_claim() is not None
    clock[0] += 0.2
    assert floors.for_claim() is None


def test_a_sweep_that_failed_is_made_by_the_next_claim(clock):
    floors = ClaimFloors()
    assert floors.for_claim() is None
    floors.swept(None)  # its connection was cut

    assert floors.for_claim() is None
