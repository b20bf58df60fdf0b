"""Stop the server and every process it forked; verify none is left; remove its /dev/shm leftovers."""
from __future__ import annotations

from prefect import task
from prefect.cache_policies import NO_CACHE

from infra import shm
from infra.config import SpecdiagError
from infra.registry import forget
from tasks.launch import Server


@task(name="teardown", cache_policy=NO_CACHE)
def teardown(server: Server) -> int:
    """Returns how many /dev/shm files the server left behind and were removed."""
    left = server.executor.stop_group(server.process.pgid)
    if left:
        raise SpecdiagError(f"[{server.arm}] could not stop PIDs {left} of server group {server.process.pgid}")
    forget(server.process.pid, server.executor.host)
    removed = shm.remove_unused(server.executor, shm.listing(server.executor) - server.shm_before)
    print(f"[{server.arm}] server {server.process.pid} stopped" +
          (f"; removed its /dev/shm leftovers {removed}" if removed else ""))
    return len(removed)
