"""Stop the server and every process it forked; verify none is left; remove its /dev/shm leftovers."""
from __future__ import annotations

import os

from prefect import task
from prefect.cache_policies import NO_CACHE

from infra import registry, shm
from infra.config import SpecdiagError
from infra.executor import Executor
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


def stop_unreturned(executor: Executor, arm: str) -> None:
    """A server this process launched for ARM whose launch was interrupted before it was handed back (Ctrl-C
    between the start and the return): found by its registry entry and stopped all the same."""
    for entry in registry.launched(executor.host):
        if entry["owner_pid"] == os.getpid() and entry["arm"] == arm:
            executor.stop_group(entry["pgid"])
            forget(entry["pid"], executor.host)
