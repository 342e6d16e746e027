"""Job ids: UUIDs whose first 48 bits are the creation time in milliseconds (RFC 9562, version 7).

A random (version 4) primary key sends each insert to a random leaf of the primary key's
index: on a large table most of those pages are not in memory, and each first touch after
a checkpoint writes a full page image to the WAL. Time-ordered ids append to the index's
right edge, which stays in memory, like a bigserial key, while ids stay unguessable across
jobs (74 random bits) and need no coordination between processes. The creation time an id
shows is the job's ``created_at`` to the millisecond, which the job row shows anyway.
"""

from __future__ import annotations

import os
import threading
import time
import uuid

_lock = threading.Lock()
_last_ms = 0
_counter = 0


def uuid7() -> uuid.UUID:
    """A new version 7 UUID: 48-bit Unix milliseconds, then random bits.

    Ids made by this process in the same millisecond stay in creation order: the 12 bits
    after the version count up from a random start (RFC 9562, method 1), and a count that
    runs out borrows the next millisecond.
    """
    global _last_ms, _counter
    rand = int.from_bytes(os.urandom(10), "big")
    with _lock:
        ms = time.time_ns() // 1_000_000
        if ms > _last_ms:
            _last_ms, _counter = ms, (rand >> 68) & 0x7FF  # room to count up within the millisecond
        else:
            _counter += 1
            if _counter > 0xFFF:
                _last_ms, _counter = _last_ms + 1, 0
        ms, counter = _last_ms, _counter
    value = (ms << 80) | (0x7 << 76) | (counter << 64) | (0b10 << 62) | (rand & ((1 << 62) - 1))
    return uuid.UUID(int=value)
