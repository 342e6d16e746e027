"""Refuse bad input at the API, before anything is written.

jsonb cannot hold ``\\u0000``, a 100 MB payload would be written whole before anyone
noticed, and a control character in a key would forge log lines: every one of these is
refused here with an error naming the argument, so a bad call fails the call instead
of stranding a job.
"""

from __future__ import annotations

import json
import math
import operator
import re
from datetime import datetime, timedelta
from typing import Any

from durable_jobs.exceptions import (
    InvalidCheckpoint,
    InvalidInput,
    InvalidProgress,
    RunAfterOutOfRange,
)

NAME = re.compile(r"^[A-Za-z0-9_.:-]{1,100}\Z")  # \Z: "$" would let a final newline through
# Keys may be any printable text (so keys that look like SQL round-trip exactly), but no
# control characters: they would reach log lines and the admin verbatim.
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]")


def name(field: str, value: Any) -> str:
    """A kind, queue, tenant or organization: 1-100 of letters, digits, ``_ . : -``."""
    if not isinstance(value, str) or not NAME.match(value):
        raise InvalidInput(field, "must be 1-100 characters of letters, digits, _ . : -")
    return value


#: The wait-key grammar (docs/waits.rst, "The wait key"). A wait key reaches a check's
#: environment, and checks put it in URLs, paths and command lines: so it is 1-200 ASCII
#: letters, digits and ``_ . : - / @``, starts with a letter or a digit (never ``/`` or
#: ``-``: an absolute path or an option), and no ``/``-separated segment is empty, ``.``
#: or ``..``. Whitespace, quotes, shell metacharacters, ``?``, ``#``, ``%``, ``&``,
#: ``\`` and control characters are refused by the alphabet alone.
WAIT_KEY = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:@/-]{0,199}\Z")
WAIT_KEY_RULE = (
    "must be 1-200 of ASCII letters, digits and _ . : - / @, start with a letter or digit, "
    "and have no empty, '.' or '..' segment between slashes"
)


def is_wait_key(value: Any) -> bool:
    """True when ``value`` matches the wait-key grammar (``WAIT_KEY``)."""
    return (
        isinstance(value, str)
        and WAIT_KEY.match(value) is not None
        and all(segment not in ("", ".", "..") for segment in value.split("/"))
    )


def wait_key(field: str, value: Any) -> str:
    """A start's ``wait_key``: the wait-key grammar, or ``InvalidInput`` naming the rule."""
    if isinstance(value, int) and not isinstance(value, bool):
        value = str(value)
    if not is_wait_key(value):
        raise InvalidInput(field, WAIT_KEY_RULE)
    return value


def key(field: str, value: Any, *, max_length: int = 255) -> str:
    """A lock, idempotency or subject key: printable text without control characters.

    A ``wait_key`` has a grammar of its own (``wait_key``): it is handed to programs.
    """
    if isinstance(value, int) and not isinstance(value, bool):
        value = str(value)
    if not isinstance(value, str) or not value:
        raise InvalidInput(field, "must be a non-empty string")
    if len(value) > max_length:
        raise InvalidInput(field, f"must be at most {max_length} characters, got {len(value)}")
    if _CONTROL.search(value):
        raise InvalidInput(field, "must not contain control characters")
    return value


def integer(field: str, value: Any, *, low: int, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise InvalidInput(field, f"must be an integer from {low} to {high}")
    return value


#: PostgreSQL's bigint, the type of processed_count and total_count.
MAX_COUNT = 2**63 - 1


def count(field: str, value: Any) -> int:
    """A progress count (``processed``, ``total``, ``total_count``): a non-negative integer
    that fits a bigint. A bool is refused (``True`` is not a count), and so is a float:
    ``2.5`` processed means a bug upstream, not something to round."""
    if isinstance(value, bool):
        raise InvalidProgress(field, "must be an integer count, got a bool")
    try:
        number = operator.index(value)  # int, or an integer type such as numpy's
    except TypeError:
        shown = printable(repr(value), limit=60)
        raise InvalidProgress(
            field, f"must be a non-negative integer, got {type(value).__name__} {shown}"
        ) from None
    if not 0 <= number <= MAX_COUNT:
        raise InvalidProgress(
            field, f"must be from 0 to {MAX_COUNT} (PostgreSQL bigint), got {number}"
        )
    return number


def progress(processed: Any, total: Any, *, unset: Any) -> tuple[int | None, Any]:
    """Check a slice's ``processed``/``total`` before anything is written.

    ``processed=None`` leaves the stored count alone; ``total=None`` records "unknown" and
    ``total=unset`` leaves it alone. ``processed`` may exceed ``total``: a total is often
    an estimate made before the work was seen, and refusing it would fail a healthy job
    over a progress bar.
    """
    if processed is not None:
        processed = count("processed", processed)
    if total is not None and total is not unset:
        total = count("total", total)
    return processed, total


def checkpoint(state: Any, *, max_bytes: int, max_depth: int) -> str | None:
    """Check a checkpoint like any payload, raising ``InvalidCheckpoint`` (a bug in the
    handler: the slice fails at once instead of retrying the same call)."""
    try:
        return payload("checkpoint", state, max_bytes=max_bytes, max_depth=max_depth)
    except InvalidCheckpoint:
        raise
    except InvalidInput as error:
        raise InvalidCheckpoint(error.field, error.detail) from None


#: How far in the past a ``run_after`` instant may lie. A caller's "09:00 today" computed
#: a little late is due at once; ``datetime.min`` or a year-1 default is a bug, and as the
#: earliest run time in its queue it would be taken before every job already waiting.
RUN_AFTER_PAST_TOLERANCE = timedelta(days=1)


def run_after(value: Any, *, max_ahead: float) -> datetime | float | None:
    """Check ``run_after`` as far as it can be without a clock.

    Return an aware ``datetime`` (an instant: check it with ``run_after_instant`` against
    the database's clock), a number of seconds from 0 to ``max_ahead`` (a duration; a
    ``timedelta`` already past means now), or None.
    """
    if value is None:
        return None
    if isinstance(value, datetime):
        if value.tzinfo is None or value.utcoffset() is None:
            raise InvalidInput(
                "run_after", "must be an aware datetime (carry its zone), a timedelta or seconds"
            )
        return value
    if isinstance(value, timedelta):
        value = max(0.0, value.total_seconds())  # a moment already past means now
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        if not math.isfinite(value):
            raise InvalidInput("run_after", "must be a finite number of seconds")
        if value < 0:
            raise RunAfterOutOfRange(value, f"must not be negative, got {value} seconds")
        if value > max_ahead:
            raise RunAfterOutOfRange(value, f"is {value:.0f} seconds ahead; {_ceiling(max_ahead)}")
        return float(value)
    raise InvalidInput(
        "run_after", "must be an aware datetime, a timedelta or a non-negative number of seconds"
    )


def run_after_instant(value: datetime, now: datetime, *, max_ahead: float) -> datetime:
    """Bound an aware ``run_after`` instant by ``now``, which must be the database's clock
    (invariant 2): no more than a day past, no further ahead than ``max_ahead`` seconds."""
    if value < now - RUN_AFTER_PAST_TOLERANCE:
        raise RunAfterOutOfRange(
            value,
            f"{value.isoformat()} is more than a day in the past; pass a timedelta of 0 to run it now",
        )
    if value - now > timedelta(seconds=max_ahead):
        days = (value - now).days
        raise RunAfterOutOfRange(
            value, f"{value.isoformat()} is {days} days ahead; {_ceiling(max_ahead)}"
        )
    return value


def _ceiling(max_ahead: float) -> str:
    return f"the limit is {max_ahead:.0f} seconds ({max_ahead / 86400:g} days, DURABLE_JOBS['MAX_RUN_AFTER'])"


def payload(field: str, value: Any, *, max_bytes: int, max_depth: int) -> str | None:
    """Check a JSON payload (plain JSON types, no NUL, finite numbers, bounded depth and
    size) and return its serialised text, ready for a jsonb parameter (None for None)."""
    _walk(field, value, max_depth, 0)
    if value is None:
        return None
    try:
        text = json.dumps(value, ensure_ascii=False, allow_nan=False, separators=(",", ":"))
    except (TypeError, ValueError) as error:
        raise InvalidInput(field, f"is not JSON-serialisable ({error})") from None
    try:
        size = len(text.encode())
    except UnicodeEncodeError:
        raise InvalidInput(field, "contains a lone surrogate, which is not valid text") from None
    if size > max_bytes:
        raise InvalidInput(
            field, f"is {size} bytes serialised; the limit is {max_bytes} (MAX_PAYLOAD_BYTES)"
        )
    return text


def _walk(field: str, value: Any, max_depth: int, depth: int) -> None:
    # Iterative in spirit, bounded by max_depth: a hostile 10,000-deep list is refused
    # at max_depth instead of exhausting the interpreter's stack.
    if depth > max_depth:
        raise InvalidInput(field, f"nests deeper than {max_depth} levels (MAX_PAYLOAD_DEPTH)")
    if value is None or isinstance(value, bool):
        return
    if isinstance(value, str):
        if "\x00" in value:
            raise InvalidInput(
                field, "contains a NUL character (\\u0000), which PostgreSQL jsonb cannot store"
            )
        return
    if isinstance(value, int):
        return
    if isinstance(value, float):
        if not math.isfinite(value):
            raise InvalidInput(field, "contains NaN or Infinity, which JSON cannot represent")
        return
    if isinstance(value, dict):
        for k, v in value.items():
            if not isinstance(k, str):
                raise InvalidInput(
                    field, f"has a non-string key {k!r}; JSON object keys are strings"
                )
            if "\x00" in k:
                raise InvalidInput(field, "has a key with a NUL character (\\u0000)")
            _walk(field, v, max_depth, depth + 1)
        return
    if isinstance(value, (list, tuple)):
        for item in value:
            _walk(field, item, max_depth, depth + 1)
        return
    raise InvalidInput(field, f"contains a {type(value).__name__}, which is not a JSON type")


def printable(text: str, *, limit: int = 2000) -> str:
    """Return ``text`` made safe for one log line or an error column: escaped, truncated."""
    text = (
        text.encode("unicode_escape", "backslashreplace").decode("ascii")
        if _CONTROL.search(text)
        else text
    )
    return text if len(text) <= limit else text[: limit - 1] + "…"
