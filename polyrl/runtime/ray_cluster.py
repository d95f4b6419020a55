"""The Ray cluster that in-run actors (rollout workers, remote reward modules) live on.

Inside ``polyrl submit`` (or after the caller's own ``ray.init``) Ray is already connected and the
actors join that cluster. Otherwise the first user starts a local one, bound to 127.0.0.1 like
every polyrl server (or attaches to ``RAY_ADDRESS``), and the last user to release it shuts it
down: a run leaves no Ray processes behind. Worker output goes to Ray's session log folder, not
to the terminal (``log_to_driver=False``); errors still reach the driver as exceptions.
"""

from __future__ import annotations

import os
import threading
from typing import Any

_lock = threading.Lock()
_users = 0  # acquire_ray calls not yet released, counted only for a cluster started here
_started_here = False


def acquire_ray() -> Any:
    """The ``ray`` module, connected; starts a local cluster if none is connected. Pair every
    call with :func:`release_ray`."""
    global _users, _started_here
    import ray

    with _lock:
        if not ray.is_initialized():
            local_only = {} if os.environ.get("RAY_ADDRESS") else {"_node_ip_address": "127.0.0.1"}
            ray.init(include_dashboard=False, log_to_driver=False, logging_level="ERROR", **local_only)
            _started_here, _users = True, 0
        if _started_here:
            _users += 1
    return ray


def release_ray() -> None:
    """One user is done; the last user of a cluster started by :func:`acquire_ray` shuts it down."""
    global _users, _started_here
    import ray

    with _lock:
        if not _started_here:
            return
        _users -= 1
        if _users <= 0:
            _started_here, _users = False, 0
            if ray.is_initialized():
                ray.shutdown()
