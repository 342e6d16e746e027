"""Deprecated path: the Prometheus exporter moved to ``durable_jobs.console.prometheus``.

Kept for one release so that URLconfs naming ``durable_jobs.prometheus.metrics_view`` keep
working; importing it warns.
"""

from __future__ import annotations

import warnings

from durable_jobs.console.prometheus import (  # noqa: F401
    DatabaseCollector,
    PrometheusSink,
    allowed,
    install,
    metrics_view,
    serve,
)

warnings.warn(
    "durable_jobs.prometheus is deprecated; import durable_jobs.console.prometheus instead",
    DeprecationWarning,
    stacklevel=2,
)
