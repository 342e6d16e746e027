"""Schedules as code declares them: next to the handler, by ``schedule()``, or in settings.

    @durable.handler("reports.daily",
                     schedule=durable.Schedule("0 6 * * *", tz="Europe/Berlin", input={"full": True}))
    def daily(job): ...

    durable.schedule("reports.daily", "@hourly", name="reports.hourly", catch_up="skip")

    DURABLE_JOBS = {"SCHEDULES": {"cleanup.nightly": {"kind": "cleanup", "cron": "0 3 * * *"}}}

A declaration is only recorded here; ``problems()`` checks them all (an unknown kind, a
bad expression or zone, a name used twice) for the system check, which names each
schedule it refuses, and ``valid()`` is what workers write to the schedule table when
they start. Code is the source: a schedule no longer declared anywhere is marked removed
in the table and never fires again (its row and its jobs stay).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from django.conf import settings as django_settings

from durable_jobs import conf, validation
from durable_jobs.exceptions import ConfigurationError, InvalidInput
from durable_jobs.schedules import ticks


@dataclasses.dataclass(frozen=True, slots=True)
class Schedule:
    """A periodic start of a kind: a cron expression in a zone, and what each tick starts.

    ``cron``: five fields or an alias (``@hourly``, ``@daily``, ``@midnight``, ``@weekly``,
    ``@monthly``, ``@yearly``/``@annually``). ``tz``: an IANA zone (default: Django's
    ``TIME_ZONE``). ``catch_up``: after downtime, ``"skip"`` missed ticks, run ``"once"``
    (the default), or an int N to backfill up to N. ``name`` identifies the schedule (and
    its ticks' keys); it defaults to the kind, so a kind with several schedules names each.
    """

    cron: str
    tz: str | None = dataclasses.field(default=None, kw_only=True)
    input: Any = dataclasses.field(default=None, kw_only=True)
    queue: str | None = dataclasses.field(default=None, kw_only=True)
    priority: int = dataclasses.field(default=0, kw_only=True)
    catch_up: str | int = dataclasses.field(default=ticks.ONCE, kw_only=True)
    name: str | None = dataclasses.field(default=None, kw_only=True)


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Declared:
    """A checked declaration: what the schedule table holds for it."""

    name: str
    kind: str
    expression: str
    zone: str
    input_json: str | None
    queue: str | None
    priority: int
    catch_up: ticks.CatchUp
    origin: str


_declared: list[tuple[str, Schedule, str]] = []  # (kind, schedule, origin)


def declare(kind: str, schedule: Schedule | Sequence[Schedule], *, origin: str = "code") -> None:
    """Record ``schedule`` (or several) for ``kind``; checked later, by ``checked()``."""
    items = [schedule] if isinstance(schedule, Schedule) else list(schedule)
    for item in items:
        if not isinstance(item, Schedule):
            raise ConfigurationError(
                f"handler {kind!r}: schedule must be a durable_jobs.Schedule (or a list of them), "
                f"got {type(item).__name__}"
            )
        entry = (kind, item, origin)
        if entry not in _declared:  # a module imported twice declares the same thing again
            _declared.append(entry)


def schedule(kind: str, cron: str, **fields: Any) -> Schedule:
    """Declare a schedule for ``kind`` apart from its handler; returns it.

    ``fields`` are ``Schedule``'s: tz, input, queue, priority, catch_up, name.
    """
    item = Schedule(cron, **fields)
    declare(kind, item)
    return item


def forget(name: str) -> None:
    """Drop the declarations named ``name`` (for tests that declare schedules of their own)."""
    _declared[:] = [entry for entry in _declared if _name_of(entry[0], entry[1]) != name]


def _name_of(kind: str, item: Schedule) -> str:
    return item.name if item.name is not None else kind


def _from_settings() -> list[tuple[str, Schedule, str]]:
    raw = conf.get().SCHEDULES or {}
    found = []
    for name, entry in raw.items():
        origin = f"DURABLE_JOBS['SCHEDULES'][{name!r}]"
        fields = {
            key: entry[key]
            for key in ("tz", "input", "queue", "priority", "catch_up")
            if key in entry
        }
        found.append((entry.get("kind"), Schedule(entry.get("cron"), name=name, **fields), origin))
    return found


def _check(kind: Any, item: Schedule, known_kinds: set[str]) -> Declared:
    """One declaration, checked; ConfigurationError says what is wrong (without the name)."""
    if not isinstance(kind, str) or kind not in known_kinds:
        raise ConfigurationError(f"its kind {kind!r} has no registered handler")
    ticks.expand(item.cron)
    zone_name = item.tz if item.tz is not None else django_settings.TIME_ZONE or "UTC"
    ticks.zone(zone_name)
    catch_up = ticks.CatchUp.of(item.catch_up)
    settings = conf.get()
    try:
        input_json = validation.payload(
            "input",
            item.input,
            max_bytes=settings.MAX_PAYLOAD_BYTES,
            max_depth=settings.MAX_PAYLOAD_DEPTH,
        )
        priority = validation.integer("priority", item.priority, low=-100, high=100)
        if item.queue is not None:
            validation.name("queue", item.queue)
    except InvalidInput as error:
        raise ConfigurationError(str(error)) from None
    if item.queue is not None and (undeclared := conf.undeclared_queue(item.queue, settings)):
        raise ConfigurationError(f"queue {undeclared}")
    return Declared(
        name=_name_of(kind, item),
        kind=kind,
        expression=" ".join(item.cron.split()),  # as declared (an alias stays an alias)
        zone=zone_name,
        input_json=input_json,
        queue=item.queue,
        priority=priority,
        catch_up=catch_up,
        origin="",
    )


def checked(known_kinds: Sequence[str]) -> tuple[list[Declared], list[str]]:
    """Every declaration, checked: ``(valid ones, one message per refused one)``.

    Each message names the schedule (and where it was declared), so ``manage.py check``
    points at it.
    """
    kinds = set(known_kinds)
    valid: dict[str, Declared] = {}
    problems: list[str] = []
    for kind, item, origin in [*_declared, *_from_settings()]:
        name = _name_of(kind, item) if isinstance(kind, str) else str(item.name)
        label = f"schedule {name!r} ({origin})"
        if not conf.NAME_PATTERN.match(name):
            problems.append(
                f"{label}: its name must be 1-100 characters of letters, digits, _ . : -"
            )
            continue
        try:
            entry = dataclasses.replace(_check(kind, item, kinds), origin=origin)
        except ConfigurationError as error:
            problems.append(f"{label}: {error}")
            continue
        if name in valid:
            problems.append(
                f"{label}: the name is declared twice (also by {valid[name].origin}); "
                "give each schedule of a kind its own name="
            )
            continue
        valid[name] = entry
    return list(valid.values()), problems
