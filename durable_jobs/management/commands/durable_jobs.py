"""``manage.py durable_jobs list|show|cancel|redrive|stats``: see and steer jobs without SQL.

Human output by default, ``--json`` for scripts. Every action goes through the same
service functions as code and the admin. Exit status: 0 done, 1 refused or not found
(with the reason on stderr), 2 bad arguments.
"""

from __future__ import annotations

import json
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from durable_jobs import conf, service, stats
from durable_jobs.exceptions import DurableJobsError
from durable_jobs.models import Job
from durable_jobs.states import Scope, Status
from durable_jobs.validation import NAME

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


def progress_bar(job: Job) -> str:
    if not job.total_count:
        return f"{job.processed_count} processed (total unknown)"
    fraction = job.progress or 0.0
    filled = int(round(BAR * fraction))
    return f"[{'#' * filled}{'.' * (BAR - filled)}] {job.processed_count}/{job.total_count} ({fraction:.0%})"


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


class Command(BaseCommand):
    help = "List, inspect, cancel and re-drive durable jobs; print queue statistics."

    def add_arguments(self, parser: CommandParser) -> None:
        sub = parser.add_subparsers(dest="action", required=True)

        def scoped(p: CommandParser) -> None:
            p.add_argument("--tenant", type=name, default=None, help="tenant id (default: DEFAULT_TENANT)")
            p.add_argument("--organization", type=name, default=None, help="organization id (default: tenant-wide)")
            p.add_argument("--json", action="store_true", help="machine-readable output")

        p = sub.add_parser("list", help="list jobs, newest first")
        scoped(p)
        p.add_argument("--kind", type=name)
        p.add_argument("--status", type=status)
        p.add_argument("--subject", type=subject, help="TYPE:ID")
        p.add_argument("--page", type=int, default=1)
        p.add_argument("--page-size", type=int, default=50)

        for action, helptext in (("show", "print one job in full"), ("cancel", "request cancellation"),
                                 ("redrive", "re-drive a failed job")):
            p = sub.add_parser(action, help=helptext)
            scoped(p)
            p.add_argument("job_id")
            if action == "cancel":
                p.add_argument("--by", default="cli", help="who asks (recorded on the job)")
            if action == "redrive":
                p.add_argument("--force", action="store_true", help="also re-drive an unrecoverable failure")

        p = sub.add_parser("stats", help="counts, backlog age, expired leases, parked jobs, throughput")
        p.add_argument("--tenant", type=name, default=None, help="only this tenant (default: all)")
        p.add_argument("--json", action="store_true")

    def handle(self, *args, action: str, **options) -> None:
        try:
            getattr(self, f"do_{action}")(**options)
        except DurableJobsError as error:
            raise CommandError(str(error)) from None

    def _scope(self, options) -> Scope:
        tenant = options["tenant"] or conf.get().DEFAULT_TENANT
        return service.scope_of((tenant, options["organization"]))

    def _emit(self, options, data: Any, human: str) -> None:
        self.stdout.write(json.dumps(data, indent=2, default=str) if options["json"] else human)

    def do_list(self, **options) -> None:
        jobs, total = service.list_jobs(
            scope=self._scope(options), kind=options["kind"], status=options["status"],
            subject=options["subject"], page=options["page"], page_size=options["page_size"],
        )
        if options["json"]:
            self._emit(options, {"total": total, "jobs": [as_dict(job) for job in jobs]}, "")
            return
        lines = [f"{'id':<36}  {'kind':<24} {'status':<10} {'progress':<14} {'created':<20} error"]
        for job in jobs:
            progress = f"{job.processed_count}/{job.total_count}" if job.total_count else str(job.processed_count)
            lines.append(
                f"{job.id!s:<36}  {job.kind:<24} {job.status:<10} {progress:<14} "
                f"{job.created_at:%Y-%m-%d %H:%M:%S}  {job.error_code or ''}"
            )
        lines.append(f"{len(jobs)} of {total} job(s)")
        self.stdout.write("\n".join(lines))

    def do_show(self, **options) -> None:
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

    def do_cancel(self, **options) -> None:
        job = service.cancel(options["job_id"], scope=self._scope(options), by=options["by"])
        self._emit(options, as_dict(job), f"cancellation requested for {job.id} ({job.status}); "
                                          "a running slice stops at its next heartbeat")

    def do_redrive(self, **options) -> None:
        job = service.redrive(options["job_id"], scope=self._scope(options), force=options["force"])
        self._emit(options, as_dict(job), f"re-driven {job.id}: pending again (redrive #{job.redrives})")

    def do_stats(self, **options) -> None:
        data = stats.collect(tenant=options["tenant"])
        if options["json"]:
            self._emit(options, data, "")
            return
        statuses = [s.value for s in Status]
        lines = [f"{'kind':<28}" + "".join(f"{s:>11}" for s in statuses)]
        for kind, counts in data["by_kind"].items():
            lines.append(f"{kind:<28}" + "".join(f"{counts.get(s, 0):>11}" for s in statuses))
        oldest = data["oldest_pending_seconds"]
        lines += [
            "",
            f"pending: {data['pending']} (oldest {'-' if oldest is None else f'{oldest:.1f}s'})",
            f"running: {data['running']} ({data['running_expired_leases']} with expired leases, "
            f"{data['retrying']} waiting for a retry)",
            "parked: " + (", ".join(f"{reason} {n}" for reason, n in data["parked_by_reason"].items()) or "none"),
            "finished: " + "; ".join(
                f"last {window}: {c['completed']} completed, {c['failed']} failed, {c['cancelled']} cancelled"
                for window, c in data["finished_last"].items()
            ),
        ]
        self.stdout.write("\n".join(lines))
