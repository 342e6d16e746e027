"""Where durable_jobs' handler autodiscovery looks: the app's own handlers.

``durable_jobs.bulk_action`` (the admin's "act on all matching" as a durable job) lives in
``durable_jobs.console.bulk``.
"""

from durable_jobs.console import bulk as _bulk  # noqa: F401  (registers the handler)
