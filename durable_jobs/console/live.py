"""What the operator console filters and searches by, in one place.

The admin's list filters and the background bulk action ("act on all N matching") both
build their queryset here, from the same query-string parameters, so a bulk action acts
on exactly the rows the operator saw matching. Every filter and search term is served by
an index of migration 0005: the change list costs the same on a million rows as on ten.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Mapping
from typing import Any

from django.db.models import Q, QuerySet
from django.db.models.functions import Now
from django.utils.module_loading import import_string

from durable_jobs import conf, registry
from durable_jobs.console import queries
from durable_jobs.exceptions import ConfigurationError
from durable_jobs.models import HELD, Job, count_by_status_split
from durable_jobs.states import Status

#: Reasons a job is parked with (its error_code), offered by the "parked" filter.
PARK_REASONS = ("poison", "mirror_failed")
#: How many distinct kinds, queues or tenants a filter offers at most.
MAX_CHOICES = 100
#: Seconds a list of distinct values is reused before it is read again.
CHOICES_TTL = 60.0

#: The query-string parameters of the console's filters (and the search box, ``q``).
PARAMETERS = (
    "status",
    "kind",
    "queue",
    "parked",
    "lease_expired",
    "held",
    "tenant",
    "organization",
    "q",
)

_choices_cache: dict[str, tuple[float, list[str]]] = {}


def held_q() -> Q:
    """A job held by a wait condition (``JobQuerySet.held()``'s predicate, one definition)."""
    return HELD


def is_held(job: Job) -> bool:
    return (
        job.status == Status.PENDING.value
        and job.held_since is not None
        and job.wait_satisfied_at is None
    )


def lease_expired_q() -> Q:
    return Q(status=Status.RUNNING.value, lease_owner__isnull=False, lease_expires_at__lt=Now())


def display_status_q(word: str) -> Q:
    """The rows ``console.display.display_status`` calls ``word``, as a filter (one
    definition: the status filter, the bulk action and the badge cannot disagree).

    ``running`` is a held lease that has not expired, ``waiting`` a running row with no
    lease (released: a retry waiting out its backoff, a claim handed back unstarted),
    ``lease expired`` (or ``lease_expired``) a held lease past its expiry; a stored
    status is itself. Any other word matches nothing.
    """
    running = Q(status=Status.RUNNING.value)
    if word == "waiting":
        return running & Q(lease_owner__isnull=True)
    if word == "running":
        return (
            running
            & Q(lease_owner__isnull=False)
            & (Q(lease_expires_at__gte=Now()) | Q(lease_expires_at__isnull=True))
        )
    if word in ("lease expired", "lease_expired"):
        return lease_expired_q()
    return Q(status=word)


#: How many of the newest jobs the organization filter looks at for its choices.
ORGANIZATION_SAMPLE = 10_000


def seen_values(column: str) -> list[str]:
    """Distinct values of ``column`` in the table (at most MAX_CHOICES), cached for CHOICES_TTL."""
    cached = _choices_cache.get(column)
    if cached is not None and cached[0] > time.monotonic():
        return cached[1]
    if column == "organization_id":
        values = queries.recent_organizations(sample=ORGANIZATION_SAMPLE, limit=MAX_CHOICES)
    else:
        values = queries.distinct_values(column, limit=MAX_CHOICES)
    _choices_cache[column] = (time.monotonic() + CHOICES_TTL, values)
    return values


def kind_choices() -> list[str]:
    """Registered kinds, plus kinds present in the table (a kind another deployment knows)."""
    return sorted(set(registry.kinds()) | set(seen_values("kind")))


def queue_choices() -> list[str]:
    declared = {conf.get().DEFAULT_QUEUE} | {
        h.queue for h in map(registry.get, registry.kinds()) if h and h.queue
    }
    return sorted(declared | set(seen_values("queue_name")))


def tenant_choices() -> list[str]:
    return seen_values("tenant_id")


def organization_choices() -> list[str]:
    """Organizations of the newest jobs (a bounded sample; any other can be typed into the URL)."""
    return seen_values("organization_id")


def apply(queryset: QuerySet, name: str, value: str | None) -> QuerySet:
    """Narrow ``queryset`` by the console filter ``name`` = ``value`` (None or "" leaves it)."""
    if value in (None, ""):
        return queryset
    if name == "status":
        return queryset.filter(display_status_q(value))
    if name == "kind":
        return queryset.filter(kind=value)
    if name == "queue":
        return queryset.filter(queue_name=value)
    if name == "tenant":
        return queryset.filter(tenant_id=value)
    if name == "organization":
        return queryset.filter(organization_id=value)
    if name == "parked":
        if value == "no":
            return queryset.filter(parked_at__isnull=True)
        parked = queryset.filter(parked_at__isnull=False)
        return parked if value == "yes" else parked.filter(error_code=value)
    if name == "lease_expired":
        return queryset.filter(lease_expired_q()) if value == "yes" else queryset
    if name == "held":
        return queryset.filter(held_q()) if value == "yes" else queryset.exclude(held_q())
    if name == "q":
        return search(queryset, value)
    raise ValueError(f"unknown console filter {name!r}")


def matching(params: Mapping[str, Any]) -> QuerySet:
    """All jobs the console shows for ``params`` (filter name -> value), unordered."""
    queryset: QuerySet[Job] = Job.objects.all()
    for name in PARAMETERS:
        queryset = apply(queryset, name, params.get(name))
    return queryset


def scoped(queryset: QuerySet, user: Any) -> QuerySet:
    """Narrow ``queryset`` to the jobs ``user`` may see, by ``DURABLE_JOBS['ADMIN_SCOPE']``.

    The one place the admin's change list, detail page, actions, live view and the bulk
    job (for the user it records) are narrowed, so none of them can reach further than
    the others. Without the setting, the queryset is returned as it is.
    """
    path = conf.get().ADMIN_SCOPE
    if path is None:
        return queryset
    try:
        hook = import_string(path)
    except ImportError as error:
        raise ConfigurationError(
            f"DURABLE_JOBS['ADMIN_SCOPE'] = {path!r} does not import: {error}"
        ) from None
    narrowed = hook(user, queryset)
    if not isinstance(narrowed, QuerySet) or narrowed.model is not queryset.model:
        raise ConfigurationError(
            f"DURABLE_JOBS['ADMIN_SCOPE'] = {path!r} must return a queryset of jobs (the one it "
            f"was given, narrowed), got {type(narrowed).__name__}"
        )
    return narrowed


def search(queryset: QuerySet, term: str) -> QuerySet:
    """Exact match on the job id, idempotency key, lock key or subject id; prefix on the kind.

    Each alternative is an index probe (a case-insensitive or infix match would read the
    whole table). A kind prefix is expanded to the kinds it names, so it uses the kind index.
    The idempotency key and the subject id are looked up under each tenant and each subject
    type, so the indexes the job table already has for them serve the search (they lead
    with the tenant and the subject type) and no start pays for an index of the console's.
    """
    term = term.strip()
    if not term:
        return queryset
    wanted = Q(lock_key=term)
    wanted |= _under_each("tenant_id", Q(idempotency_key=term))
    wanted |= _under_each("subject_type", Q(subject_id=term))
    try:
        wanted |= Q(id=uuid.UUID(term))
    except ValueError:
        pass
    kinds = [kind for kind in kind_choices() if kind.startswith(term)]
    if kinds:
        wanted |= Q(kind__in=kinds)
    return queryset.filter(wanted)


def _under_each(column: str, condition: Q) -> Q:
    """``condition`` restricted to the values ``column`` has (read fresh: a loose index scan
    of a few probes), so an index led by ``column`` answers it; unrestricted past MAX_CHOICES."""
    values = queries.distinct_values(column, limit=MAX_CHOICES)
    if len(values) >= MAX_CHOICES:
        return condition
    return condition & Q(**{f"{column}__in": values})


def estimate_count(queryset: QuerySet, *, exact_below: int) -> tuple[int, bool]:
    """Return ``(count, exact)``: the planner's estimate, or the exact count when that is small."""
    sql, params = queryset.order_by().values("pk").query.sql_with_params()
    estimate = queries.estimate_rows(sql, params, using=queryset.db)
    if estimate < exact_below:
        # A filter on kind, queue or tenant alone implies no newest-first index's predicate
        # (they leave running rows out): counted in two parts, each index-served.
        exact = queryset.count() if queryset.query.combinator else count_by_status_split(queryset)
        return exact, True
    return estimate, False
