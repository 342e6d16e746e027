"""Signals an application can hook (sent with ``send_robust``: a failing receiver is logged
and never turns a finished job into a failed one).

* ``job_started(job)`` — a start committed a new job (sent by ``durable_jobs.start``
  after the insert; inside the caller's transaction, so it may still roll back).
* ``slice_started(job)`` / ``slice_finished(job, outcome)`` — around every slice a worker runs.
* ``job_finished(job, outcome)`` — after the terminal transaction committed;
  ``outcome`` is ``completed``, ``failed`` or ``cancelled``. A batch of quick slices may
  be completed, and this sent, on the worker's completer thread rather than the slot's.
"""

from __future__ import annotations

from django.dispatch import Signal

job_started = Signal()
slice_started = Signal()
slice_finished = Signal()
job_finished = Signal()
