"""The gate: at pickup, before the handler's first slice, does the job's wait hold it?

The executor calls ``run`` for a claimed job whose wait has not cleared. The tiers are
answered cheapest first:

1. **Unreadable** conditions (stored by something newer, older or hand-written) fail the
   job ``wait_unreadable`` (invariant 19): never treated as cleared.
2. **``after``**, from the database clock alone (the claim's own ``clock_timestamp()``):
   not yet due means one exact reschedule to the instant; nothing is polled, no check
   runs, no budget is spent (invariant 16).
3. **Profiles**, in the order written, each a contained process (``checks``): all "go"
   clears the wait; the first "not yet" holds the job until the next check by the
   backoff rule (invariant 17); "cannot tell" counts a consecutive fault and holds
   (``wait_faults_exhausted`` past WAIT_MAX_FAULTS); "never" fails ``wait_never``. A
   hold past WAIT_MAX_HOLD fails ``wait_max_hold`` before anything else runs.

A held job goes back to ``pending`` without a lease: it costs no slot and no lease
while it waits, and a cancel request ends it through the reconciler's pending-cancel
path at its next pass, never at its next check. The gate writes through the store's
wait statements (fenced on the claim) and never records a terminal state itself: it
returns a ``Verdict`` and the executor records failures with the kind's mirror.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
from datetime import datetime
from typing import TYPE_CHECKING

from django.db import DEFAULT_DB_ALIAS

from durable_jobs import conf, db, store, validation
from durable_jobs.exceptions import ConfigurationError
from durable_jobs.states import (
    WAIT_FAULTS_EXHAUSTED,
    WAIT_MAX_HOLD,
    WAIT_NEVER,
    WAIT_UNREADABLE,
    Lease,
)
from durable_jobs.waits import backoff, checks, grammar

if TYPE_CHECKING:
    from durable_jobs.models import Job

log = logging.getLogger("durable_jobs.waits")

#: Consecutive denied pickups after which each further denial is logged as starvation.
DENIALS_WORTH_A_WARNING = 10


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Verdict:
    """What the gate decided for one pickup."""

    end: str  # run | held | failed | lease_lost
    job: Job | None = None  # run: the row with its wait cleared
    code: str | None = None  # failed: one of states.WAIT_ERROR_CODES
    message: str | None = None  # failed: plain words, only validated bytes
    recheck_in: float | None = None  # held: seconds until the job is due again (database clock)


class CheckSlots:
    """How many checks one worker process may run at once (WAIT_MAX_CONCURRENT_CHECKS).

    A pickup that finds no free slot does not wait for one (that would hold a worker slot
    hostage to somebody else's check): it holds the job again shortly and counts the
    denial on the row, where an operator can see the starvation.
    """

    def __init__(self, size: int) -> None:
        # The worker builds its slots at boot: a WAIT_CHECK_USER it cannot switch to
        # stops it there, naming why, instead of failing every check later.
        user = conf.get().WAIT_CHECK_USER
        refused = None if user is None else checks.user_refusal(user)
        if refused is not None:
            raise ConfigurationError(refused)
        self.size = size
        self._free = threading.BoundedSemaphore(size)

    def try_take(self) -> bool:
        return self._free.acquire(blocking=False)

    def give_back(self) -> None:
        self._free.release()


_process_slots: CheckSlots | None = None
_process_slots_lock = threading.Lock()


def default_slots() -> CheckSlots:
    """This process's check slots, for callers that bring none (the testing helpers)."""
    global _process_slots
    with _process_slots_lock:
        size = conf.get().WAIT_MAX_CONCURRENT_CHECKS
        if _process_slots is None or _process_slots.size != size:
            _process_slots = CheckSlots(size)
        return _process_slots


def pending(job: Job) -> bool:
    """True when ``job`` carries a wait that has not cleared: the gate must run before its first slice."""
    return grammar.armed(job.wait_for) and job.wait_satisfied_at is None


def run(
    job: Job,
    lease: Lease,
    *,
    slots: CheckSlots | None = None,
    stopping: threading.Event | None = None,
    using: str = DEFAULT_DB_ALIAS,
) -> Verdict:
    """Decide whether the claimed ``job`` may run now, and write the hold if not."""
    settings = conf.get()
    bad = grammar.unreadable(job.wait_for)
    if bad:
        return Verdict(
            end="failed",
            code=WAIT_UNREADABLE,
            message=(
                f"wait_for holds {len(bad)} condition(s) this version cannot read; the job was not run as if they "
                "had cleared. Start it again with conditions this version understands ('after', 'profile')"
            ),
        )
    if job.wait_key is not None and not validation.is_wait_key(job.wait_key):
        # Stored before the wait-key grammar, or by hand: it would reach a check's
        # environment (and whatever URL or path the check builds) unvalidated.
        return Verdict(
            end="failed",
            code=WAIT_UNREADABLE,
            message=(
                "its wait_key does not match the wait-key grammar, so it is not handed to a check; "
                f"start the job again with a wait_key that {validation.WAIT_KEY_RULE.removeprefix('must ')}"
            ),
        )
    # The database's clock, read now (invariant 2): not the claim's stamp, which a claim
    # that waited its turn in a slot's batch would have left behind.
    now: datetime = db.database_now(using=using)
    instant = grammar.after_instant(job.wait_for)
    if instant is not None and instant > now:
        return _held(
            store.hold_job(lease, until=instant, using=using), (instant - now).total_seconds(), job
        )
    names = grammar.profile_names(job.wait_for)
    if not names:
        return _cleared(store.satisfy_wait(lease, checks=0, using=using))
    # The polling clock starts when checking could first begin: the hold's start, or the
    # instant when an `after` came first, so a long `after` does not eat the check budget.
    began = job.held_since or now
    if instant is not None and instant > began:
        began = instant
    polled_for = max(0.0, (now - began).total_seconds())
    if polled_for > settings.WAIT_MAX_HOLD:
        return Verdict(
            end="failed",
            code=WAIT_MAX_HOLD,
            message=(
                f"still not clear after {polled_for:.0f}s of checks ({job.wait_checks} runs); the limit is "
                f"{settings.WAIT_MAX_HOLD:g}s (DURABLE_JOBS['WAIT_MAX_HOLD'])"
            ),
        )
    slots = slots or default_slots()
    if not slots.try_take():
        row = store.hold_job(
            lease, delay_ms=conf.ms(settings.WAIT_DENIED_RECHECK), denied=True, using=using
        )
        if row is not None and row.wait_denials >= DENIALS_WORTH_A_WARNING:
            log.warning(
                "[%s %s] denied a check turn %d times in a row: checks need more than "
                "WAIT_MAX_CONCURRENT_CHECKS=%d on this worker",
                job.kind,
                job.id,
                row.wait_denials,
                slots.size,
            )
        return _held(row, settings.WAIT_DENIED_RECHECK, job)
    try:
        ran, last, name = _run_checks(job, names, stopping)
    finally:
        slots.give_back()
    return _answer(job, lease, ran, last, name, polled_for, using)


def _run_checks(
    job: Job, names: list[str], stopping: threading.Event | None
) -> tuple[int, checks.CheckAnswer, str]:
    """Run the profiles in order until one does not say "go"; return (runs, last answer, its profile)."""
    settings = conf.get()
    ran = 0
    answer = checks.CheckAnswer(answer=checks.GO, detail="no checks")
    name = names[0]
    for name in names:
        path = settings.WAIT_PROFILES.get(name)
        if path is None:
            # Declared where the job was started, not here (a rolling deploy): this worker
            # cannot answer, another may. A fault, like an unknown kind's transient failure.
            answer = checks.CheckAnswer(
                answer=checks.CANNOT_TELL, detail="the profile is not declared on this worker"
            )
            break
        env = checks.environment(
            job_id=job.id,
            kind=job.kind,
            profile=name,
            tenant=job.tenant_id,
            organization=job.organization_id,
            wait_key=job.wait_key,
            checks_so_far=job.wait_checks + ran,
        )
        answer = checks.run(
            path,
            env=env,
            timeout=settings.WAIT_CHECK_TIMEOUT,
            output_cap=settings.WAIT_CHECK_OUTPUT_CAP,
            stop=stopping,
            user=settings.WAIT_CHECK_USER,
        )
        if answer.answer == checks.INTERRUPTED:
            break
        ran += 1
        if answer.answer != checks.GO:
            break
    return ran, answer, name


def _answer(
    job: Job,
    lease: Lease,
    ran: int,
    last: checks.CheckAnswer,
    name: str,
    polled_for: float,
    using: str,
) -> Verdict:
    settings = conf.get()
    if last.answer == checks.GO:
        return _cleared(store.satisfy_wait(lease, checks=ran, using=using))
    if last.answer == checks.INTERRUPTED:
        # The worker is stopping: the check never answered, so nothing is charged and the
        # job is due again at once for whichever worker is next.
        return _held(store.hold_job(lease, delay_ms=0, checks=ran, using=using), 0.0, job)
    delay = backoff.next_check_in(
        settings.WAIT_CHECK_INTERVAL,
        polled_for,
        floor=settings.WAIT_CHECK_INTERVAL_FLOOR,
        ceiling=settings.WAIT_CHECK_INTERVAL_CEILING,
    )
    if last.answer == checks.NOT_YET:
        row = store.hold_job(
            lease, delay_ms=conf.ms(delay), checks=ran, reset_faults=True, using=using
        )
        return _held(row, delay, job, why=f"{name} said not yet")
    if last.answer == checks.NEVER:
        if store.count_wait_checks(lease, checks=ran, using=using) is None:
            return Verdict(end="lease_lost")
        return Verdict(
            end="failed",
            code=WAIT_NEVER,
            message=f"the check {name!r} answered that the condition will never clear ({last.detail})",
        )
    counted = store.count_wait_fault(
        lease, checks=ran, max_faults=settings.WAIT_MAX_FAULTS, using=using
    )
    if counted is None:
        return Verdict(end="lease_lost")
    faults, exhausted = counted
    if exhausted:
        return Verdict(
            end="failed",
            code=WAIT_FAULTS_EXHAUSTED,
            message=(
                f"the check {name!r} could not answer {faults} times in a row (last: {last.detail}); the limit is "
                f"{settings.WAIT_MAX_FAULTS} (DURABLE_JOBS['WAIT_MAX_FAULTS'])"
            ),
        )
    row = store.hold_job(lease, delay_ms=conf.ms(delay), using=using)
    return _held(row, delay, job, why=f"{name} could not answer ({last.detail}), fault {faults}")


def _held(row: Job | None, recheck_in: float, job: Job, *, why: str | None = None) -> Verdict:
    if row is None:
        return Verdict(end="lease_lost")
    # Only validated bytes in this line (invariant 23): the label is rebuilt from the
    # grammar, the id is a UUID, the kind matched its pattern at start, `why` is ours.
    log.info(
        "[%s %s] held: waiting for %s%s; next check in %.1fs",
        job.kind,
        job.id,
        grammar.label(row.wait_for) or "-",
        f" ({why})" if why else "",
        recheck_in,
    )
    return Verdict(end="held", job=row, recheck_in=recheck_in)


def _cleared(row: Job | None) -> Verdict:
    if row is None:
        return Verdict(end="lease_lost")
    log.info("[%s %s] wait cleared: %s", row.kind, row.id, grammar.label(row.wait_for) or "-")
    return Verdict(end="run", job=row)
