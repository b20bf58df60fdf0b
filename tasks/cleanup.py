"""Before an arm: stop stale servers this tool started, and verify the GPUs' memory is free."""
from __future__ import annotations

import time

from prefect import task
from prefect.cache_policies import NO_CACHE

from infra import gpu, registry
from infra.config import HostConfig, SpecdiagError
from infra.executor import Executor


@task(name="gpu-cleanup", cache_policy=NO_CACHE)
def cleanup(executor: Executor, host: HostConfig, timeout_s: float = 60.0) -> dict[str, float]:
    stopped = 0
    for entry in registry.launched(executor.host):
        if registry.owner_alive(entry):
            continue  # another live diagnosis owns it
        if executor.group_pids(entry["pgid"]):
            print(f"stopping stale server pid {entry['pid']} (arm {entry['arm']}) left by a dead run")
            executor.stop_group(entry["pgid"])
            stopped += 1
        registry.forget(entry["pid"], executor.host)
    out = {"stale_servers_stopped": float(stopped)}
    if not executor.which("nvidia-smi"):
        print(f"no GPU on {executor.host} (no nvidia-smi): skipping the GPU memory check")
        return out
    before = gpu.memory_used_mib(executor)
    deadline = time.monotonic() + timeout_s
    after = before
    while any(used > host.gpu_memory_free_mib for used in after.values()):
        if time.monotonic() > deadline:
            raise SpecdiagError(
                f"GPU memory on {executor.host} is still in use after cleanup ({after} MiB); "
                f"PIDs holding it: {gpu.compute_pids(executor)}: stop them or raise host.gpu_memory_free_mib")
        time.sleep(1.0)
        after = gpu.memory_used_mib(executor)
    out.update({"gpu_mem_used_mib_before": sum(before.values()), "gpu_mem_used_mib_after": sum(after.values())})
    return out
