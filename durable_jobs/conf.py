"""The one ``DURABLE_JOBS`` setting, read into a typed, frozen object.

Durations are given in seconds (int or float) or as ``timedelta``; they are kept as
float seconds here and cross into SQL as whole milliseconds (see ``ms``).
"""

from __future__ import annotations

import dataclasses
import difflib
import importlib.util
import math
import re
from collections.abc import Callable, Mapping
from datetime import timedelta
from types import MappingProxyType
from typing import Any, cast

from django.conf import settings as django_settings
from django.utils.module_loading import import_string

from durable_jobs.exceptions import ConfigurationError
from durable_jobs.waits import grammar

EXECUTION_MODES = ("process", "thread")
START_METHODS = ("forkserver", "spawn")
USER_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,31}\Z")
NAME_PATTERN = re.compile(r"^[A-Za-z0-9_.:-]{1,100}\Z")  # \Z: "$" would accept a final newline
#: The most MAX_RUN_AFTER may be: 100 years, well inside what Python's datetime and
#: PostgreSQL's timestamptz can hold, so the bound itself never overflows.
MAX_RUN_AFTER_CEILING = 100 * 365 * 24 * 3600.0


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Settings:
    #: Tenant of every call that does not pass a scope: single-tenant users never see it.
    DEFAULT_TENANT: str = "default"
    #: Queue of jobs whose handler names none.
    DEFAULT_QUEUE: str = "default"
    #: How long a claim lasts without a heartbeat (database clock).
    LEASE_TTL: float = 60.0
    #: How often the worker extends its leases; must stay well inside LEASE_TTL.
    HEARTBEAT_INTERVAL: float = 10.0
    #: Wall time a slice may run before should_yield() asks it to hand back.
    SLICE_BUDGET: float = 300.0
    #: The hard bound on one slice; None means twice SLICE_BUDGET. A slice still running
    #: then is ended (its child process killed, or its thread abandoned) and the job is
    #: charged a ``time_limit`` failure: backoff, and after MAX_CONSECUTIVE_FAILURES such
    #: slices in a row it ends failed.
    TIME_LIMIT: float | None = None
    #: How handlers run: "process" (a child process per slot, killed at the time limit,
    #: on cancel past CANCEL_GRACE and at shutdown past SHUTDOWN_GRACE) or "thread".
    EXECUTION: str = "process"
    #: How process execution starts a handler process: "forkserver" forks it from a
    #: process that set Django up once (milliseconds each); "spawn" starts a fresh
    #: interpreter each time (Django set up again, about 0.4 s of CPU), for projects whose
    #: imports start threads or otherwise cannot survive a fork.
    START_METHOD: str = "forkserver"
    #: How long a running slice has to honour a cancel request before it is killed
    #: (process execution) or abandoned (thread execution).
    CANCEL_GRACE: float = 30.0
    #: Thread execution: handler threads a worker may abandon (past their time limit or
    #: cancel grace) before it exits non-zero so its supervisor restarts it.
    MAX_ABANDONED_THREADS: int = 4
    #: The N-th consecutive failed slice is the retry_exhausted verdict.
    MAX_CONSECUTIVE_FAILURES: int = 5
    #: Retry backoff: base * 2**(failures-1), capped, with full jitter on the top half.
    RETRY_BACKOFF_BASE: float = 2.0
    #: Longest retry backoff; must be at least RETRY_BACKOFF_BASE.
    RETRY_BACKOFF_MAX: float = 300.0
    #: Failed mirror attempts before a job is parked mirror_failed.
    MAX_MIRROR_ATTEMPTS: int = 5
    #: How long past its lease expiry a running job must be before it is an orphan.
    ORPHAN_GRACE: float = 30.0
    #: Pending longer than this is reported as stale (never re-driven by the database transport).
    PENDING_TTL: float = 900.0
    #: Orphan re-drives without a committed unit before a job is parked as poison.
    MAX_REDRIVES_WITHOUT_COMMIT: int = 5
    #: Most jobs a worker slot claims in one statement: only while its batches are quick (each
    #: slice under 100 ms, the batch under 250 ms); what a batch has not started by then is
    #: handed back uncharged. None: 64 in process execution, 8 in thread execution (where a
    #: handler that kills the process takes every claim of its batch with it, each charged a
    #: re-drive). 1 spreads short jobs over slots most evenly.
    MAX_PREFETCH: int | None = None
    #: Worker idle poll; LISTEN/NOTIFY wakes it sooner, polling alone must be correct.
    POLL_INTERVAL: float = 1.0
    #: LISTEN/NOTIFY channel; None disables notifications (e.g. behind a transaction pooler).
    NOTIFY_CHANNEL: str | None = "durable_jobs"
    #: Database alias (a key of ``DATABASES``) the worker's wake-up listener connects
    #: through; None means the worker's own. Behind a transaction-mode pooler (PgBouncer),
    #: name an alias that reaches PostgreSQL directly: LISTEN does not survive the pooler,
    #: and a worker whose probe NOTIFY does not come back says so in its log.
    LISTEN_DATABASE: str | None = None
    #: How long running slices get to yield after the first SIGTERM/SIGINT.
    SHUTDOWN_GRACE: float = 30.0
    #: A fenced transaction left idle this long (its worker stopped or stuck while holding
    #: the job row) is ended by PostgreSQL, releasing the row so the job can be re-driven.
    FENCED_IDLE_TIMEOUT: float = 300.0
    #: How long cancel() and redrive() wait for a job row that a worker's transaction
    #: holds (a fenced() write, a mirror) before raising JobBusy: operators never hang.
    OPERATOR_LOCK_WAIT: float = 2.0
    #: Reconciler pass cadence.
    RECONCILE_INTERVAL: float = 5.0
    #: Largest serialized input/checkpoint/meta/result accepted, in bytes (also a child's
    #: input and an event's payload). A larger result fails the job at once: error_code
    #: ``terminal``, its message starting ``invalid_result:`` and naming this bound.
    MAX_PAYLOAD_BYTES: int = 1_000_000
    #: Deepest nesting accepted in a JSON payload.
    MAX_PAYLOAD_DEPTH: int = 64
    #: Largest start_many batch accepted, in bytes serialised (inputs and metas in UTF-8,
    #: plus each job's other fields); a bigger batch is refused with BatchTooLarge before
    #: anything is written. A batch of one job is never refused for its size.
    MAX_BATCH_BYTES: int = 64_000_000
    #: Furthest ahead start()/start_many() may schedule a job (run_after).
    MAX_RUN_AFTER: float = 366 * 24 * 3600.0
    #: Refuse start() of a kind no handler is registered for.
    REQUIRE_REGISTERED_KINDS: bool = True
    #: The queues jobs may be started on, as Django's ``TASKS`` declares ``QUEUES``: a
    #: start, a handler or a worker naming any other queue is refused with a "did you
    #: mean". None (the default): any well-formed queue name. When declared it must
    #: include DEFAULT_QUEUE.
    QUEUES: Any = None
    #: An idempotency key reused with a different input: False (the default) returns the
    #: first job, as for the same input; True raises ``IdempotencyInputMismatch``, as a
    #: payments API refuses a retried request whose body changed.
    IDEMPOTENCY_CHECKS_INPUT: bool = False
    #: Finished (not parked) jobs older than this are deleted by the reconciler, in
    #: bounded batches; None keeps them forever. Parked jobs wait for an operator.
    RETENTION: float | None = 30 * 24 * 3600.0
    #: Bearer token a Prometheus scraper sends (``Authorization: Bearer <token>``) to read
    #: ``durable_jobs.console.prometheus.metrics_view``; at least 16 characters, no whitespace.
    #: None: only logged-in users with the ``durable_jobs.view_job`` permission may read it.
    METRICS_TOKEN: str | None = None
    #: Most selected rows an admin action changes in its own request; a larger selection
    #: is handed to a background bulk job over exactly those ids (like "all N matching").
    ADMIN_ACTION_MAX_ROWS: int = 100
    #: Dotted path of a callable ``(user, queryset) -> queryset`` that narrows every admin
    #: view, action, live poll and bulk job to the jobs ``user`` may see; None: no narrowing.
    ADMIN_SCOPE: str | None = None

    # --- attempt history and error text (docs/guarantees.rst, "Attempt history") ---
    #: Attempt rows kept per job (the newest); the statement that records one more trims
    #: the oldest. Retention deletes them with their job.
    ATTEMPT_HISTORY_KEEP: int = 20
    #: Largest traceback stored with an attempt, in bytes of UTF-8: a longer one keeps its
    #: last bytes (the innermost frames and the exception line) after a marker line.
    ATTEMPT_TRACEBACK_BYTES: int = 16384
    #: A callable ``(text: str) -> str``, or the dotted path of one, applied to every
    #: error message and traceback before it is stored (the job row, attempt rows) or
    #: logged by the worker; None leaves the text as it is. An unimportable path, or a
    #: value that is not callable, stops the worker at boot naming it. A hook that raises
    #: or returns something that is not a string replaces the text with a marker: the
    #: unredacted text is never stored.
    REDACT_ERROR: Any = None

    # --- transports (durable_jobs.transports; docs/transports.rst) ---
    #: Which transport delivers a queue's jobs: "database" (the job table, woken by
    #: LISTEN/NOTIFY, polled as the floor), "rabbitmq" or "redis" (Redis Streams). A string
    #: for every queue, or a dict ``{queue: transport}`` naming the queues that move (the
    #: others stay on the database): a project moves one queue at a time.
    TRANSPORT: Any = "database"
    #: Broker URLs by transport: ``{"rabbitmq": "amqp://user:pass@host:5672/vhost",
    #: "redis": "redis://host:6379/0"}``; required for every broker transport in use.
    BROKER_URLS: Any = None
    #: Prefix of every name this app makes on a broker (queues, streams, delay queues,
    #: the Redis schedule), so projects sharing one broker never see each other's messages.
    BROKER_PREFIX: str = "durable_jobs"
    #: Bound on connecting to a broker and on one publish's confirmation; a publish past it
    #: is given up and left to the stale-pending re-drive (nothing is lost).
    BROKER_TIMEOUT: float = 5.0

    # --- wait conditions (durable_jobs.waits; docs/waits.rst) ---
    #: Declared wait checks: ``"name:/absolute/path,other:/absolute/path"`` or a
    #: ``{name: path}`` dict. Names are 1-50 of letters, digits, ``. _ -``; each entry is
    #: split on its first colon. A malformed entry, a duplicate name or a relative path
    #: fails the system check and stops the worker, naming the entry. Whether the file
    #: exists and is executable is checked on the worker that runs it.
    WAIT_PROFILES: Any = None
    #: Furthest ahead (database clock, at start) an ``after`` condition may name. A bound
    #: on what a start may schedule, not on the hold: an ``after`` polls nothing.
    WAIT_AFTER_MAX_AHEAD: float = 30 * 24 * 3600.0
    #: Longest a job may wait on its profile checks (counted from when checking began)
    #: before it fails with ``wait_max_hold``.
    WAIT_MAX_HOLD: float = 7 * 24 * 3600.0
    #: Consecutive "cannot tell" answers (a crash, a timeout, exit 1) before the job fails
    #: with ``wait_faults_exhausted``; any real answer resets the count.
    WAIT_MAX_FAULTS: int = 5
    #: Wall time one check run may take; then its whole process group is killed and the
    #: run counts as "cannot tell".
    WAIT_CHECK_TIMEOUT: float = 30.0
    #: Run every check as this unprivileged user (a name in the host's user database):
    #: its uid, its primary group, no supplementary groups. None runs checks as the
    #: worker's own user, who can read the worker's environment. Needs a worker running
    #: as root or with CAP_SETUID and CAP_SETGID; an unknown user or root stops the
    #: worker (and fails the system check), naming it.
    WAIT_CHECK_USER: str | None = None
    #: Bytes of a check's output kept (the rest is read and dropped); never logged.
    WAIT_CHECK_OUTPUT_CAP: int = 4096
    #: Checks one worker process runs at once. A job denied a turn is held again for
    #: WAIT_DENIED_RECHECK and its ``wait_denials`` count grows, so starvation shows.
    WAIT_MAX_CONCURRENT_CHECKS: int = 2
    #: How soon a job denied a check turn (WAIT_MAX_CONCURRENT_CHECKS) is tried again.
    WAIT_DENIED_RECHECK: float = 5.0
    #: Base cadence of profile checks (clamped up to WAIT_CHECK_INTERVAL_FLOOR). The
    #: cadence doubles every ten base periods of hold, up to WAIT_CHECK_INTERVAL_CEILING
    #: or the base itself, whichever is larger: an hourly base stays hourly.
    WAIT_CHECK_INTERVAL: float = 30.0
    #: The least time between two checks of one job: a smaller base is raised to it.
    WAIT_CHECK_INTERVAL_FLOOR: float = 30.0
    #: Where the growing cadence settles (unless the base is larger).
    WAIT_CHECK_INTERVAL_CEILING: float = 900.0
    #: Per flow key limits, overriding the kinds' FlowControl defaults (durable_jobs.limits):
    #: ``{"tenant:acme": {"concurrency": 5, "rate": 100, "per": 60, "weight": 3}}``. An
    #: operator's runtime limit (``durable_jobs set-limit``) overrides these in turn.
    FLOW_KEYS: Any = None

    # --- periodic jobs (durable_jobs.schedules; docs/howto/schedules.rst) ---
    #: Schedules declared in settings, beside those declared next to handlers:
    #: ``{name: {"kind": ..., "cron": ..., "tz": ..., "input": ..., "queue": ...,
    #: "priority": ..., "catch_up": ...}}`` ("kind" and "cron" required). Checked by the
    #: system check, which names a schedule whose kind, expression or zone is wrong.
    SCHEDULES: Any = None
    #: A tick started no later than this after its instant is on time and always starts;
    #: an older one was missed (the scheduler was down) and its catch-up policy decides.
    SCHEDULE_GRACE: float = 60.0

    def __post_init__(self) -> None:
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            label = f"DURABLE_JOBS[{field.name!r}]"
            if field.type == "float":
                object.__setattr__(self, field.name, duration(label, value))
            elif field.type == "int":
                positive_int(label, value)
            elif field.type == "bool" and not isinstance(value, bool):
                raise ConfigurationError(f"{label} must be True or False")
        object.__setattr__(self, "FLOW_KEYS", flow_keys(self.FLOW_KEYS))
        if self.QUEUES is not None:
            queues = self.QUEUES
            if isinstance(queues, str) or not isinstance(queues, (list, tuple, set, frozenset)):
                raise ConfigurationError(
                    "DURABLE_JOBS['QUEUES'] must be None or a list of queue names"
                )
            bad = [q for q in queues if not isinstance(q, str) or not NAME_PATTERN.match(q)]
            if bad or not queues:
                raise ConfigurationError(
                    f"DURABLE_JOBS['QUEUES'] must list 1-100 character names of letters, "
                    f"digits, _ . : - ; got {sorted(map(repr, bad)) or 'an empty list'}"
                )
            if self.DEFAULT_QUEUE not in queues:
                raise ConfigurationError(
                    f"DURABLE_JOBS['QUEUES'] must include DEFAULT_QUEUE ({self.DEFAULT_QUEUE!r})"
                )
            object.__setattr__(self, "QUEUES", tuple(sorted(set(queues))))
        for name in ("RETENTION", "TIME_LIMIT"):
            if getattr(self, name) is not None:
                object.__setattr__(
                    self, name, duration(f"DURABLE_JOBS[{name!r}] (or None)", getattr(self, name))
                )
        if self.EXECUTION not in EXECUTION_MODES:
            raise ConfigurationError(
                f"DURABLE_JOBS['EXECUTION'] must be one of {', '.join(map(repr, EXECUTION_MODES))}, "
                f"got {self.EXECUTION!r}"
            )
        if self.MAX_PREFETCH is not None:
            positive_int("DURABLE_JOBS['MAX_PREFETCH'] (or None)", self.MAX_PREFETCH)
        if self.START_METHOD not in START_METHODS:
            raise ConfigurationError(
                f"DURABLE_JOBS['START_METHOD'] must be one of {', '.join(map(repr, START_METHODS))}, "
                f"got {self.START_METHOD!r}"
            )
        for name in ("DEFAULT_TENANT", "DEFAULT_QUEUE"):
            if not isinstance(getattr(self, name), str) or not NAME_PATTERN.match(
                getattr(self, name)
            ):
                raise ConfigurationError(
                    f"DURABLE_JOBS[{name!r}] must be 1-100 characters of letters, digits, _ . : -"
                )
        channel = self.NOTIFY_CHANNEL
        if channel is not None and (
            not isinstance(channel, str) or not re.match(r"^[a-z_][a-z0-9_]{0,62}\Z", channel)
        ):
            raise ConfigurationError(
                "DURABLE_JOBS['NOTIFY_CHANNEL'] must be None or a lower-case identifier of at most 63 bytes"
            )
        if self.LISTEN_DATABASE is not None:
            aliases = list(getattr(django_settings, "DATABASES", {}) or {})
            if not isinstance(self.LISTEN_DATABASE, str) or self.LISTEN_DATABASE not in aliases:
                raise ConfigurationError(
                    f"DURABLE_JOBS['LISTEN_DATABASE'] must be None or an alias in DATABASES "
                    f"({', '.join(map(repr, aliases)) or 'none defined'}), got {self.LISTEN_DATABASE!r}"
                )
        if self.HEARTBEAT_INTERVAL >= self.LEASE_TTL:
            raise ConfigurationError(
                f"DURABLE_JOBS['HEARTBEAT_INTERVAL'] ({self.HEARTBEAT_INTERVAL}s) must be below "
                f"LEASE_TTL ({self.LEASE_TTL}s), or every lease expires between two heartbeats"
            )
        if self.MAX_RUN_AFTER > MAX_RUN_AFTER_CEILING:
            raise ConfigurationError(
                f"DURABLE_JOBS['MAX_RUN_AFTER'] must be at most {MAX_RUN_AFTER_CEILING:.0f} seconds "
                "(100 years); further than that is a mistake, not a schedule"
            )
        token = self.METRICS_TOKEN
        if token is not None and (
            not isinstance(token, str) or len(token) < 16 or re.search(r"\s", token)
        ):
            shown = (
                f"a {type(token).__name__}"
                if not isinstance(token, str)
                else f"{len(token)} characters"
            )
            raise ConfigurationError(
                f"DURABLE_JOBS['METRICS_TOKEN'] must be None or a string of at least 16 characters without "
                f"whitespace, got {shown}"
            )
        if self.ADMIN_SCOPE is not None and (
            not isinstance(self.ADMIN_SCOPE, str)
            or not re.match(
                r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)+\Z", self.ADMIN_SCOPE
            )
        ):
            raise ConfigurationError(
                "DURABLE_JOBS['ADMIN_SCOPE'] must be None or the dotted path of a callable "
                f"(user, queryset) -> queryset, like 'myproject.jobs.visible_jobs'; got "
                f"{self.ADMIN_SCOPE!r}"
            )
        object.__setattr__(self, "REDACT_ERROR", _redactor(self.REDACT_ERROR))
        if self.RETRY_BACKOFF_MAX < self.RETRY_BACKOFF_BASE:
            raise ConfigurationError(
                "DURABLE_JOBS['RETRY_BACKOFF_MAX'] must be >= RETRY_BACKOFF_BASE"
            )
        _check_transports(self)
        # Read once, here: the system check and the worker's refusal to start both come
        # from this line, so a garbled declaration can never reach the gate.
        object.__setattr__(
            self, "WAIT_PROFILES", MappingProxyType(grammar.parse_profiles(self.WAIT_PROFILES))
        )
        if self.WAIT_CHECK_USER is not None:
            check_user(self.WAIT_CHECK_USER)
        _check_schedules_shape(self.SCHEDULES)
        if self.WAIT_CHECK_INTERVAL_CEILING < self.WAIT_CHECK_INTERVAL_FLOOR:
            raise ConfigurationError(
                f"DURABLE_JOBS['WAIT_CHECK_INTERVAL_CEILING'] ({self.WAIT_CHECK_INTERVAL_CEILING}s) must be at "
                f"least WAIT_CHECK_INTERVAL_FLOOR ({self.WAIT_CHECK_INTERVAL_FLOOR}s)"
            )
        if self.WAIT_AFTER_MAX_AHEAD > MAX_RUN_AFTER_CEILING:
            raise ConfigurationError(
                f"DURABLE_JOBS['WAIT_AFTER_MAX_AHEAD'] must be at most {MAX_RUN_AFTER_CEILING:.0f} seconds (100 years)"
            )


#: The transports a queue may use (docs/transports.rst), and the client library each needs.
TRANSPORTS = ("database", "rabbitmq", "redis")
_BROKER_CLIENTS = {"rabbitmq": "pika", "redis": "redis"}
_BROKER_SCHEMES = {"rabbitmq": ("amqp", "amqps"), "redis": ("redis", "rediss", "unix")}


def _check_transports(settings: Settings) -> None:
    """Refuse a transport setting that cannot deliver, one line naming what is wrong."""
    chosen = settings.TRANSPORT
    if isinstance(chosen, str):
        used = {chosen}
    elif isinstance(chosen, dict):
        bad = [q for q in chosen if not isinstance(q, str) or not NAME_PATTERN.match(q)]
        if bad:
            raise ConfigurationError(
                f"DURABLE_JOBS['TRANSPORT'] names queues that are no queue names: {sorted(map(repr, bad))}"
            )
        for queue in chosen:
            undeclared = undeclared_queue(queue, settings)
            if undeclared:
                raise ConfigurationError(f"DURABLE_JOBS['TRANSPORT']: {undeclared}")
        used = set(chosen.values())
        object.__setattr__(settings, "TRANSPORT", MappingProxyType(dict(chosen)))
    else:
        raise ConfigurationError(
            "DURABLE_JOBS['TRANSPORT'] must be a transport name or a dict {queue: transport}, "
            f"got {type(chosen).__name__}"
        )
    unknown = sorted(map(repr, used - set(TRANSPORTS)))
    if unknown:
        raise ConfigurationError(
            f"DURABLE_JOBS['TRANSPORT'] must use {', '.join(map(repr, TRANSPORTS))}; got {', '.join(unknown)}"
        )
    urls = settings.BROKER_URLS or {}
    if not isinstance(urls, dict):
        raise ConfigurationError(
            "DURABLE_JOBS['BROKER_URLS'] must be None or a dict {transport: url}"
        )
    for transport in sorted(used - {"database"}):
        url = urls.get(transport)
        schemes = _BROKER_SCHEMES[transport]
        if not isinstance(url, str) or url.split("://", 1)[0] not in schemes:
            raise ConfigurationError(
                f"DURABLE_JOBS['BROKER_URLS'][{transport!r}] must be a URL with scheme {' or '.join(schemes)} "
                f"(the {transport} transport is in use), got {url!r}"
            )
        if importlib.util.find_spec(_BROKER_CLIENTS[transport]) is None:
            raise ConfigurationError(
                f"DURABLE_JOBS['TRANSPORT'] uses {transport!r} but its client library "
                f"{_BROKER_CLIENTS[transport]!r} is not installed: install durable-jobs[{transport}]"
            )
    if not NAME_PATTERN.match(settings.BROKER_PREFIX or ""):
        raise ConfigurationError(
            "DURABLE_JOBS['BROKER_PREFIX'] must be 1-100 characters of letters, digits, _ . : -"
        )


def transport_of(queue: str, settings: Settings) -> str:
    """The transport that delivers ``queue``'s jobs ("database" unless the setting moves it)."""
    chosen = settings.TRANSPORT
    if isinstance(chosen, str):
        return chosen
    return str(chosen.get(queue, "database"))


_FIELD_NAMES = tuple(f.name for f in dataclasses.fields(Settings))

#: The keys a ``DURABLE_JOBS["SCHEDULES"]`` entry may hold.
SCHEDULE_KEYS = frozenset({"kind", "cron", "tz", "input", "queue", "priority", "catch_up"})


def _check_schedules_shape(raw: Any) -> None:
    """``SCHEDULES`` is None or ``{name: {"kind": ..., "cron": ..., ...}}``; the rest is the system check's."""
    if raw is None:
        return
    label = "DURABLE_JOBS['SCHEDULES']"
    if not isinstance(raw, dict):
        raise ConfigurationError(
            f"{label} must be None or a dict {{name: {{'kind': ..., 'cron': ...}}}}"
        )
    for name, entry in raw.items():
        if not isinstance(entry, dict):
            raise ConfigurationError(f"{label}[{name!r}] must be a dict with 'kind' and 'cron'")
        unknown = sorted(set(entry) - SCHEDULE_KEYS)
        missing = sorted({"kind", "cron"} - set(entry))
        if unknown:
            raise ConfigurationError(
                f"{label}[{name!r}]: unknown keys {unknown}; the keys are {', '.join(sorted(SCHEDULE_KEYS))}"
            )
        if missing:
            raise ConfigurationError(f"{label}[{name!r}] needs {' and '.join(map(repr, missing))}")


def duration(label: str, value: Any) -> float:
    """Seconds from a positive, finite number or a ``timedelta``; ConfigurationError otherwise."""
    seconds = value.total_seconds() if isinstance(value, timedelta) else value
    if (
        isinstance(seconds, bool)
        or not isinstance(seconds, (int, float))
        or not math.isfinite(seconds)
        or seconds <= 0
    ):
        raise ConfigurationError(
            f"{label} must be a positive, finite number of seconds or a timedelta, got {value!r}"
        )
    return float(seconds)


def check_user(name: Any) -> None:
    """Refuse a WAIT_CHECK_USER that is not a user of this host, or is root.

    Whether this process may switch to it is the worker's question (a web process
    reading the same settings never runs a check): ``waits.checks.user_refusal``.
    """
    label = "DURABLE_JOBS['WAIT_CHECK_USER']"
    if not isinstance(name, str) or not USER_NAME.match(name):
        raise ConfigurationError(
            f"{label} must be None or a user name (1-32 of letters, digits, _ . -), got {name!r}"
        )
    try:
        import pwd
    except ImportError:
        raise ConfigurationError(f"{label} needs a POSIX host with users to switch to") from None
    try:
        entry = pwd.getpwnam(name)
    except KeyError:
        raise ConfigurationError(
            f"{label} names {name!r}, which is no user on this host; create it "
            "(useradd --system --no-create-home NAME) or leave the setting unset"
        ) from None
    if entry.pw_uid == 0:
        raise ConfigurationError(
            f"{label} names {name!r}, which is root: a check running as root is contained by nothing"
        )


def _redactor(value: Any) -> Callable[[str], Any] | None:
    """The REDACT_ERROR hook itself: imported here, so a bad path stops the worker at boot."""
    label = "DURABLE_JOBS['REDACT_ERROR']"
    if value is None or (callable(value) and not isinstance(value, str)):
        return value
    if not isinstance(value, str) or not value:
        raise ConfigurationError(
            f"{label} must be None, a callable or the dotted path of one, got {type(value).__name__}"
        )
    try:
        hook = import_string(value)
    except ImportError as error:
        raise ConfigurationError(
            f"{label} names {value!r}, which cannot be imported: {error}"
        ) from None
    if not callable(hook):
        raise ConfigurationError(f"{label} names {value!r}, which is not callable")
    return cast("Callable[[str], Any]", hook)


#: What replaces a text the REDACT_ERROR hook failed on: never the text itself.
REDACTION_FAILED = "[error text withheld: the REDACT_ERROR hook failed ({})]"


def redact(text: str | None) -> str | None:
    """Apply the REDACT_ERROR hook to an error message or traceback (None stays None).

    Called where exception text first becomes a message or a traceback, before it is
    stored or logged. A hook that raises, or answers with something that is not a
    string, withholds the text: failing closed is the point of a redaction hook.
    """
    hook = get().REDACT_ERROR
    if text is None or hook is None:
        return text
    try:
        redacted = hook(text)
    except Exception as error:  # noqa: BLE001 - a broken hook must not strand the job
        return REDACTION_FAILED.format(type(error).__name__)
    if not isinstance(redacted, str):
        return REDACTION_FAILED.format(f"it returned {type(redacted).__name__}")
    return redacted


_FLOW_FIELDS = ("concurrency", "rate", "per", "weight")


def flow_keys(raw: Any) -> MappingProxyType:
    """FLOW_KEYS checked: key -> {concurrency, rate, per, weight}, each positive; frozen."""
    label = "DURABLE_JOBS['FLOW_KEYS']"
    if raw is None:
        return MappingProxyType({})
    # Any mapping: a setting rebuilt from the loaded one (tests' overrides, a settings
    # module that copies another) carries the frozen MappingProxyType this returns.
    if not isinstance(raw, Mapping):
        raise ConfigurationError(f"{label} must be a dict of flow key -> limits")
    checked = {}
    for key, limits in raw.items():
        where = f"{label}[{key!r}]"
        if not isinstance(key, str) or not 1 <= len(key) <= 200:
            raise ConfigurationError(f"{where}: a flow key is a string of 1-200 characters")
        if not isinstance(limits, Mapping) or set(limits) - set(_FLOW_FIELDS):
            raise ConfigurationError(f"{where} must be a dict of {', '.join(_FLOW_FIELDS)}")
        for name in ("concurrency", "rate"):
            if limits.get(name) is not None:
                positive_int(f"{where}[{name!r}]", limits[name])
        for name in ("per", "weight"):
            value = limits.get(name)
            if value is not None and (
                isinstance(value, bool)
                or not isinstance(value, (int, float))
                or not math.isfinite(value)
                or value <= 0
            ):
                raise ConfigurationError(
                    f"{where}[{name!r}] must be a positive number, got {value!r}"
                )
        checked[key] = MappingProxyType(dict(limits))
    return MappingProxyType(checked)


def positive_int(label: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigurationError(f"{label} must be a positive integer, got {value!r}")
    return value


def load(raw: Any) -> Settings:
    """Validate a ``DURABLE_JOBS`` dict; unknown keys are refused with a suggestion."""
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise ConfigurationError(f"DURABLE_JOBS must be a dict, got {type(raw).__name__}")
    unknown = unknown_keys(raw)
    if unknown:
        raise ConfigurationError("\n".join(unknown))
    return Settings(**raw)


def unknown_keys(raw: dict) -> list[str]:
    """One message per key of ``raw`` that is no setting, naming the setting it most likely meant."""
    messages = []
    for key in raw:
        if key in _FIELD_NAMES:
            continue
        # Setting names are upper case: 'lease_ttl' means LEASE_TTL as surely as 'LEASE_TT' does.
        close = difflib.get_close_matches(str(key).upper(), _FIELD_NAMES, n=1)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        messages.append(f"DURABLE_JOBS has an unknown key {key!r}{hint}")
    return messages


_cache: tuple[object, Settings] | None = None

#: Where ``django.conf.settings`` keeps each setting it has read. It empties it in place on
#: every change (``override_settings``, an assignment, a deletion), so a value found there
#: is the one ``getattr`` would return, without ``LazyObject.__getattribute__``: most of
#: what this function cost, and it runs several times a slice (issue #27).
_READ: dict[str, Any] = object.__getattribute__(django_settings, "__dict__")
_UNREAD = object()


def get() -> Settings:
    """Return the current settings (re-read when ``settings.DURABLE_JOBS`` is replaced)."""
    global _cache
    raw = _READ.get("DURABLE_JOBS", _UNREAD)
    if raw is _UNREAD:
        raw = getattr(django_settings, "DURABLE_JOBS", None)
    if _cache is None or _cache[0] is not raw:
        _cache = (raw, load(raw))
    return _cache[1]


def ms(seconds: float | timedelta) -> int:
    """Whole milliseconds of a duration: the only form of time that crosses into SQL."""
    if isinstance(seconds, timedelta):
        seconds = seconds.total_seconds()
    return max(0, round(seconds * 1000))


def undeclared_queue(queue: str, settings: Settings) -> str | None:
    """Why ``queue`` may not be used (``QUEUES`` is declared and lacks it), or None."""
    if settings.QUEUES is None or queue in settings.QUEUES:
        return None
    close = difflib.get_close_matches(queue, settings.QUEUES, n=1)
    hint = f"; did you mean {close[0]!r}?" if close else ""
    return f"{queue!r} is not a declared queue (DURABLE_JOBS['QUEUES']: {', '.join(settings.QUEUES)}){hint}"
