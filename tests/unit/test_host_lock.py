"""One server per host across flow runs (a strict Prefect global concurrency limit), on a real Prefect server."""
import sys
import threading
import time

from prefect import flow

from infra.config import HostConfig
from infra.executor import LocalExecutor
from infra.hostlock import host_lock


@flow
def hold_host(host_name: str, gpus: list[int] | None, port: int, log_path: str) -> tuple[float, float]:
    """What an arm does with the host: take the lock, run a real server process, stop it, release."""
    ex = LocalExecutor()
    with host_lock(HostConfig(name=host_name, gpus=gpus), port, progress_s=0.5):
        proc = ex.launch([sys.executable, "-c", "import time; time.sleep(3)"], {}, log_path)
        start = time.monotonic()
        while ex.is_alive(proc.pid):
            time.sleep(0.05)
        return start, time.monotonic()


def _overlap(a, b, tmp_path) -> bool:
    """Run two holders (host, gpus, port) at once: True when their servers' lifetimes intersect."""
    spans = []
    tmp_path.mkdir(parents=True, exist_ok=True)
    threads = [threading.Thread(target=lambda h, p: spans.append(hold_host(*h, p)), args=(h, str(tmp_path / f"{i}.log")))
               for i, h in enumerate((a, b))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert len(spans) == 2, spans
    (a0, a1), (b0, b1) = sorted(spans)
    return b0 < a1


def test_servers_sharing_a_gpu_or_a_port_queue_and_others_run_side_by_side(prefect_server, tmp_path, capsys):
    assert _overlap(("box-a", None, 8011), ("box-a", None, 8011), tmp_path) is False
    assert "waiting" in capsys.readouterr().out  # the queued one says what it waits for, while it waits
    assert _overlap(("box-b", None, 8011), ("box-c", None, 8011), tmp_path) is True  # two hosts
    assert _overlap(("box-d", [0, 1], 8011), ("box-d", [1, 2], 8012), tmp_path) is False  # GPU 1 in both
    assert _overlap(("box-d", [0], 8011), ("box-d", [1], 8012), tmp_path) is True  # disjoint GPUs and ports
    assert _overlap(("box-d", [0], 8011), ("box-d", [1], 8011), tmp_path) is False  # one port
    assert _overlap(("box-e", None, 8011), ("box-e", [3], 8012), tmp_path) is False  # all GPUs vs one


def test_registry_entries_belong_to_the_exact_host_named(tmp_path, monkeypatch):
    """A host named "gpu" must not see (and clean up) the servers of "gpu-box"."""
    from infra import registry

    monkeypatch.setattr(registry, "_dir", lambda: tmp_path)
    registry.remember(101, 101, "a", "gpu-box", "vllm serve")
    registry.remember(202, 202, "b", "gpu", "vllm serve")
    assert [e["pid"] for e in registry.launched("gpu")] == [202]
    assert [e["pid"] for e in registry.launched("gpu-box")] == [101]


HOLD_AND_HANG = """
import sys, time
from infra.config import HostConfig
from infra.hostlock import host_lock
with host_lock(HostConfig(name="box-f"), 8011):
    print("held", flush=True)
    time.sleep(600)
"""


def test_a_holder_killed_holding_the_host_is_given_back_by_the_next(prefect_server, tmp_path, capsys):
    """SIGKILL leaves the slots taken and no lease expiry on this server: the next waiter on this machine sees the
    holder's record, its process gone, and gives the slots back instead of waiting forever."""
    import os
    import subprocess

    from prefect.settings import PREFECT_API_URL

    from tests.conftest import ROOT

    env = {**os.environ, "PREFECT_API_URL": PREFECT_API_URL.value(), "PYTHONPATH": str(ROOT)}
    holder = subprocess.Popen([sys.executable, "-c", HOLD_AND_HANG], env=env, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        holder.kill()
        holder.wait(10)
        result = []
        waiter = threading.Thread(target=lambda: result.append(hold_host("box-f", None, 8011, str(tmp_path / "w.log"))))
        waiter.start()
        waiter.join(60)
        assert result, "the next diagnosis still waits for a dead holder's slots"
        assert f"diagnosis pid {holder.pid} died holding them" in capsys.readouterr().out
    finally:
        holder.kill()


def test_a_wait_for_a_live_holder_has_a_cap_and_names_the_holder(prefect_server, tmp_path):
    """A diagnosis that holds the host for hours makes the next one fail after the host's lock_wait_s, saying whose
    the host is, rather than wait without end."""
    import os
    import subprocess

    import pytest
    from prefect.settings import PREFECT_API_URL

    from infra.config import SpecdiagError
    from tests.conftest import ROOT

    env = {**os.environ, "PREFECT_API_URL": PREFECT_API_URL.value(), "PYTHONPATH": str(ROOT)}
    holder = subprocess.Popen([sys.executable, "-c", HOLD_AND_HANG.replace("box-f", "box-g")], env=env,
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        start = time.monotonic()
        with pytest.raises(SpecdiagError, match=rf"gave up after 2 s waiting for all GPUs of host box-g .* held by "
                                                rf"pid {holder.pid} on "):
            with host_lock(HostConfig(name="box-g", lock_wait_s=2), 8011, progress_s=0.5):
                pass
        assert time.monotonic() - start < 30
    finally:
        holder.kill()
        holder.wait(10)


def test_ownership_is_judged_by_machine_boot_and_start_time_not_a_bare_pid():
    """A record whose PID now belongs to another process (reused after a restart) or whose boot is over is dead; a
    record another machine wrote into a shared home directory is not this machine's to judge."""
    from infra import registry

    me = registry.owner()
    assert registry.owner_alive(me)
    assert not registry.owner_alive({**me, "owner_started": str(int(me["owner_started"]) + 1)})  # a reused PID
    assert not registry.owner_alive({**me, "boot_id": "another-boot"})
    assert registry.owner_alive({**me, "owner_pid": 2 ** 22 + 7, "machine": "other-machine"})
    assert not registry.owner_alive({**me, "owner_pid": 2 ** 22 + 7})


def test_records_are_written_whole_and_an_unreadable_one_is_kept(tmp_path, monkeypatch):
    from infra import registry

    monkeypatch.setattr(registry, "_dir", lambda: tmp_path)
    registry.remember(303, 303, "a", "box-h", "vllm serve")
    assert [p.name for p in tmp_path.iterdir()] == ["box-h-303.json"]  # no temp file left beside it
    (tmp_path / "box-h-404.json").write_text('{"pid": 404, "ho')  # as a writer killed mid-write once left it
    assert [e["pid"] for e in registry.launched("box-h")] == [303]
    assert (tmp_path / "box-h-404.json").exists()  # not deleted: it may name a live server


def test_a_lapsed_lease_stops_what_it_protected_and_says_why(prefect_server, monkeypatch):
    """A lock whose lease the Prefect server no longer holds (expired while renewals failed, or revoked) protects
    nothing: another diagnosis may take the host. The holder's server is stopped at once (on_lapse, as flows/arm.py
    registers it), and the next step that would start or change a server refuses, naming why."""
    import json
    import subprocess
    from uuid import UUID

    import pytest
    from prefect.client.orchestration import get_client

    from infra import hostlock

    monkeypatch.setattr(hostlock, "RENEW_S", 0.3)
    server = subprocess.Popen(["sleep", "300"], start_new_session=True)  # stands for the vLLM server it protects
    try:
        with host_lock(HostConfig(name="box-h"), 8011) as hold:
            hold.lapse.on_lapse(lambda: LocalExecutor().stop_group(server.pid, grace_s=2))
            hold.lapse.check()  # held: nothing to say
            time.sleep(1.0)
            assert not hold.lapse.event.is_set()  # renewals pass while the lease is there
            leases = [json.loads(f.read_text())["lease"] for f in hostlock._holders().glob("*.json")
                      if "specdiag-host-box-h-port-8011" in f.read_text()]
            with get_client(sync_client=True) as client:  # the server drops the lease
                client.release_concurrency_slots_with_lease(UUID(leases[0]))
            assert hold.lapse.event.wait(10), "the lapse went unnoticed"
            assert server.wait(10) is not None  # its server stopped within seconds
            assert "no longer holds the lease on specdiag-host-box-h-port-8011" in hold.lapse.why
            with pytest.raises(hostlock.LeaseLapsed, match="another diagnosis may take the host"):
                hold.lapse.check()
    finally:
        server.kill()
        server.wait()
