"""GPU memory and compute processes, read with nvidia-smi through an executor (local or remote).

Standard library only, so it runs wherever nvidia-smi does.
"""
from __future__ import annotations

import csv
import io
import re
import time
from dataclasses import dataclass, field


class GpuBusy(RuntimeError):
    pass


@dataclass
class Reclaim:
    before_mib: dict[int, float]
    after_mib: dict[int, float]
    stopped_pids: list[int] = field(default_factory=list)

    def metrics(self) -> dict[str, float]:
        out = {"gpu_mem_used_mib_before": sum(self.before_mib.values()),
               "gpu_mem_used_mib_after": sum(self.after_mib.values()),
               "gpu_processes_stopped": float(len(self.stopped_pids))}
        for i in self.before_mib:
            out[f"gpu{i}_mem_used_mib_before"] = self.before_mib[i]
            out[f"gpu{i}_mem_used_mib_after"] = self.after_mib.get(i, 0.0)
        return out


def _query(executor, args: list[str]) -> list[list[str]]:
    done = executor.run(["nvidia-smi", *args, "--format=csv,noheader,nounits"], timeout_s=30)
    if done.returncode != 0:
        raise RuntimeError(f"nvidia-smi failed on {executor.host}: {done.stderr.strip() or done.stdout.strip()}")
    return [[c.strip() for c in row] for row in csv.reader(io.StringIO(done.stdout)) if row]


def memory_used_mib(executor) -> dict[int, float]:
    """GPU index -> used memory in MiB."""
    return {int(r[0]): float(r[1]) for r in _query(executor, ["--query-gpu=index,memory.used"])}


def compute_apps(executor) -> list[tuple[int, int, float]]:
    """(gpu index, pid, used MiB) for every compute process."""
    index = {r[1]: int(r[0]) for r in _query(executor, ["--query-gpu=index,uuid"])}
    apps = _query(executor, ["--query-compute-apps=gpu_uuid,pid,used_memory"])
    return [(index.get(r[0], -1), int(r[1]), float(r[2]) if r[2].replace(".", "").isdigit() else 0.0)
            for r in apps if len(r) >= 3 and r[1].isdigit()]


NVIDIA_DEVICE = re.compile(r"-> /dev/nvidia(\d+|ctl|-uvm)$")


def holds_gpu(executor, pid: int) -> bool:
    """/proc confirms that PID, in this PID namespace, has an NVIDIA device open. nvidia-smi reports PIDs of the
    namespace its driver sees: in a container they can name another process, or none, of this one."""
    done = executor.run(["sh", "-c", f"ls -l /proc/{int(pid)}/fd/ 2>/dev/null"], timeout_s=15)
    return any(NVIDIA_DEVICE.search(line) for line in done.stdout.splitlines())


def reclaim(executor, own_pgids: set[int], gpus: list[int] | None = None, stop_any: bool = False,
            free_below_mib: float = 1024.0, timeout_s: float = 60.0) -> Reclaim:
    """Stop the compute processes this tool launched (every one on the selected GPUs with stop_any), then
    wait until each selected GPU's used memory is under free_below_mib. Raise GpuBusy naming the PIDs
    still holding memory if it does not come back."""
    before = memory_used_mib(executor)
    selected = set(before) if gpus is None else set(gpus)
    stopped: list[int] = []
    for gpu, pid, _ in compute_apps(executor):
        if gpu not in selected or pid in stopped:
            continue
        pgid = executor.pgid_of(pid)
        if pgid not in own_pgids and not stop_any:
            continue
        if not holds_gpu(executor, pid):  # nvidia-smi's PID is no process here that holds a GPU: never a guess
            print(f"not stopping PID {pid} on {executor.host}: nvidia-smi lists it, but /proc/{pid} shows no process "
                  "holding an NVIDIA device (another PID namespace, or it ended)")
            continue
        if pgid in own_pgids:
            executor.stop_group(pgid)
        else:
            executor.stop_pid(pid)
        stopped.append(pid)
    deadline = time.monotonic() + timeout_s
    while True:
        after = memory_used_mib(executor)
        busy = {i: used for i, used in after.items() if i in selected and used >= free_below_mib}
        if not busy:
            return Reclaim(before, after, stopped)
        if time.monotonic() > deadline:
            holders = [(g, p, m) for g, p, m in compute_apps(executor) if g in busy]
            raise GpuBusy(
                f"GPU memory not freed on {executor.host}: " + ", ".join(f"GPU {i} {m:.0f} MiB" for i, m in busy.items())
                + "; held by " + (", ".join(f"PID {p} ({m:.0f} MiB on GPU {g})" for g, p, m in holders) or "no listed process")
                + ": stop them, or opt in to stopping any process on the selected GPUs")
        time.sleep(1.0)
