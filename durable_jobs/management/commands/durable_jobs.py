"""``manage.py durable_jobs list|show|explain|cancel|redrive|stats|queues|pause|resume|schedules|...``:
see and steer jobs, queues and schedules, no SQL.

Human output by default, ``--json`` (before or after the action) for scripts. Every
action goes through the same service functions as code and the admin. Exit status: 0
done, 1 refused or not found, 2 bad arguments; the reason goes to stderr, under
``--json`` as one JSON object ``{"error": ..., "code": ..., "exit_status": ...}``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import re
import sys
from datetime import datetime
from typing import Any, NoReturn

from django.core.management.base import BaseCommand, CommandError, CommandParser, SystemCheckError

from durable_jobs import conf, queues, service
from durable_jobs.console import stats, workers
from durable_jobs.exceptions import ConfigurationError, DurableJobsError, InvalidInput
from durable_jobs.limits import api as limits_api
from durable_jobs.limits.policy import Rate
from durable_jobs.management import preflight
from durable_jobs.models import Job
from durable_jobs.schedules import api as schedules
from durable_jobs.states import Scope, Status
from durable_jobs.transports import publishing
from durable_jobs.validation import NAME
from durable_jobs.waits.explain import explain_hold

BAR = 30
_ROW_FIELDS = [f.attname for f in Job._meta.concrete_fields]


def name(text: str) -> str:
    if not NAME.match(text):
        raise ValueError("letters, digits, _ . : - only")
    return text


def status(text: str) -> str:
    if text not in {s.value for s in Status}:
        raise ValueError(f"one of {', '.join(s.value for s in Status)}")
    return text


def subject(text: str) -> tuple[str, str]:
    kind, sep, ident = text.partition(":")
    if not sep or not kind or not ident:
        raise ValueError("TYPE:ID, e.g. reports.report:42")
    return kind, ident


def _when(iso: str) -> str:
    """An ISO instant from ``stats``' answer, as the other human lines show instants."""
    return f"{datetime.fromisoformat(iso):%Y-%m-%d %H:%M:%S %Z}"


def progress_bar(job: Job) -> str:
    if not job.total_count:
        return f"{job.processed_count} processed (total unknown)"
    fraction = job.progress or 0.0
    filled = round(BAR * fraction)
    return (
        f"[{'#' * filled}{'.' * (BAR - filled)}] "
        f"{job.processed_count}/{job.total_count} ({fraction:.0%})"
    )


def as_dict(job: Job) -> dict[str, Any]:
    out = {}
    for field in _ROW_FIELDS:
        value = getattr(job, field)
        if hasattr(value, "isoformat"):
            value = value.isoformat()
        elif field in ("id", "progress_job_id") and value is not None:
            value = str(value)
        out[field] = value
    return out


class Refused(CommandError):
    """A service refusal keeping a machine-readable code (``job_not_found``, ``wrong_state``...)."""

    def __init__(self, error: DurableJobsError) -> None:
        # A refused argument (not a job id, a page out of range) is a bad argument: exit 2.
        super().__init__(str(error), returncode=2 if isinstance(error, InvalidInput) else 1)
        self.code = re.sub(r"(?<!^)(?=[A-Z])", "_", type(error).__name__).lower()


class BadArguments(CommandError):
    code = "bad_arguments"

    def __init__(self, message: str) -> None:
        super().__init__(message, returncode=2)


class Command(BaseCommand):
    help = "List, inspect, cancel and re-drive durable jobs; print queue statistics."
    _json_errors = False  # set from the command line: report errors as JSON too

    def run_from_argv(self, argv: list[str]) -> None:
        self._json_errors = "--json" in argv[2:]
        super().run_from_argv(argv)

    def execute(self, *args: Any, **options: Any) -> str | None:
        try:
            return super().execute(*args, **options)
        except CommandError as error:
            if not self._json_errors or options.get("traceback"):
                raise
            code = getattr(
                error, "code", "system_check" if isinstance(error, SystemCheckError) else "error"
            )
            self._exit_json(str(error), code, error.returncode)

    def _exit_json(self, message: str, code: str, status: int) -> NoReturn:
        error = {"error": message, "code": code, "exit_status": status}
        self.stderr.write(json.dumps(error), style_func=lambda text: text)
        sys.exit(status)

    def _json_aware(self, parser: CommandParser) -> None:
        """Make ``parser`` report bad arguments as JSON (exit 2) when --json was asked for."""
        plain = parser.error

        def error(message: str) -> None:
            if self._json_errors and parser.called_from_command_line:
                self._exit_json(message, "bad_arguments", 2)
            plain(message)

        parser.error = error  # type: ignore[method-assign]

    def add_arguments(self, parser: CommandParser) -> None:
        # Before the action (``durable_jobs --json stats``) or after it (``stats --json``):
        # the action's own flag only overrides this one when it is given.
        parser.add_argument(
            "--json", action="store_true", help="machine-readable output and errors"
        )
        self._json_aware(parser)
        sub = parser.add_subparsers(dest="action", required=True)

        def scoped(p: CommandParser) -> None:
            self._json_aware(p)
            p.add_argument(
                "--tenant", type=name, default=None, help="tenant id (default: DEFAULT_TENANT)"
            )
            p.add_argument(
                "--organization",
                type=name,
                default=None,
                help="organization id (default: tenant-wide)",
            )
            p.add_argument(
                "--json",
                action="store_true",
                default=argparse.SUPPRESS,
                help="machine-readable output and errors",
            )

        p = sub.add_parser("list", help="list jobs, newest first")
        scoped(p)
        p.add_argument("--kind", type=name)
        p.add_argument("--status", type=status)
        p.add_argument("--subject", type=subject, help="TYPE:ID")
        p.add_argument("--page", type=int, default=1)
        p.add_argument("--page-size", type=int, default=50)

        for action, helptext in (
            ("show", "print one job in full"),
            ("cancel", "request cancellation of a job and every live job it spawned"),
            ("redrive", "re-drive a failed job"),
            (
                "explain",
                "every reason a job is not running (held, not due, paused, flow limits, workers)",
            ),
        ):
            p = sub.add_parser(action, help=helptext)
            scoped(p)
            p.add_argument("job_id")
            if action == "cancel":
                p.add_argument("--by", default="cli", help="who asks (recorded on the job)")
            if action == "redrive":
                p.add_argument(
                    "--force", action="store_true", help="also re-drive an unrecoverable failure"
                )

        p = sub.add_parser(
            "workers", help="the live worker processes, what each serves and runs now"
        )
        p.add_argument("--json", action="store_true", help="machine-readable output")

        p = sub.add_parser(
            "stats", help="counts, backlog age, expired leases, parked jobs, throughput"
        )
        scoped(p)
        p.add_argument(
            "--all-tenants",
            action="store_true",
            help="count every tenant's jobs (no --tenant/--organization)",
        )

        for action, helptext in (
            ("schedules", "every schedule: next and last run, last outcome, missed ticks"),
            ("schedule-pause", "stop a schedule firing until it is resumed"),
            ("schedule-resume", "let a paused schedule fire again from its next tick"),
            ("schedule-run", "start one run of a schedule now (its own key, never a tick's)"),
        ):
            p = sub.add_parser(action, help=helptext)
            self._json_aware(p)
            if action != "schedules":
                p.add_argument("schedule", type=name, help="the schedule's name")
            # As the other actions: before the action (--json schedules) or after it.
            p.add_argument(
                "--json",
                action="store_true",
                default=argparse.SUPPRESS,
                help="machine-readable output and errors",
            )
        self._add_queue_actions(sub)
        self._add_flow_actions(sub)

    def _json_parser(self, sub: Any, action: str, helptext: str) -> CommandParser:
        """A subcommand taking ``--json`` (after the action too), its errors JSON-aware."""
        p = sub.add_parser(action, help=helptext)
        self._json_aware(p)
        p.add_argument(
            "--json",
            action="store_true",
            default=argparse.SUPPRESS,
            help="machine-readable output and errors",
        )
        return p

    def _add_queue_actions(self, sub: Any) -> None:
        """``queues``, ``pause QUEUE``, ``resume QUEUE``: paused queues (invariant 27)."""
        for action, helptext in (
            ("queues", "every known queue: paused or not, its backlog, whether a worker serves it"),
            ("pause", "stop every worker from claiming from a queue (running slices go on)"),
            ("resume", "let workers claim from a paused queue again, waking idle ones"),
        ):
            p = self._json_parser(sub, action, helptext)
            if action != "queues":
                p.add_argument("queue", type=name)
            if action == "pause":
                p.add_argument("--reason", default=None, help="why (shown by stats and explain)")
                p.add_argument("--by", default="cli", help="who pauses (recorded with the pause)")

    def _add_flow_actions(self, sub: Any) -> None:
        """``limits`` and ``set-limit KEY``: flow keys and an operator's runtime limits (invariant 26)."""
        for action, helptext in (
            (
                "limits",
                "every flow key: its limits in force, permits held, starts in its window, waiting",
            ),
            ("set-limit", "set (or --clear) a flow key's limits, in force from the next claim"),
        ):
            p = self._json_parser(sub, action, helptext)
            if action == "set-limit":
                p.add_argument("key")
                p.add_argument(
                    "--concurrency", type=int, default=None, help="jobs at once (0 stops the key)"
                )
                p.add_argument(
                    "--rate", type=int, default=None, help="slice starts per --per seconds"
                )
                p.add_argument(
                    "--per", type=float, default=1.0, help="the rate's window in seconds"
                )
                p.add_argument("--weight", type=float, default=None, help="the key's fair share")
                p.add_argument(
                    "--clear",
                    action="append",
                    default=[],
                    choices=("concurrency", "rate", "weight"),
                    help="drop the operator's value (the settings' or the kind's applies again)",
                )
                p.add_argument("--by", default="cli", help="who changes it (recorded on the key)")

    def do_limits(self, **options: Any) -> None:
        keys = limits_api.flow_keys()
        if options["json"]:
            self._emit(options, [dataclasses.asdict(k) for k in keys], "")
            return
        lines = [f"{'flow key':<40} {'running':>12} {'rate window':>14} {'waiting':>8}  operator"]
        for k in keys:
            running = f"{k.running}/{'-' if k.concurrency is None else k.concurrency}"
            window = f"{k.recent_starts}/{'-' if k.rate is None else k.rate}"
            changed = (
                ""
                if k.changed_at is None
                else f"{k.changed_by or '-'} at {k.changed_at:%Y-%m-%d %H:%M:%S %Z}"
            )
            lines.append(f"{k.key:<40} {running:>12} {window:>14} {k.waiting:>8}  {changed}")
        self.stdout.write("\n".join(lines))

    def do_set_limit(self, **options: Any) -> None:
        rate = None
        if options["rate"] is not None:
            try:
                rate = Rate(limit=options["rate"], per=options["per"])
            except ConfigurationError as error:
                raise Refused(InvalidInput("rate", str(error))) from None
        limits_api.set_flow_limit(
            options["key"],
            concurrency=options["concurrency"],
            rate=rate,
            weight=options["weight"],
            clear=options["clear"],
            by=options["by"],
        )
        [state] = [k for k in limits_api.flow_keys() if k.key == options["key"]]
        self._emit(
            options,
            dataclasses.asdict(state),
            f"flow key {state.key}: concurrency {state.concurrency or 'unlimited'}, rate "
            f"{state.rate or 'unlimited'}; {state.running} running, {state.waiting} waiting; "
            "in force from the next claim",
        )

    def handle(self, *args: Any, action: str, **options: Any) -> None:
        problem = preflight.database_problem()
        if problem is not None:
            raise CommandError(problem)
        try:
            getattr(self, f"do_{action.replace('-', '_')}")(**options)
        except DurableJobsError as error:
            raise Refused(error) from None

    def _scope(self, options: dict[str, Any]) -> Scope:
        tenant = options["tenant"] or conf.get().DEFAULT_TENANT
        return service.scope_of((tenant, options["organization"]))

    def _emit(self, options: dict[str, Any], data: Any, human: str) -> None:
        self.stdout.write(json.dumps(data, indent=2, default=str) if options["json"] else human)

    def do_list(self, **options: Any) -> None:
        jobs, total = service.list_jobs(
            scope=self._scope(options),
            kind=options["kind"],
            status=options["status"],
            subject=options["subject"],
            page=options["page"],
            page_size=options["page_size"],
        )
        if options["json"]:
            self._emit(options, {"total": total, "jobs": [as_dict(job) for job in jobs]}, "")
            return
        lines = [f"{'id':<36}  {'kind':<24} {'status':<10} {'progress':<14} {'created':<20} error"]
        for job in jobs:
            progress = (
                f"{job.processed_count}/{job.total_count}"
                if job.total_count
                else str(job.processed_count)
            )
            lines.append(
                f"{job.id!s:<36}  {job.kind:<24} {job.status:<10} {progress:<14} "
                f"{job.created_at:%Y-%m-%d %H:%M:%S}  {job.error_code or ''}"
            )
        lines.append(f"{len(jobs)} of {total} job(s)")
        self.stdout.write("\n".join(lines))

    def do_show(self, **options: Any) -> None:
        job = service.get(options["job_id"], scope=self._scope(options))
        if options["json"]:
            self._emit(options, as_dict(job), "")
            return
        data = as_dict(job)
        width = max(len(k) for k in data)
        lines = [f"{job.kind} {job.id}: {job.status}", progress_bar(job), ""]
        for key, value in data.items():
            if isinstance(value, (dict, list)):
                value = json.dumps(value, indent=2).replace("\n", "\n" + " " * (width + 2))
            lines.append(f"{key:<{width}}  {value if value is not None else '-'}")
        self.stdout.write("\n".join(lines))

    def do_explain(self, **options: Any) -> None:
        job = service.get(options["job_id"], scope=self._scope(options))
        explanation = explain_hold(job)
        reasons = limits_api.explain(job)  # invariant 28: the one explainer
        pauses = {p.queue: p for p in queues.paused_queues()}
        if options["json"]:
            data = (
                None
                if explanation is None
                else {
                    field: (
                        value.isoformat()
                        if hasattr(value, "isoformat")
                        else value.total_seconds()
                        if hasattr(value, "total_seconds")
                        else list(value)
                        if isinstance(value, tuple)
                        else value
                    )
                    for field, value in (
                        (f.name, getattr(explanation, f.name))
                        for f in dataclasses.fields(explanation)
                    )
                }
            )
            paused = pauses.get(job.queue_name)
            self._emit(
                options,
                {
                    "id": str(job.id),
                    "status": job.status,
                    "reasons": [reason.as_dict() for reason in reasons],
                    "held": data,
                    "queue_paused": None if paused is None else dataclasses.asdict(paused),
                },
                "",
            )
            return
        if job.queue_name in pauses:  # invariant 27: nothing is claimed from it
            p = pauses[job.queue_name]
            self.stdout.write(
                f"queue {p.queue} is paused since {p.paused_at:%Y-%m-%d %H:%M:%S %Z} by "
                f"{p.paused_by or '-'}: {p.reason or 'no reason given'}"
            )
        state = "held" if explanation is not None else job.status
        lines = [f"{job.kind} {job.id}: {state}"]
        lines += [f"- [{reason.code}] {reason.sentence}" for reason in reasons]
        self.stdout.write("\n".join(lines))

    def do_cancel(self, **options: Any) -> None:
        job = service.cancel(options["job_id"], scope=self._scope(options), by=options["by"])
        self._emit(
            options,
            as_dict(job),
            f"cancellation requested for {job.id} ({job.status}) and every live job it "
            "spawned; a running slice stops at its next heartbeat",
        )

    def do_redrive(self, **options: Any) -> None:
        job = service.redrive(options["job_id"], scope=self._scope(options), force=options["force"])
        self._emit(
            options, as_dict(job), f"re-driven {job.id}: pending again (redrive #{job.redrives})"
        )

    def do_workers(self, **options: Any) -> None:
        live = workers.live_workers()
        if options["json"]:
            self._emit(options, [dataclasses.asdict(w) for w in live], "")
            return
        if not live:
            self.stdout.write("no live worker (none has beaten within LEASE_TTL)")
            return
        for w in live:
            running = ", ".join(f"{kind} x{n}" for kind, n in sorted(w.running.items())) or "idle"
            self.stdout.write(
                f"{w.identity}  version {w.version}, {w.slots} slot(s), {w.execution}; "
                f"queues {','.join(w.queues)}; {len(w.kinds)} kind(s); started "
                f"{w.started_at:%Y-%m-%d %H:%M:%S %Z}, beat {w.beat_at:%H:%M:%S}; running: {running}"
            )

    def do_stats(self, **options: Any) -> None:
        if options["all_tenants"]:
            if options["tenant"] or options["organization"]:
                raise BadArguments(
                    "--all-tenants counts every tenant; leave out --tenant and --organization"
                )
            scope, label = None, "all tenants"
        else:
            scope = self._scope(options)
            label = f"tenant {scope.tenant}, " + (
                f"organization {scope.organization}" if scope.organization else "tenant-wide jobs"
            )
        data = stats.collect(scope=scope)
        data["scope"] = (
            None if scope is None else {"tenant": scope.tenant, "organization": scope.organization}
        )
        if options["json"]:
            self._emit(options, data, "")
            return
        statuses = ["pending", "waiting", "running", "completed", "failed", "cancelled"]
        lines = [f"scope: {label}", f"{'kind':<28}" + "".join(f"{s:>11}" for s in statuses)]
        if data["estimated"]:
            lines.insert(
                1,
                "(a large table: completed, failed and cancelled are the planner's estimates "
                "as of the last ANALYZE; pending and running are exact)",
            )
        for kind, counts in data["by_kind"].items():
            lines.append(f"{kind:<28}" + "".join(f"{counts.get(s, 0):>11}" for s in statuses))
        oldest = data["oldest_pending_seconds"]
        lines += [
            "",
            f"pending: {data['pending']} (oldest {'-' if oldest is None else f'{oldest:.1f}s'})",
            f"running: {data['running']} ({data['running_expired_leases']} with expired leases)",
            (
                f"waiting: {data['waiting']} (claimed before, no lease now: "
                f"{data['retrying']} waiting out a retry backoff, the rest handed back)"
            ),
            f"held by a wait condition: {data['held']} (of the pending)",
            "no live worker can run: "
            + (
                ", ".join(f"{kind} ({n} jobs)" for kind, n in data["unserved_kinds"].items()) or "-"
            ),
            "paused queues: "
            + (
                "; ".join(
                    f"{queue} since {_when(p['paused_at'])} by {p['paused_by'] or '-'}: {p['reason'] or '-'}"
                    for queue, p in data["paused_queues"].items()
                )
                or "none"
            ),
            "flow keys: "
            + (
                "; ".join(
                    f"{key} {f['running']}/{f['concurrency'] if f['concurrency'] is not None else '-'} "
                    f"running, {f['waiting']} waiting"
                    for key, f in data["flow_keys"].items()
                )
                or "none"
            ),
            "parked: "
            + (
                ", ".join(f"{reason} {n}" for reason, n in data["parked_by_reason"].items())
                or "none"
            ),
            stats.describe_oldest_transaction(data["oldest_transaction"]),
            "finished: "
            + "; ".join(
                f"last {window}: {c['completed']} completed, {c['failed']} failed, "
                f"{c['cancelled']} cancelled"
                + (
                    " (estimated from the newest rows' rate)"
                    if window in data["finished_last_estimated"]
                    else ""
                )
                for window, c in data["finished_last"].items()
            ),
        ]
        if data["transports"]:
            lines += ["transports:"] + [
                "  " + publishing.describe(publishing.QueueHealth(**found))
                for found in data["transports"]
            ]
        self.stdout.write("\n".join(lines))

    def do_queues(self, **options: Any) -> None:
        known = stats.queues()
        if options["json"]:
            self._emit(options, known, "")
            return
        lines = [
            f"{'queue':<24} {'state':<8} {'backlog':>9} {'due':>9}  served  paused since, by: reason"
        ]
        for q in known:
            since = (
                ""
                if not q["paused"]
                else f"{q['paused_at']}, {q['paused_by'] or '-'}: {q['reason'] or '-'}"
            )
            lines.append(
                f"{q['queue']:<24} {'paused' if q['paused'] else 'running':<8} {q['backlog']:>9} "
                f"{q['due']:>9}  {'yes' if q['served_by_a_live_worker'] else 'no':<6}  {since}".rstrip()
            )
        self.stdout.write("\n".join(lines))

    def do_pause(self, **options: Any) -> None:
        pause = queues.pause_queue(options["queue"], reason=options["reason"], by=options["by"])
        data = dataclasses.asdict(pause)
        state = "paused" if pause.newly_paused else "already paused"
        self._emit(
            options,
            data,
            f"queue {pause.queue} {state} since {pause.paused_at:%Y-%m-%d %H:%M:%S %Z} by "
            f"{pause.paused_by or '-'}: {pause.reason or 'no reason given'}; running slices go on, "
            f"nothing is claimed from it until `durable_jobs resume {pause.queue}`",
        )

    def do_resume(self, **options: Any) -> None:
        ended = queues.resume_queue(options["queue"])
        data = {"queue": options["queue"], "resumed": ended is not None}
        self._emit(
            options,
            data,
            f"queue {options['queue']} resumed: idle workers were woken"
            if ended is not None
            else f"queue {options['queue']} was not paused: nothing changed",
        )

    def do_schedules(self, **options: Any) -> None:
        views = schedules.list_schedules()
        if options["json"]:
            self._emit(options, [view.as_dict() for view in views], "")
            return
        if not views:
            self.stdout.write("no schedules (they are written when a worker starts)")
            return
        lines = [
            f"{'name':<28} {'state':<8} {'cron':<16} {'zone':<18} {'next run (UTC)':<20} "
            f"{'last run (UTC)':<20} {'last outcome':<12} missed"
        ]
        for view in views:
            lines.append(
                f"{view.name:<28} {view.state:<8} {view.expression:<16} {view.zone:<18} "
                f"{_at(view.next_tick_at):<20} {_at(view.last_tick_at):<20} "
                f"{view.last_job_status or '-':<12} {view.missed_ticks}"
            )
        self.stdout.write("\n".join(lines))

    def do_schedule_pause(self, **options: Any) -> None:
        row = schedules.pause_schedule(options["schedule"])
        self._emit(options, _schedule_dict(row), f"schedule {row.name} paused")

    def do_schedule_resume(self, **options: Any) -> None:
        row = schedules.resume_schedule(options["schedule"])
        self._emit(
            options,
            _schedule_dict(row),
            f"schedule {row.name} resumed; next run {_at(row.next_tick_at)} UTC",
        )

    def do_schedule_run(self, **options: Any) -> None:
        job = schedules.run_schedule(options["schedule"])
        self._emit(options, as_dict(job), f"schedule {options['schedule']}: started job {job.id}")


def _at(instant: Any) -> str:
    return "-" if instant is None else f"{instant:%Y-%m-%d %H:%M:%S}"


def _schedule_dict(row: Any) -> dict[str, Any]:
    return {
        field.attname: (
            value.isoformat()
            if hasattr(value := getattr(row, field.attname), "isoformat")
            else str(value)
            if field.attname == "last_job_id" and value is not None
            else value
        )
        for field in row._meta.concrete_fields
    }
