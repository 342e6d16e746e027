"""One line per database outage, for a whole worker, however many slots notice it.

Each slot, the listener and the reconciler loop retry on their own (with backoff), and
each used to log every failed try: with four slots, a line every few seconds each, with
the driver's multi-line message escaped into one (``\\n\\t``). ``OutageLog`` says it once,
at WARNING, with the first line of the reason, and once more at INFO when the database
answers again; the retries in between are DEBUG.
"""

from __future__ import annotations

import logging
import threading
import time

from durable_jobs import validation


def one_line(error: BaseException, *, limit: int = 300) -> str:
    """``Class: first line of the message``, validated for a log line (invariant 23)."""
    lines = str(error).strip().splitlines()
    return validation.printable(f"{type(error).__name__}: {lines[0] if lines else ''}", limit=limit)


class OutageLog:
    """The worker's record of whether its database is answering, for its log."""

    def __init__(self, log: logging.Logger, who: str) -> None:
        self._log = log
        self._who = who
        self._lock = threading.Lock()
        self._since: float | None = None

    @property
    def ongoing(self) -> bool:
        return self._since is not None

    def failed(self, where: str, error: BaseException, retry_in: float) -> None:
        """Report a failed try: WARNING the first time in an outage, DEBUG after that."""
        with self._lock:
            first = self._since is None
            if first:
                self._since = time.monotonic()
        if first:
            self._log.warning(
                "worker %s: database unreachable (%s); %s and the others retry with backoff, "
                "nothing is lost",
                self._who,
                one_line(error),
                where,
            )
        else:
            self._log.debug(
                "%s: still failing (%s); retrying in %.1fs", where, one_line(error), retry_in
            )

    def answered(self) -> None:
        """Report a successful statement: INFO once when it ends an outage."""
        if self._since is None:  # the common case, without the lock
            return
        with self._lock:
            since, self._since = self._since, None
        if since is not None:
            self._log.info(
                "worker %s: database reachable again after %.1fs",
                self._who,
                time.monotonic() - since,
            )
