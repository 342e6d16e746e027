"""When a held job's next check runs: invariant 17, as one function.

    next = min(max(base * 2**floor(elapsed / (10 * base)), base), max(ceiling, base))

with ``base`` first clamped *up* to the floor. The cadence doubles every ten base
periods and settles at the ceiling — or at ``base`` when the operator chose a base above
the ceiling. That outer ``max`` is the reason this is a function and not a constant the
caller clamps against: the obvious spelling, ``min(grown, ceiling)``, silently turns an
hourly cadence an operator chose to save money into a fifteen-minute one.

Clamped up, never refused: a typo'd ``1`` must not turn the worker into a hammer. The
floor protects the worker's own slots; there is no third party asking for politeness.

Derived from elapsed hold time, never stored: nothing needs remembering, so the schedule
survives a worker restart (or a different worker picking the job up) for free.
"""

from __future__ import annotations

import math

#: Defaults of the settings WAIT_CHECK_INTERVAL_FLOOR and WAIT_CHECK_INTERVAL_CEILING.
FLOOR = 30.0
CEILING = 900.0


def next_check_in(
    base: float, elapsed: float, *, floor: float = FLOOR, ceiling: float = CEILING
) -> float:
    """Seconds until the next check, for a hold of ``elapsed`` seconds under cadence ``base``."""
    floor = floor if math.isfinite(floor) and floor > 0 else FLOOR
    base = base if math.isfinite(base) and base > 0 else floor
    base = max(base, floor)
    elapsed = elapsed if math.isfinite(elapsed) and elapsed > 0 else 0.0
    # The exponent is capped: past it the ceiling has long been reached, and an hour-long
    # hold at a tiny base must not compute 2**100000.
    steps = min(int(elapsed // (10 * base)), 64)
    grown = base * 2**steps
    return min(max(grown, base), max(ceiling, base))
