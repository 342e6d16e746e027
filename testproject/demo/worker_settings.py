"""Settings of the workers ``manage.py durable_demo`` starts: the demo's own, leases shortened.

The demo kills its worker with SIGKILL and waits for the new worker to take the job over.
That takes the lease running out (``LEASE_TTL``), the orphan grace after it
(``ORPHAN_GRACE``) and a reconciler pass (``RECONCILE_INTERVAL``), led by a worker whose
leadership outlived the dead one's. The defaults (60 s, 30 s, 5 s) suit production and
make a demo of several minutes, so the demo starts its workers with this module and the
four values as ``DURABLE_JOBS_<NAME>`` environment variables (the command sets them, unless
they are set already). Everything else comes from the settings module the demo itself
runs under, named in ``DURABLE_DEMO_BASE_SETTINGS``.
"""

from __future__ import annotations

import importlib
import os

#: The environment variable naming the settings module these settings extend.
BASE_ENV = "DURABLE_DEMO_BASE_SETTINGS"
#: The DURABLE_JOBS keys read from ``DURABLE_JOBS_<NAME>``, in seconds.
LEASE_SETTINGS = ("LEASE_TTL", "HEARTBEAT_INTERVAL", "ORPHAN_GRACE", "RECONCILE_INTERVAL")

_base_name = os.environ.get(BASE_ENV) or "testproject.settings"
if _base_name == __name__:  # the demo itself was run with these: extend the project's own
    _base_name = "testproject.settings"
_base = importlib.import_module(_base_name)
globals().update({name: value for name, value in vars(_base).items() if name.isupper()})

DURABLE_JOBS = {
    **_base.DURABLE_JOBS,
    **{
        name: float(os.environ[f"DURABLE_JOBS_{name}"])
        for name in LEASE_SETTINGS
        if os.environ.get(f"DURABLE_JOBS_{name}")
    },
}
