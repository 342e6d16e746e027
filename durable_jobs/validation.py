"""Refuse bad input at the API, before anything is written.

jsonb cannot hold ``\\u0000``, a 100 MB payload would be written whole before anyone
noticed, and a control character in a key would forge log lines: every one of these is
refused here with an error naming the argument, so a bad call fails the call instead
of stranding a job.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

from durable_jobs.exceptions import InvalidInput

NAME = re.compile(r"^[A-Za-z0-9_.:-]{1,100}\Z")  # \Z: "$" would let a final newline through
# Keys may be any printable text (so keys that look like SQL round-trip exactly), but no
# control characters: they would reach log lines and the admin verbatim.
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]")


def name(field: str, value: Any) -> str:
    """A kind, queue, tenant or organization: 1-100 of letters, digits, ``_ . : -``."""
    if not isinstance(value, str) or not NAME.match(value):
        raise InvalidInput(field, "must be 1-100 characters of letters, digits, _ . : -")
    return value


def key(field: str, value: Any, *, max_length: int = 255) -> str:
    """A lock, idempotency or subject key: printable text without control characters."""
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
        raise InvalidInput(field, f"is {size} bytes serialised; the limit is {max_bytes} (MAX_PAYLOAD_BYTES)")
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
            raise InvalidInput(field, "contains a NUL character (\\u0000), which PostgreSQL jsonb cannot store")
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
                raise InvalidInput(field, f"has a non-string key {k!r}; JSON object keys are strings")
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
    text = text.encode("unicode_escape", "backslashreplace").decode("ascii") if _CONTROL.search(text) else text
    return text if len(text) <= limit else text[: limit - 1] + "…"
