"""GPU cleanup on a real GPU: CUDA processes holding memory are stopped and the memory comes back.

Skipped where there is no nvidia-smi (CI). On a GPU machine: python -m pytest tests/gpu, or, where
pytest is missing, python tests/gpu/test_gpu_cleanup.py.
"""
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import pytest  # noqa: E402

from infra import gpu  # noqa: E402
from infra.executor import LocalExecutor  # noqa: E402

pytestmark = pytest.mark.skipif(shutil.which("nvidia-smi") is None, reason="needs an NVIDIA GPU (nvidia-smi)")
HOLD = ("import sys, time, torch; x = torch.empty(int(sys.argv[1]) * 2**20, dtype=torch.uint8, device='cuda'); "
        "x.fill_(1); torch.cuda.synchronize(); print('holding', flush=True); time.sleep(600)")
GiB = 1024


def _hold(ex, mib: int, tmp: Path):
    log = tmp / f"hold-{mib}.log"
    proc = ex.launch([sys.executable, "-c", HOLD, str(mib)], {}, str(log))
    deadline = time.monotonic() + 180
    while "holding" not in ex.read_tail(str(log)):
        assert ex.is_alive(proc.pid) and time.monotonic() < deadline, ex.read_tail(str(log))
        time.sleep(0.5)
    return proc


def test_reclaim_stops_our_cuda_processes_and_memory_returns(tmp_path):
    ex = LocalExecutor()
    idle = sum(gpu.memory_used_mib(ex).values())
    a, b = _hold(ex, 8 * GiB, tmp_path), _hold(ex, 4 * GiB, tmp_path)
    held = {pid: mib for _, pid, mib in gpu.compute_apps(ex)}
    assert a.pid in held and b.pid in held, held
    assert gpu.holds_gpu(ex, a.pid) and gpu.holds_gpu(ex, b.pid)  # /proc confirms what nvidia-smi lists
    result = gpu.reclaim(ex, {a.pgid, b.pgid}, free_below_mib=idle + GiB, timeout_s=60)
    before, after = sum(result.before_mib.values()), sum(result.after_mib.values())
    print(f"idle {idle:.0f} MiB, before {before:.0f} MiB, after {after:.0f} MiB, stopped {result.stopped_pids}, "
          f"per-process {held}")
    assert 12 * GiB <= before - idle < 12 * GiB + 2 * GiB  # 8 + 4 GiB plus two CUDA contexts
    assert after < idle + GiB
    assert sorted(result.stopped_pids) == sorted([a.pid, b.pid])
    assert not ex.is_alive(a.pid) and not ex.is_alive(b.pid)
    assert result.metrics()["gpu_mem_used_mib_before"] == before


def test_a_foreign_process_is_named_and_only_stopped_when_opted_in(tmp_path):
    ex = LocalExecutor()
    idle = sum(gpu.memory_used_mib(ex).values())
    other = _hold(ex, 2 * GiB, tmp_path)
    try:
        with pytest.raises(gpu.GpuBusy, match=f"PID {other.pid}"):
            gpu.reclaim(ex, set(), free_below_mib=idle + GiB, timeout_s=3)
        assert ex.is_alive(other.pid)
        result = gpu.reclaim(ex, set(), stop_any=True, free_below_mib=idle + GiB, timeout_s=60)
        print(f"opt-in: before {result.before_mib} after {result.after_mib} stopped {result.stopped_pids}")
        assert other.pid in result.stopped_pids and not ex.is_alive(other.pid)
    finally:
        ex.stop_group(other.pgid, grace_s=1)


if __name__ == "__main__":
    for test in (test_reclaim_stops_our_cuda_processes_and_memory_returns,
                 test_a_foreign_process_is_named_and_only_stopped_when_opted_in):
        with tempfile.TemporaryDirectory() as tmp:
            test(Path(tmp))
            print(f"PASSED {test.__name__}")
