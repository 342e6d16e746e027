"""What crosses the pipe to a handler process for one run, and what the process does with it.

The worker sends the claimed row (``encode_row``); the handler process builds the ``Job``
again (``decode_row``) and runs the slice (``run_one``). A module of its own, not part of
``child.py`` (the process's plumbing, importable before Django is set up), because its
imports need the app registry: here they are made once, where ``run_one`` importing its
five names on every run cost a handler process about 4 us a run (issue #27).
"""

from __future__ import annotations

import datetime
import operator
import uuid
from typing import TYPE_CHECKING, Any

from django.db import models

from durable_jobs import registry
from durable_jobs.db import JOB_FIELDS, build_job, keep_connection_healthy
from durable_jobs.runtime import invoke
from durable_jobs.runtime.control import SliceControl
from durable_jobs.states import Lease, SliceEnd

if TYPE_CHECKING:
    from durable_jobs.models import Job
    from durable_jobs.runtime.child import Mailbox

_NAMES = tuple(field.attname for field in JOB_FIELDS)
_TIMESTAMPS = tuple(
    index for index, field in enumerate(JOB_FIELDS) if isinstance(field, models.DateTimeField)
)
_IDS = tuple(index for index, field in enumerate(JOB_FIELDS) if isinstance(field, models.UUIDField))
_VALUES = operator.itemgetter(*_NAMES)
#: Where ``encode_row`` puts the job's id (as text): the run message reuses it.
ID_POSITION = _NAMES.index("id")

_UTC = datetime.timezone.utc
_EPOCH = datetime.datetime(1970, 1, 1, tzinfo=_UTC)
_MICROSECOND = datetime.timedelta(microseconds=1)


def encode_row(job: Job) -> list[Any]:
    """The claimed row as JSON-ready values in column order, so the child need not read it
    again: a list, not a dict of names, and only the timestamps and ids converted (the row
    crosses the pipe once per slice; issues #14 and #27).

    A UTC timestamp goes as whole microseconds since the epoch (exact, and a fifth of what
    ``isoformat()`` costs; a claimed row's are UTC wherever Django's zone is, see
    ``db.read_timestamps_in_c``); any other, naive ones included, as ISO text, which keeps
    its offset.
    """
    fields = job.__dict__
    try:
        values = list(_VALUES(fields))
    except KeyError:  # a deferred column goes as NULL
        values = [fields.get(name) for name in _NAMES]
    for position in _TIMESTAMPS:
        value = values[position]
        if value is not None:
            values[position] = (
                (value - _EPOCH) // _MICROSECOND if value.tzinfo is _UTC else value.isoformat()
            )
    for position in _IDS:
        value = values[position]
        if value is not None:
            values[position] = str(value)
    return values


def decode_row(values: list[Any], using: str) -> Job:
    """The row ``encode_row`` sent, as a ``Job`` again (timestamps and ids typed back).

    A timestamp sent as microseconds comes back in UTC; one sent as text through
    ``datetime.fromisoformat``, which reads back exactly what ``isoformat()`` wrote
    (offset included), at a fraction of ``DateTimeField.to_python``'s cost.
    """
    for position in _TIMESTAMPS:
        value = values[position]
        if value is not None:
            values[position] = (
                _EPOCH + value * _MICROSECOND
                if type(value) is int
                else datetime.datetime.fromisoformat(value)
            )
    for position in _IDS:
        value = values[position]
        if value is not None:
            values[position] = uuid.UUID(value)
    return build_job(values, using)


def run_one(message: dict[str, Any], mailbox: Mailbox, using: str) -> dict[str, Any]:
    """Run the slice ``message`` names and return its ``Ran`` as a dict."""
    keep_connection_healthy(using)
    lease = Lease(
        job_id=message["job_id"],
        owner=message["owner"],
        epoch=message["epoch"],
        ttl_ms=message["ttl_ms"],
    )
    # The row as the worker's claim returned it: the claim is the authority, and every
    # write the handler makes is fenced on this lease anyway.
    job = decode_row(message["row"], using)
    handler = registry.get(job.kind) or invoke.unregistered(job.kind)
    control = SliceControl(job, handler, lease, stopping=mailbox.stopping, using=using)
    mailbox.begin((message["job_id"], message["epoch"]), control)
    try:
        if control.lease_lost:
            # Lost while it waited in the queue: not ours to run (the worker records it).
            return {"end": SliceEnd.LEASE_LOST.value}
        return invoke.invoke(control.context, using=using).as_dict()
    finally:
        mailbox.end()
