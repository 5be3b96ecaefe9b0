"""The host name a fleet process reports to Airflow (``[core] hostname_callable``).

dev/fleet.sh runs its Celery workers on one machine; a worker's task would otherwise record the
machine's name (``socket.getfqdn()``) as ``ti.hostname``, and two workers would look like one.
Each fleet process has ``FLEET_WORKER_NAME`` (``control``, ``worker-1``, ...) in its environment.
"""

from __future__ import annotations

import os
import socket


def worker_hostname() -> str:
    return os.environ.get("FLEET_WORKER_NAME") or socket.getfqdn()
