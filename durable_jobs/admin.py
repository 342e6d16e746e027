"""Where Django's admin autodiscovery looks: the admin lives in ``durable_jobs.console``."""

from durable_jobs.console import admin as _console_admin  # noqa: F401  (registers JobAdmin)
from durable_jobs.console import admin_flow as _flow_admin  # noqa: F401  (FlowKeyAdmin)
from durable_jobs.console import admin_queues as _queues_admin  # noqa: F401  (PausedQueueAdmin)
from durable_jobs.console import admin_schedules as _schedules_admin  # noqa: F401  (ScheduleAdmin)
from durable_jobs.console import admin_workers as _workers_admin  # noqa: F401  (WorkerAdmin)
