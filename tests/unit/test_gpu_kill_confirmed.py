"""A GPU process is stopped only after /proc confirms it (issue 39, item 5). nvidia-smi in a container can report
PIDs of the host's namespace: a PID that names another process here, or none. Here nvidia-smi alone is stood in for
(no GPU on this machine), with the output of a container whose driver lists a host PID that, in this namespace, is an
unrelated process: a real one, which `stop_any_gpu_process` must not stop. tests/gpu shows, on a real GPU, that a
real CUDA process is confirmed and stopped."""
import subprocess

import pytest

from infra import gpu
from infra.executor import Completed, LocalExecutor


class ContainerSmi(LocalExecutor):
    """This machine, where `nvidia-smi` reports PID `listed` holding 2 GiB on GPU 0 and the memory never returns."""

    def __init__(self, listed: int):
        super().__init__()
        self.listed = listed

    def run(self, argv, timeout_s):
        if argv[0] != "nvidia-smi":
            return super().run(argv, timeout_s)
        query = next(a for a in argv if a.startswith("--query"))
        rows = {"--query-gpu=index,memory.used": "0, 2048", "--query-gpu=index,uuid": "0, GPU-1",
                "--query-compute-apps=gpu_uuid,pid,used_memory": f"GPU-1, {self.listed}, 2040"}
        return Completed(0, rows[query] + "\n", "")


def test_a_pid_nvidia_smi_lists_is_not_stopped_unless_proc_shows_it_holds_a_gpu():
    bystander = subprocess.Popen(["sleep", "300"], start_new_session=True)
    try:
        ex = ContainerSmi(bystander.pid)
        assert not gpu.holds_gpu(ex, bystander.pid)
        with pytest.raises(gpu.GpuBusy, match=f"PID {bystander.pid}"):
            gpu.reclaim(ex, set(), stop_any=True, timeout_s=1.0)
        assert bystander.poll() is None  # still running: never signalled
        with pytest.raises(gpu.GpuBusy):  # nor when nvidia-smi names its group as one this tool launched
            gpu.reclaim(ex, {bystander.pid}, timeout_s=1.0)
        assert bystander.poll() is None
    finally:
        bystander.kill()
        bystander.wait()
