"""One server per host across flow runs (a strict Prefect global concurrency limit), on a real Prefect server."""
import sys
import threading
import time

from prefect import flow

from infra.config import HostConfig
from infra.executor import LocalExecutor
from infra.hostlock import host_lock


@flow
def hold_host(host_name: str, log_path: str) -> tuple[float, float]:
    """What an arm does with the host: take the lock, run a real server process, stop it, release."""
    ex = LocalExecutor()
    with host_lock(HostConfig(name=host_name)):
        proc = ex.launch([sys.executable, "-c", "import time; time.sleep(4)"], {}, log_path)
        start = time.monotonic()
        while ex.is_alive(proc.pid):
            time.sleep(0.05)
        return start, time.monotonic()


def _run_two(hosts, tmp_path):
    spans = []
    threads = [threading.Thread(target=lambda h, p: spans.append(hold_host(h, p)), args=(h, str(tmp_path / f"{i}.log")))
               for i, h in enumerate(hosts)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert len(spans) == 2, spans
    (a0, a1), (b0, b1) = sorted(spans)
    return a1 <= b0  # True when the lifetimes do not intersect


def test_two_diagnoses_on_one_host_never_overlap_and_on_two_hosts_do(prefect_server, tmp_path):
    assert _run_two(["gpu-box-a", "gpu-box-a"], tmp_path) is True
    assert _run_two(["gpu-box-b", "gpu-box-c"], tmp_path) is False


def test_registry_entries_belong_to_the_exact_host_named(tmp_path, monkeypatch):
    """A host named "gpu" must not see (and clean up) the servers of "gpu-box"."""
    from infra import registry

    monkeypatch.setattr(registry, "_dir", lambda: tmp_path)
    registry.remember(101, 101, "a", "gpu-box", "vllm serve")
    registry.remember(202, 202, "b", "gpu", "vllm serve")
    assert [e["pid"] for e in registry.launched("gpu")] == [202]
    assert [e["pid"] for e in registry.launched("gpu-box")] == [101]
