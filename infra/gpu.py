"""GPU memory and compute processes, read with nvidia-smi through an executor (local or remote)."""
from __future__ import annotations

import csv
import io

from infra.executor import Executor


def _query(executor: Executor, args: list[str]) -> list[list[str]]:
    done = executor.run(["nvidia-smi", *args, "--format=csv,noheader,nounits"], timeout_s=30)
    if done.returncode != 0:
        raise RuntimeError(f"nvidia-smi failed on {executor.host}: {done.stderr.strip() or done.stdout.strip()}")
    return [[c.strip() for c in row] for row in csv.reader(io.StringIO(done.stdout)) if row]


def memory_used_mib(executor: Executor) -> dict[int, float]:
    """GPU index -> used memory in MiB."""
    return {int(r[0]): float(r[1]) for r in _query(executor, ["--query-gpu=index,memory.used"])}


def compute_pids(executor: Executor) -> list[int]:
    return [int(r[0]) for r in _query(executor, ["--query-compute-apps=pid"]) if r[0].isdigit()]
