"""Start the inference server for one arm, detached, logging to a file; the exact command is recorded."""
from __future__ import annotations

from dataclasses import dataclass

from prefect import task
from prefect.cache_policies import NO_CACHE

from infra import shm
from infra.config import SpecdiagError
from infra.arms import ServerPlan
from infra.executor import Executor, Launched
from infra.registry import remember


@dataclass(frozen=True)
class Server:
    arm: str
    process: Launched
    base_url: str
    executor: Executor
    shm_before: frozenset[str] = frozenset()  # /dev/shm names that existed before it started


@task(name="launch", cache_policy=NO_CACHE)
def launch_server(plan: ServerPlan, executor: Executor) -> Server:
    if not executor.port_free(plan.port):
        raise SpecdiagError(
            f"port {plan.port} on {executor.host} is already in use: stop what holds it "
            f"(e.g. `fuser -k {plan.port}/tcp`) or pick another with --port")
    shm_before = frozenset(shm.listing(executor))
    process = executor.launch(plan.argv, plan.env, plan.log_path)
    remember(process.pid, process.pgid, plan.arm, executor.host, process.command, plan.port, sorted(shm_before))
    print(f"[{plan.arm}] launched pid {process.pid}: {process.command}")
    return Server(plan.arm, process, executor.base_url(plan.port), executor, shm_before)
