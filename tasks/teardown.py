"""Stop the server and every process it forked; verify none is left."""
from __future__ import annotations

from prefect import task
from prefect.cache_policies import NO_CACHE

from infra.config import SpecdiagError
from infra.registry import forget
from tasks.launch import Server


@task(name="teardown", cache_policy=NO_CACHE)
def teardown(server: Server) -> None:
    left = server.executor.stop_group(server.process.pgid)
    if left:
        raise SpecdiagError(f"[{server.arm}] could not stop PIDs {left} of server group {server.process.pgid}")
    forget(server.process.pid, server.executor.host)
    print(f"[{server.arm}] server {server.process.pid} stopped")
