"""Prometheus export (``pip install durable-jobs[prometheus]``).

Two halves, because a job system lives in several processes:

* **Counters from the process that did the work** — ``install()`` registers a sink that
  turns ``durable_jobs.metrics`` events into ``durable_jobs_*`` counters and a slice
  duration histogram. A worker exposes them with ``durable_worker --metrics-port 9108``.
* **Gauges read from the database at scrape time** — ``metrics_view`` (mount it in your
  URLconf) reports the fleet-wide truth: jobs by kind and status, the pending backlog's
  oldest age, running jobs with expired leases, parked jobs by reason, paused queues. Any web process
  can serve it. A scrape costs the same at ten million finished rows as at ten: live and
  parked jobs are counted through partial indexes, finished ones come from the planner's
  statistics once the table is large (see ``durable_jobs.console.stats``). It answers a
  scraper sending ``Authorization: Bearer <DURABLE_JOBS['METRICS_TOKEN']>`` or a logged-in
  user with the ``durable_jobs.view_job`` permission, nobody else.

    # urls.py
    from durable_jobs.console.prometheus import metrics_view
    urlpatterns += [path("metrics/durable-jobs", metrics_view)]
"""

from __future__ import annotations

import hmac
import threading
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from durable_jobs import conf, metrics
from durable_jobs.console import stats

if TYPE_CHECKING:
    from django.http import HttpRequest, HttpResponse

_LABELS = {
    "jobs_started": ("kind",),
    "jobs_completed": ("kind",),
    "jobs_failed": ("kind",),
    "jobs_cancelled": ("kind",),
    "jobs_parked": ("kind", "reason"),
    "orphans_taken": ("kind",),
    "slices": ("kind", "outcome"),
    "schedule_ticks_started": ("schedule",),
    "schedule_ticks_missed": ("schedule",),
}


class PrometheusSink:
    """A ``durable_jobs.metrics`` sink backed by prometheus_client metrics in ``registry``."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.counters = {
            name: Counter(
                f"durable_jobs_{name}",
                f"durable_jobs {name.replace('_', ' ')}",
                labels,
                registry=registry,
            )
            for name, labels in _LABELS.items()
        }
        self.slice_seconds = Histogram(
            "durable_jobs_slice_seconds",
            "Wall time of one slice",
            ("kind", "outcome"),
            registry=registry,
            buckets=(0.005, 0.02, 0.1, 0.5, 1, 5, 30, 120, 600, float("inf")),
        )
        self.stale_pending = Gauge(
            "durable_jobs_stale_pending",
            "Pending jobs due longer than PENDING_TTL",
            registry=registry,
        )

    def __call__(self, kind: str, name: str, value: float, labels: dict[str, str]) -> None:
        if kind == "counter" and name in self.counters:
            wanted = _LABELS[name]
            self.counters[name].labels(*(labels.get(label, "") for label in wanted)).inc(value)
        elif kind == "observe" and name == "slice_seconds":
            self.slice_seconds.labels(labels.get("kind", ""), labels.get("outcome", "")).observe(
                value
            )
        elif kind == "gauge" and name == "stale_pending":
            self.stale_pending.set(value)


class DatabaseCollector:
    """Gauges computed from the job table when scraped (database clock)."""

    def collect(self) -> Iterator[Metric]:
        data = stats.collect()
        jobs = GaugeMetricFamily(
            "durable_jobs_jobs", "Jobs by kind and status", labels=["kind", "status"]
        )
        for kind, counts in data["by_kind"].items():
            for status, n in counts.items():
                jobs.add_metric([kind, status], n)
        yield jobs
        yield GaugeMetricFamily(
            "durable_jobs_oldest_pending_seconds",
            "Age of the oldest pending job",
            value=data["oldest_pending_seconds"] or 0.0,
        )
        oldest = data["oldest_transaction"]
        yield GaugeMetricFamily(
            "durable_jobs_oldest_transaction_seconds",
            "Age of the database's oldest open transaction (it pins what vacuum may remove)",
            value=float(oldest["age_seconds"]) if oldest else 0.0,
        )
        yield GaugeMetricFamily(
            "durable_jobs_running_expired_leases",
            "Running jobs whose lease expired",
            value=data["running_expired_leases"],
        )
        parked = GaugeMetricFamily(
            "durable_jobs_parked", "Parked jobs by reason", labels=["reason"]
        )
        for reason, n in data["parked_by_reason"].items():
            parked.add_metric([reason or ""], n)
        yield parked
        # Invariant 27: 1 for a paused queue, 0 for every other known queue.
        paused = GaugeMetricFamily(
            "durable_jobs_queue_paused",
            "1 while the queue is paused (no worker claims from it)",
            labels=["queue"],
        )
        backlog = GaugeMetricFamily(
            "durable_jobs_queue_backlog",
            "Jobs waiting to be claimed, by queue (due now or later)",
            labels=["queue"],
        )
        for queue in stats.queues():
            paused.add_metric([queue["queue"]], 1.0 if queue["paused"] else 0.0)
            backlog.add_metric([queue["queue"]], queue["backlog"])
        yield paused
        yield backlog
        # Invariant 26: each flow key's permits in use, its limit and its waiting jobs.
        running = GaugeMetricFamily(
            "durable_jobs_flow_running", "Jobs holding a flow key's permits", labels=["key"]
        )
        limit = GaugeMetricFamily(
            "durable_jobs_flow_limit", "A flow key's concurrency limit in force", labels=["key"]
        )
        waiting = GaugeMetricFamily(
            "durable_jobs_flow_waiting", "A flow key's jobs waiting to be claimed", labels=["key"]
        )
        for key, figures in data["flow_keys"].items():
            running.add_metric([key], figures["running"])
            waiting.add_metric([key], figures["waiting"])
            if figures["concurrency"] is not None:
                limit.add_metric([key], figures["concurrency"])
        yield running
        yield limit
        yield waiting
        yield from _transport_gauges(data["transports"])


def _transport_gauges(found: list[dict[str, Any]]) -> Iterator[Metric]:
    """Each broker queue's health (docs/transports.rst): reachable, backlog, delayed,
    unacked and the oldest message's age; a figure the broker cannot give is left out."""
    labels = ["transport", "queue"]
    families = {
        "reachable": GaugeMetricFamily(
            "durable_jobs_broker_up", "1 when the queue's broker answers", labels=labels
        ),
        "backlog": GaugeMetricFamily(
            "durable_jobs_broker_backlog", "Messages deliverable now", labels=labels
        ),
        "delayed": GaugeMetricFamily(
            "durable_jobs_broker_delayed", "Messages scheduled for later", labels=labels
        ),
        "unacked": GaugeMetricFamily(
            "durable_jobs_broker_unacked", "Messages taken and not yet acked", labels=labels
        ),
        "oldest_age": GaugeMetricFamily(
            "durable_jobs_broker_oldest_message_seconds",
            "Age of the oldest deliverable message",
            labels=labels,
        ),
    }
    for queue in found:
        for field, family in families.items():
            value = queue[field]
            if value is not None:
                family.add_metric([queue["transport"], queue["queue"]], float(value))
    yield from families.values()


_lock = threading.Lock()
_installed: tuple[CollectorRegistry, PrometheusSink] | None = None


def install(registry: CollectorRegistry | None = None) -> CollectorRegistry:
    """Start counting this process's events; return the registry holding the counters."""
    global _installed
    with _lock:
        if _installed is None:
            registry = registry or CollectorRegistry()
            sink = PrometheusSink(registry)
            metrics.add_sink(sink)
            _installed = (registry, sink)
        return _installed[0]


def allowed(request: HttpRequest) -> bool:
    """True for the configured bearer token or a user allowed to view jobs."""
    token = conf.get().METRICS_TOKEN
    header = request.headers.get("Authorization", "")
    if token is not None and header.startswith("Bearer "):
        return hmac.compare_digest(header[len("Bearer ") :].encode(), token.encode())
    user = getattr(request, "user", None)
    return bool(
        user is not None and user.is_authenticated and user.has_perm("durable_jobs.view_job")
    )


def metrics_view(request: HttpRequest) -> HttpResponse:
    """Serve the database gauges plus this process's counters in the Prometheus text format."""
    from django.http import HttpResponse

    if not allowed(request):
        response = HttpResponse(
            "authentication required: a bearer token or the durable_jobs.view_job permission\n",
            status=401,
            content_type="text/plain",
        )
        response["WWW-Authenticate"] = 'Bearer realm="durable_jobs metrics"'
        return response
    registry = CollectorRegistry()
    registry.register(DatabaseCollector())
    body = generate_latest(registry)
    if _installed is not None:
        body += generate_latest(_installed[0])
    return HttpResponse(body, content_type=CONTENT_TYPE_LATEST)


def serve(port: int, addr: str = "127.0.0.1") -> None:
    """Expose this process's counters on ``addr:port`` (for worker processes)."""
    from prometheus_client import start_http_server

    start_http_server(port, addr=addr, registry=install())
