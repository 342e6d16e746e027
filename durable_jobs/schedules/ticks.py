"""Tick arithmetic: cron expressions, time zones, DST and catch-up, with no database.

The cron grammar is cronsim's (the five standard fields, names for months and days,
``L`` and ``#``), restricted to five fields, plus the usual ``@``-aliases. Ticks are
computed in the schedule's zone and handed back in UTC. cronsim follows Debian's cron
across DST changes, which is invariant 24's rule: a tick whose wall-clock time falls in a
spring-forward gap runs once, at the first valid instant after the gap; a wall-clock
time that occurs twice in a fall-back repeat runs once, at its first occurrence. (An
expression with a wildcard hour, "every 15 minutes", still runs in both passes of the
repeated hour: those are distinct instants, each its own tick.)

Every instant given to these functions comes from the database's clock (invariant 2):
the caller reads ``db.database_now()`` or a row's stored tick; nothing here reads a clock.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from datetime import datetime, timezone
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from cronsim import CronSim, CronSimError

from durable_jobs.exceptions import ConfigurationError

ALIASES = {
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
    "@monthly": "0 0 1 * *",
    "@weekly": "0 0 * * 0",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@hourly": "0 * * * *",
}

#: Catch-up policies after downtime (see ``plan``).
SKIP = "skip"
ONCE = "once"
BACKFILL = "backfill"
POLICIES = (SKIP, ONCE, BACKFILL)
#: The most missed ticks a backfill may start at once, and the most counted as missed:
#: a schedule down for a year at one tick a minute must not cost a leader a long loop.
MAX_BACKFILL = 1000
MAX_COUNTED = 10_000


def expand(expression: object) -> str:
    """Return the five-field form of ``expression``; ConfigurationError naming what is wrong."""
    if not isinstance(expression, str) or not expression.strip():
        raise ConfigurationError(f"cron expression {expression!r} must be a non-empty string")
    text = " ".join(expression.split())
    if text.startswith("@"):
        if text.lower() not in ALIASES:
            raise ConfigurationError(
                f"cron expression {expression!r}: unknown alias; use one of {', '.join(ALIASES)}"
            )
        return ALIASES[text.lower()]
    fields = text.split(" ")
    if len(fields) != 5:
        raise ConfigurationError(
            f"cron expression {expression!r} must have five fields (minute hour day month "
            f"weekday), got {len(fields)}"
        )
    try:
        CronSim(text, datetime(2000, 1, 1, tzinfo=timezone.utc))
    except CronSimError as error:
        raise ConfigurationError(f"cron expression {expression!r}: {error}") from None
    return text


def zone(name: object) -> ZoneInfo:
    """Return the IANA zone ``name``; ConfigurationError when it is not one."""
    if not isinstance(name, str) or not name or len(name) > 100:
        raise ConfigurationError(f"time zone {name!r} must be an IANA zone name")
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError):
        raise ConfigurationError(
            f"time zone {name!r} is not a known IANA zone (e.g. 'Europe/Berlin', 'UTC')"
        ) from None


def _after(expression: str, zone_name: str, instant: datetime) -> Iterator[datetime]:
    """The ticks strictly after ``instant``, in UTC, in order."""
    local = instant.astimezone(zone(zone_name))
    for tick in CronSim(expand(expression), local):
        yield tick.astimezone(timezone.utc)


def next_tick(expression: str, zone_name: str, instant: datetime) -> datetime:
    """The first tick strictly after ``instant`` (aware), in UTC."""
    return next(_after(expression, zone_name, instant))


def ticks_between(
    expression: str, zone_name: str, first: datetime, last: datetime, *, limit: int
) -> list[datetime]:
    """The ticks in ``(first, last]``, at most ``limit`` of them, in UTC order."""
    found: list[datetime] = []
    for tick in _after(expression, zone_name, first):
        if tick > last or len(found) >= limit:
            break
        found.append(tick)
    return found


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class CatchUp:
    """What a schedule does with ticks it missed (its leader was down, or the clock jumped).

    ``skip``: start none of them; ``once``: start the latest one; ``backfill``: start up to
    ``limit`` of the latest, each as its own tick. A tick on time (due no longer ago than
    the grace) always starts.
    """

    policy: str = ONCE
    limit: int = 1

    def __post_init__(self) -> None:
        if self.policy not in POLICIES:
            raise ConfigurationError(
                f"catch_up {self.policy!r} must be one of {', '.join(POLICIES)} "
                f"(or an int N: backfill up to N)"
            )
        limit = self.limit
        if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_BACKFILL:
            raise ConfigurationError(f"catch_up backfill must be 1-{MAX_BACKFILL}, got {limit!r}")

    @classmethod
    def of(cls, value: object) -> CatchUp:
        """Read ``"skip"``, ``"once"``, ``"backfill:N"`` or an int N (backfill up to N)."""
        if isinstance(value, CatchUp):
            return value
        if isinstance(value, int) and not isinstance(value, bool):
            return cls(policy=BACKFILL, limit=value)
        if isinstance(value, str) and value.startswith(BACKFILL + ":"):
            count = value.partition(":")[2]
            if not count.isdigit():
                raise ConfigurationError(
                    f"catch_up {value!r}: backfill needs a count, e.g. 'backfill:5'"
                )
            return cls(policy=BACKFILL, limit=int(count))
        if isinstance(value, str) and value in (SKIP, ONCE):
            return cls(policy=value)
        return cls(policy=str(value))

    def __str__(self) -> str:
        return f"{BACKFILL}:{self.limit}" if self.policy == BACKFILL else self.policy


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Plan:
    """What one firing of a due schedule does: the ticks to start, the next tick, how many were missed."""

    due: datetime  #: the schedule's next tick as stored (the compare-and-set's expected value)
    start: tuple[datetime, ...]  #: ticks to start now, oldest first
    following: datetime  #: the first tick after ``now``: the schedule's new next tick
    missed: int  #: late ticks not started (at most MAX_COUNTED are counted)


def plan(
    expression: str,
    zone_name: str,
    *,
    due: datetime,
    now: datetime,
    catch_up: CatchUp,
    grace: float,
) -> Plan:
    """Decide what a schedule whose next tick ``due`` has come does at ``now`` (database clock).

    The due ticks are ``due`` itself and every tick after it up to ``now``. One no older
    than ``grace`` seconds is on time and starts; older ones are missed and ``catch_up``
    decides: ``skip`` none, ``once`` the latest (only when nothing is on time), ``backfill``
    up to ``limit`` of the latest.
    """
    ticks = [due, *ticks_between(expression, zone_name, due, now, limit=MAX_COUNTED)]
    following = next_tick(expression, zone_name, max(now, ticks[-1]))
    on_time = [t for t in ticks if (now - t).total_seconds() <= grace]
    late = [t for t in ticks if (now - t).total_seconds() > grace]
    if catch_up.policy == SKIP:
        chosen: list[datetime] = []
    elif catch_up.policy == ONCE:
        chosen = late[-1:] if not on_time else []
    else:
        chosen = late[-catch_up.limit :]
    start = (*chosen, *on_time)
    return Plan(due=due, start=start, following=following, missed=len(late) - len(chosen))


def utc_iso(instant: datetime) -> str:
    """``instant`` in UTC, ISO-8601 with microseconds and ``Z``: one spelling per instant."""
    return instant.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
