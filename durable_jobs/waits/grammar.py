"""The grammar of wait conditions, instants and profile declarations: one definition.

``start()`` reads it to refuse bad conditions before anything is written; the gate reads
it again at pickup to decide what to do. A second spelling in either place is how a
condition that was accepted starts holding for an instant nobody wrote, so both sides
call the functions here and nothing else.

Pure: no database, no environment, no file system. Whether a declared check exists and
is executable is asked on the worker about to run it.
"""

from __future__ import annotations

import ntpath
import os
import re
from collections.abc import Mapping
from datetime import datetime, timedelta, timezone
from typing import Any

from durable_jobs.exceptions import ConfigurationError, InvalidInput

#: The condition keys this version understands. Anything else is refused at start and,
#: should a newer process have stored one, is "unreadable" at the gate (never satisfied).
CONDITION_KEYS = ("after", "profile")

#: At most this many conditions per job. Every ``profile`` condition is a process run
#: before the first slice, so an unbounded list is an unbounded occupation of a worker;
#: four is generous for a conjunction a person wrote.
MAX_CONDITIONS = 4

#: A profile name: the separators of the declaration (``,`` and ``:``) are excluded so a
#: name always round-trips, and nothing that could break a log line or the admin fits.
PROFILE_NAME = re.compile(r"^[A-Za-z0-9._-]{1,50}\Z")

# An ISO-8601 instant that carries its own zone (invariant 15). The zone is required: an
# instant without one would be read in some process's local zone, and the same start
# would hold until different moments on different machines. The time fields are range
# checked here, not left to a parser: hour 24 and minute/second 60 are refused rather than
# rolled into the next day, because a value that rolls is worse than one that refuses.
# Fractions beyond microseconds are accepted and truncated (at most nine digits).
_INSTANT = re.compile(
    r"^(?P<year>\d{4})-(?P<month>\d{2})-(?P<day>\d{2})[Tt]"
    r"(?P<hour>[01]\d|2[0-3]):(?P<minute>[0-5]\d)"
    r"(?::(?P<second>[0-5]\d)(?:\.(?P<fraction>\d{1,9}))?)?"
    r"(?P<zone>[Zz]|[+-](?:[01]\d|2[0-3]):[0-5]\d)\Z"
)

# Absolute on this platform, or a Windows drive letter / UNC root: a declaration shared
# between hosts parses the same everywhere.
_WINDOWS_ABSOLUTE = re.compile(r"^(?:[A-Za-z]:[\\/]|\\\\)")


class BadInstant(ValueError):
    """Not a legal ``after`` instant; ``reason`` says which rule refused it."""

    def __init__(self, text: object, reason: str) -> None:
        self.text = text
        self.reason = reason
        super().__init__(reason)


def parse_instant(text: Any) -> datetime:
    """Return the aware datetime an ``after`` value names; raise ``BadInstant`` otherwise.

    The calendar is checked against the date as written, in its own zone: ``2026-02-31``
    is refused, never rolled to March 3rd, and an offset cannot move the day validated.
    A year is taken as written (``0050`` is the year 50, not 1950).
    """
    if not isinstance(text, str):
        raise BadInstant(text, "must be a string such as '2026-09-01T09:00:00Z'")
    match = _INSTANT.match(text)
    if match is None:
        raise BadInstant(
            text,
            "must be an ISO-8601 instant with its zone, such as '2026-09-01T09:00:00Z' or "
            "'2026-09-01T11:00:00+02:00' (hours 00-23, minutes and seconds 00-59)",
        )
    parts = match.groupdict()
    zone = parts["zone"]
    if zone in ("Z", "z"):
        tz = timezone.utc
    else:
        sign = 1 if zone[0] == "+" else -1
        tz = timezone(sign * timedelta(hours=int(zone[1:3]), minutes=int(zone[4:6])))
    fraction = (parts["fraction"] or "").ljust(6, "0")[:6]
    try:
        return datetime(
            int(parts["year"]),
            int(parts["month"]),
            int(parts["day"]),
            int(parts["hour"]),
            int(parts["minute"]),
            int(parts["second"] or 0),
            int(fraction or 0),
            tzinfo=tz,
        )
    except ValueError:
        raise BadInstant(
            text, "names a day that is not on the calendar (month 01-12, a day that month has)"
        ) from None


def instant_or_none(text: Any) -> datetime | None:
    """The instant ``text`` names, or None: for readers that only ask "can I act on it?"."""
    try:
        return parse_instant(text)
    except BadInstant:
        return None


def is_profile_name(value: Any) -> bool:
    return isinstance(value, str) and PROFILE_NAME.match(value) is not None


def is_absolute_path(path: str) -> bool:
    return os.path.isabs(path) or ntpath.isabs(path) and _WINDOWS_ABSOLUTE.match(path) is not None


def parse_profiles(raw: Any, *, source: str = "DURABLE_JOBS['WAIT_PROFILES']") -> dict[str, str]:
    """Read profile declarations: ``"name:/abs/path,other:/abs/other"`` or a ``{name: path}`` dict.

    Set but garbled fails loudly, naming the entry (invariant 20): a silently dropped entry
    is a profile the operator believes is wired, and every start naming it would be
    refused with the operator looking at the line that seems to declare it. Each entry is
    split on its first colon, so ``prod:C:\\checks\\wait.cmd`` parses. Empty or None
    declares nothing; a trailing comma is a typo, not a declaration.
    """
    if raw is None:
        return {}
    if isinstance(raw, Mapping):
        entries = [(str(name), path, f"{name!r}: {path!r}") for name, path in raw.items()]
    elif isinstance(raw, str):
        entries = []
        for entry in raw.split(","):
            text = entry.strip()
            if not text:
                continue
            name, colon, path = text.partition(":")
            if not colon or not name.strip():
                raise ConfigurationError(f"{source}: entry {text!r} must be name:/absolute/path")
            entries.append((name.strip(), path.strip(), repr(text)))
    else:
        raise ConfigurationError(
            f"{source} must be a string 'name:/absolute/path,...' or a dict, "
            f"got {type(raw).__name__}"
        )
    profiles: dict[str, str] = {}
    for name, path, shown in entries:
        if not PROFILE_NAME.match(name):
            raise ConfigurationError(
                f"{source}: entry {shown}: the profile name {name!r} may use 1-50 letters, "
                "digits, dot, dash and underscore only"
            )
        if name in profiles:
            raise ConfigurationError(
                f"{source}: entry {shown} declares {name!r} a second time; one of the two "
                "is not the check you think is running"
            )
        if not isinstance(path, str) or not path or not is_absolute_path(path):
            raise ConfigurationError(
                f"{source}: entry {shown} needs an absolute path to its check: a service "
                "manager's working directory is not your shell's, so a relative path is a "
                "different file on every host"
            )
        if "\x00" in path or "\n" in path:
            raise ConfigurationError(f"{source}: entry {shown}: the path holds a control character")
        profiles[name] = path
    return profiles


def validate(wait_for: Any, *, profiles: Mapping[str, str]) -> list[dict[str, str]]:
    """Check a start's ``wait_for`` and return it as stored; raise ``InvalidInput`` naming the bad condition.

    The conditions form a conjunction: the job runs once every one has cleared. The
    ceiling on how far ahead an ``after`` may sit is checked by the caller against the
    database's clock.
    """
    if not isinstance(wait_for, (list, tuple)):
        raise InvalidInput(
            "wait_for", "must be a list of conditions such as [{'after': '2026-09-01T09:00:00Z'}]"
        )
    if not wait_for:
        raise InvalidInput("wait_for", "is empty; leave it out to start without a wait")
    if len(wait_for) > MAX_CONDITIONS:
        raise InvalidInput(
            "wait_for", f"has {len(wait_for)} conditions; at most {MAX_CONDITIONS} are allowed"
        )
    stored: list[dict[str, str]] = []
    afters = 0
    for position, condition in enumerate(wait_for):
        field = f"wait_for[{position}]"
        if not isinstance(condition, Mapping) or len(condition) != 1:
            raise InvalidInput(field, "must be a dict with exactly one key, 'after' or 'profile'")
        ((key, value),) = condition.items()
        if key == "after":
            afters += 1
            if afters > 1:
                raise InvalidInput(
                    field, "is a second 'after'; a conjunction of instants is just the latest one"
                )
            try:
                parse_instant(value)
            except BadInstant as error:
                raise InvalidInput(field, f"'after' {error.reason}") from None
        elif key == "profile":
            if not is_profile_name(value):
                raise InvalidInput(
                    field, "'profile' must be 1-50 letters, digits, dot, dash or underscore"
                )
            if value not in profiles:
                declared = ", ".join(sorted(profiles)) or "none"
                raise InvalidInput(
                    field,
                    f"'profile' {value!r} is not declared in "
                    f"DURABLE_JOBS['WAIT_PROFILES'] (declared: {declared})",
                )
        else:
            shown = repr(key)[:60] if isinstance(key, str) else type(key).__name__
            raise InvalidInput(
                field, f"has the key {shown}; this version understands 'after' and 'profile'"
            )
        stored.append({key: value})
    return stored


def armed(wait_for: Any) -> bool:
    """True when a stored ``wait_for`` carries any condition: the one guard of every wait path."""
    return isinstance(wait_for, list) and len(wait_for) > 0


def unreadable(wait_for: Any) -> list[Any]:
    """The stored conditions this version cannot act on, as written (invariant 19).

    The start that stored them may have been a newer (or older, or hand-written) process,
    so the gate asks this instead of trusting the row: an unreadable condition fails the
    job, it never counts as cleared. Structural on purpose: it asks only "can I act on
    this?", not whether the start would accept it today (a profile no longer declared
    here is a check this worker cannot run, which the gate treats as "cannot tell").
    """
    if not isinstance(wait_for, list):
        return [wait_for]
    if len(wait_for) > MAX_CONDITIONS:
        return list(wait_for)
    shapes = [next(iter(c)) for c in wait_for if isinstance(c, dict) and len(c) == 1]
    if shapes.count("after") > 1:
        return list(wait_for)  # two instants have no defined meaning: refuse the whole list
    bad = []
    for condition in wait_for:
        if not isinstance(condition, dict) or len(condition) != 1:
            bad.append(condition)
            continue
        ((key, value),) = condition.items()
        if key == "after" and instant_or_none(value) is not None:
            continue
        if key == "profile" and is_profile_name(value):
            continue
        bad.append(condition)
    return bad


def after_instant(wait_for: Any) -> datetime | None:
    """The instant the job waits for, or None (at most one ``after`` is legal)."""
    if not armed(wait_for):
        return None
    for condition in wait_for:
        if isinstance(condition, dict) and "after" in condition:
            instant = instant_or_none(condition["after"])
            if instant is not None:
                return instant
    return None


def profile_names(wait_for: Any) -> list[str]:
    """The profiles the job waits on, in the order written (checks run in this order).

    Each name is checked here again: it reaches log lines and the admin, and "it was
    validated at start" is a claim about another process.
    """
    if not armed(wait_for):
        return []
    return [
        c["profile"] for c in wait_for if isinstance(c, dict) and is_profile_name(c.get("profile"))
    ]


def label(wait_for: Any) -> str | None:
    """A short label for people: ``after 2026-09-01T09:00:00Z + ticket-closed`` (invariant 23).

    Every byte is re-checked against the instant grammar or the profile-name pattern
    here, so nothing a caller chose beyond those can reach a label or a log line.
    """
    if not armed(wait_for):
        return None
    parts = []
    for condition in wait_for:
        if not isinstance(condition, dict):
            continue
        if instant_or_none(condition.get("after")) is not None:
            parts.append(f"after {condition['after']}")
        elif is_profile_name(condition.get("profile")):
            parts.append(condition["profile"])
    return " + ".join(parts)[:200] if parts else None
