"""How many jobs a slot claims at once: a batch grows while its slices are quick.

A slot that finds its slices finishing well under ``QUICK_SLICE`` claims more at a time
(up to ``MAX_PREFETCH``), so a no-op-sized job costs its share of one claim statement
instead of a whole one; a slow batch halves the next claim, so a long job never waits
behind prefetched siblings for more than ``PREFETCH_WINDOW``. Measured (the mechanism
trial, docs/performance.rst): with it off (``MAX_PREFETCH = 1``) 1 ms slices drain at
0.18-0.35 and 20 ms slices at 0.61-0.74 of the rate with it, at 1, 4 and 16 slots, and a
1 ms job costs the worker about twice the CPU; from 500 ms up it changes nothing.
"""

from __future__ import annotations

import enum
import math

from durable_jobs.runtime.executor import SliceReport

#: A slice this short (seconds) lets its slot claim more than one job at a time.
#: 50 ms was the bound until issue #27: then a 50 ms job (a typical call to another
#: service) counted as slow, and each was claimed and completed by a transaction of its
#: own. At 64 slots on 2 cores those two statements cost the server 2.1 ms a job, and
#: the fleet ran 37-40 % of the ideal 1,280 jobs/s; claimed four at a time, 0.8 ms and
#: 77-80 %.
QUICK_SLICE = 0.1

#: How long (seconds) a prefetched claim may wait behind its batch-mates: a batch still
#: running after this hands the rest back, and the slot claims half as many next time.
#: It bounds the wait whatever MAX_PREFETCH is, so a large batch only ever forms from
#: slices that together finish well inside it. It holds four 50 ms slices
#: (``fits_in_window``). 0.5 s, holding nine, took less CPU a job (0.63 ms of the
#: server's) but drained no faster (77 %): the machine sat idle a quarter of the time,
#: some slots done while others still ran long batches.
PREFETCH_WINDOW = 0.25

#: MAX_PREFETCH when it is None, by execution mode. A handler process that dies charges
#: only the slice it ran (the runs queued behind it go to the next child), so process
#: execution risks only a worker killed outright on a large batch; in thread execution a
#: handler that kills the process (a segfault, os._exit) takes every claim with it.
PREFETCH_BY_EXECUTION = {"process": 64, "thread": 8}


def prefetch_ceiling(max_prefetch: int | None, execution: str) -> int:
    """The most jobs a slot claims at once: ``MAX_PREFETCH``, or its default for ``execution``."""
    return max_prefetch if max_prefetch is not None else PREFETCH_BY_EXECUTION[execution]


class Pace(enum.Enum):
    """How a slot's last batch went, which sets how many jobs it claims next."""

    QUICK = "quick"  # every slice quick and the batch inside PREFETCH_WINDOW: may grow
    LONG = "long"  # quick slices, but together past PREFETCH_WINDOW: halve
    SLOW = "slow"  # a slice took QUICK_SLICE or more (or the batch was cut short): one at a time


#: The share of PREFETCH_WINDOW a batch is sized to fill (``fits_in_window``): the slices'
#: own time plus the batch's bookkeeping must still end inside the window.
WINDOW_SHARE = 0.9


def fits_in_window(slice_seconds: float | None) -> int | None:
    """How many slices of ``slice_seconds`` (the last batch's mean) one batch should hold.

    Growing past it would make the batch run past ``PREFETCH_WINDOW``: its last claims
    handed back (a statement, and another claim for each of them), then the batch halved,
    then grown again. Under the 100 ms window of before issue #27, 20 ms slices cycled
    4, 8 (5 run, 3 handed back), 4, 8, ...; sized to the window they stayed at 4. With
    250 ms, 50 ms slices stay at 4 and 20 ms ones at 10. None: nothing measured yet (no
    bound).
    """
    if not slice_seconds or slice_seconds <= 0:
        return None
    return max(1, int(PREFETCH_WINDOW * WINDOW_SHARE / slice_seconds))


#: How much a full claim of quick slices grows the next one. Doubling took six claims to
#: reach 64 from one; on a burst of 5,000 no-op jobs before 64 slots each slot's share
#: (78 jobs) was gone before its batches were large, and the fleet paid a claim and a
#: completion for every nine jobs. Quadrupling takes three claims (1, 4, 16, 64); the
#: window and MAX_PREFETCH bound it as before.
GROWTH = 4


def next_batch(batch: int, claimed: int, pace: Pace, ceiling: int, fits: int | None = None) -> int:
    """How many jobs a slot claims next, after claiming ``claimed`` of ``batch`` at ``pace``.

    Grows (by ``GROWTH``, up to ``ceiling``, i.e. ``MAX_PREFETCH``, and up to ``fits``, the
    slices that fit in ``PREFETCH_WINDOW``) only when the claim came back full, so a thin
    queue keeps batches small; halves after a long batch; drops to one after a slow slice,
    since the claims behind a slow slice are what prefetch costs.
    """
    if pace is Pace.SLOW:
        return 1
    bound = ceiling if fits is None else min(ceiling, fits)
    if pace is Pace.LONG:
        return max(1, min(batch // 2, bound))
    return min(bound, batch * GROWTH) if claimed == batch else min(bound, batch)


def claim_lead(claim_seconds: float | None, slice_seconds: float | None, queued: int) -> int:
    """How many of a batch's claims, the one about to run included, should still be queued
    in the handler process when its slot claims the next batch (``Worker._claim_ahead``).

    Enough to keep the handler process busy through the claim's round trip
    (``claim_seconds``, the slot's last one, completion included): one 20 ms slice covers
    it, so such a batch claims ahead as its last slice starts; no-op slices need a dozen
    or more, or the handler process sat idle while its slot waited on the server (a
    third of a slot's time at one slot, issue #27). At most half of the ``queued`` claims
    sent with it, so the claims taken ahead wait behind at most half a batch. One when
    nothing is measured yet.
    """
    if not claim_seconds or not slice_seconds or slice_seconds <= 0:
        return 1
    return max(1, min(queued // 2, math.ceil(claim_seconds / slice_seconds)))


def slice_seconds(report: SliceReport) -> float:
    """How long a slice took, for pacing: its own work (``SliceReport.busy``: the run by
    the handler process's clock, the slot's bookkeeping and the mirror) where a handler
    process ran it, else the slot thread's duration. On a saturated machine the slot
    thread hears of a no-op run tens of milliseconds late; judged by that, every slice
    looked slow and every slot fell back to one claim per job, adding work to the
    machine that was already behind."""
    return report.busy if report.busy is not None else report.duration
