"""Before an arm: stop stale servers this tool started, and prove the GPUs' memory is free."""
from __future__ import annotations

import shlex
import time

from prefect import task
from prefect.cache_policies import NO_CACHE

from infra import gpu, registry, shm
from infra.config import HostConfig, SpecdiagError
from infra.executor import Executor


@task(name="gpu-cleanup", cache_policy=NO_CACHE)
def cleanup(executor: Executor, host: HostConfig, timeout_s: float = 60.0) -> dict[str, float]:
    stale, since = [], set()
    for entry in registry.launched(executor.host):
        if registry.owner_alive(entry):
            continue  # another live diagnosis owns it
        if executor.group_pids(entry["pgid"]) and still_ours(executor, entry):
            print(f"stopping stale server pid {entry['pid']} (arm {entry['arm']}) left by a dead run")
            executor.stop_group(entry["pgid"])
            stale.append(entry["pgid"])
            if entry.get("shm_before") is not None:  # a record without it (an older specdiag): nothing is removed
                since |= shm.listing(executor) - set(entry["shm_before"])
        registry.forget(entry["pid"], executor.host)
    out = {"stale_servers_stopped": float(len(stale))}
    if since:  # what appeared in /dev/shm while the dead servers ran, now that nothing maps it: never another's older
        out["shm_files_removed"] = float(len(shm.remove_unused(executor, since)))
    if not executor.which("nvidia-smi"):
        print(f"no GPU on {executor.host} (no nvidia-smi): skipping the GPU memory check")
        return out
    try:
        result = gpu.reclaim(executor, set(stale), host.gpus, host.stop_any_gpu_process, host.gpu_memory_free_mib, timeout_s)
    except gpu.GpuBusy as exc:
        raise SpecdiagError(str(exc)) from None
    print(f"GPU memory before {result.before_mib} MiB, after {result.after_mib} MiB")
    return {**out, **result.metrics()}


START_SLACK_S = 120.0  # a server's workers start within seconds of its launch; a recycled process group much later


def still_ours(executor: Executor, entry: dict) -> bool:
    """The recorded process group is still the server this tool launched, not a recycled PID: its oldest process
    runs vLLM (or the recorded interpreter) and is as old as the record, within START_SLACK_S."""
    done = executor.run(["ps", "-e", "-ww", "-o", "pgid=,etimes=,args="], timeout_s=15)
    members = []
    for line in done.stdout.splitlines():
        parts = line.split(None, 2)
        if len(parts) == 3 and parts[0] == str(entry["pgid"]) and parts[1].isdigit():
            members.append((int(parts[1]), parts[2]))
    if not members:
        return False
    age, args = max(members)
    interpreter = next((t for t in shlex.split(entry.get("command", "")) if "=" not in t), "vllm")
    ours = "vllm" in args.lower() or interpreter in args
    if not ours or age < time.time() - entry["started"] - START_SLACK_S:
        print(f"not stopping process group {entry['pgid']}: it is no longer the server of arm {entry['arm']} "
              f"(pid reused: {args[:80]!r}, {age} s old)")
        return False
    return True
