"""A diagnosis that ends while its offline evaluation runs on a remote host (Ctrl-C, a Prefect cancellation) stops that
evaluation's process group there within seconds (issue 39, item 6), where it used to wait up to 900 s for it. The
evaluation is the real engine-side script on the real demo target, on the loopback sshd's host."""
import subprocess
import threading
import time

from infra.arms import resolved_drafters, resolved_target, run_dir
from infra.executor import Cancelled, LocalExecutor
from infra.ssh import SshExecutor
from infra.tracking import Tracker
from flows.diagnose import prepare
from tasks.offline import Stop, offline_eval
from tests.ssh.test_ssh_diagnosis import ssh_profile


def _running(marker: str) -> list[str]:
    return subprocess.run(["pgrep", "-f", marker], capture_output=True, text=True).stdout.split()


def _until(check, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while not check() and time.monotonic() < deadline:
        time.sleep(0.1)
    return check()


def test_a_command_is_stopped_group_and_all_when_cancelled(host):
    for ex in (SshExecutor(host), LocalExecutor()):
        stop, out = threading.Event(), {}

        def go():
            try:
                out["done"] = ex.run(["sh", "-c", "sleep 307; echo never"], 600, cancel=stop)
            except Cancelled as exc:
                out["cancelled"] = exc
        waiter = threading.Thread(target=go)
        waiter.start()
        assert _until(lambda: _running("sleep 307"), 10), ex.host
        start = time.monotonic()
        stop.set()
        waiter.join(15)
        assert not waiter.is_alive() and "cancelled" in out, (ex.host, out)
        assert time.monotonic() - start < 10
        assert _until(lambda: not _running("sleep 307"), 5), ex.host  # the command's group is gone, sleep included
        ex.close()


def test_an_offline_evaluation_on_a_remote_host_stops_when_the_diagnosis_ends(sshd, tmp_path, mlflow_uri):
    cfg, plan, prompts = prepare(ssh_profile(sshd, tmp_path), {"drafter": "smol-eagle3", "control": ""},
                                 ["host=sshbox"])
    tracker = Tracker(mlflow_uri)
    parent = tracker.start(tracker.experiment(cfg.name), "offline cancel", {"specdiag.kind": "diagnosis"})
    result, stop = {}, Stop()
    worker = threading.Thread(target=lambda: result.update(r=offline_eval.fn(
        cfg, resolved_drafters(plan), resolved_target(cfg), prompts, run_dir(cfg, parent), tracker, parent, stop)))
    worker.start()
    assert _until(lambda: _running("engine_side/offline_eval.py") or not worker.is_alive(), 60) and worker.is_alive(), \
        f"the evaluation never ran on the host: {result}"
    time.sleep(2)  # well inside it: loading the target, evaluating
    start = time.monotonic()
    stop.close()  # what the diagnosis's block does on its way out
    worker.join(30)
    assert not worker.is_alive(), "the evaluation kept the diagnosis waiting"
    assert time.monotonic() - start < 15
    assert _until(lambda: not _running("engine_side/offline_eval.py"), 5), "the remote evaluation is still running"
    assert result["r"].status == "failed" and "Cancelled" in result["r"].note + str(
        tracker.client.get_run(parent).data.tags), result["r"]


def test_a_cancellable_command_past_its_timeout_is_stopped_and_says_its_timeout():
    import subprocess as sp

    import pytest

    with pytest.raises(sp.TimeoutExpired) as raised:
        LocalExecutor().run(["sh", "-c", "sleep 311"], 1.0, cancel=threading.Event())
    assert raised.value.timeout == 1.0
    assert _until(lambda: not _running("sleep 311"), 5)
