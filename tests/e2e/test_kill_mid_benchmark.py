"""A server killed mid-benchmark: its arm is FAILED with its log, the other arms still run, nothing is left."""
import os
import signal
import threading
import time
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from flows.diagnose import diagnose
from infra import registry

pytestmark = pytest.mark.e2e
VICTIM = "smol-permuted"


def _kill_when_benchmarking(stop: threading.Event, killed: dict) -> None:
    """Wait until the victim's server has answered the warmup and started a measured request, then SIGKILL it."""
    while not stop.is_set():
        entry = next((e for e in registry.launched() if e["arm"] == VICTIM), None)
        if entry:
            logs = list(Path(killed["workdir"]).rglob(f"{VICTIM}.server.log"))
            text = logs[0].read_text(errors="replace") if logs else ""
            if text.count("POST /v1/chat/completions") >= 2:  # warmup + first measured request
                time.sleep(2.0)
                os.killpg(entry["pgid"], signal.SIGKILL)
                killed["pgid"] = entry["pgid"]
                return
        time.sleep(0.3)


def test_killed_server_fails_its_arm_only(prefect_server, mlflow_uri, tmp_path, no_servers_left):
    killed = {"workdir": tmp_path / "runs"}
    stop = threading.Event()
    watcher = threading.Thread(target=_kill_when_benchmarking, args=(stop, killed), daemon=True)
    watcher.start()
    try:
        results = diagnose("demo", VICTIM, "smol-self",
                           sets=[f"host.workdir={tmp_path / 'runs'}", "bench.num_prompts=3", "bench.max_tokens=24"])
    finally:
        stop.set()
    assert "pgid" in killed, "the watcher never saw the victim benchmarking"
    status = {r.arm: r.ok for r in results}
    assert status == {"baseline": True, VICTIM: False, "smol-self": True}
    victim = next(r for r in results if r.arm == VICTIM)
    assert "requests failed" in victim.error or "ServerDied" in victim.error or "Connect" in victim.error

    client = MlflowClient(mlflow_uri)
    run = client.get_run(victim.run_id)
    assert run.info.status == "FAILED"
    assert run.data.tags["specdiag.error"]
    artifacts = {a.path for a in client.list_artifacts(victim.run_id)}
    assert {f"{VICTIM}.server.log", "error.txt", "metrics_before.txt", "requests.csv"} <= artifacts
    log = Path(client.download_artifacts(victim.run_id, f"{VICTIM}.server.log", str(tmp_path)))
    assert "POST /v1/chat/completions" in log.read_text()
    assert "server_ready_s" in run.data.metrics and "requests_failed" in run.data.metrics
    assert client.get_run(next(r.run_id for r in results if r.arm == "smol-self")).info.status == "FINISHED"
    parent = client.get_run(run.data.tags["mlflow.parentRunId"])
    assert parent.data.tags["specdiag.verdict"] == "inconclusive"  # a crashed candidate decides nothing
