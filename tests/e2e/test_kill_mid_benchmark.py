"""A server killed mid-benchmark: its arm is FAILED with its log, the other arm still runs, nothing is left.

On one host the drafters are measured before the baseline (flows/diagnose._in_order): the baseline's server loads
and measures after the victim's failure."""
import os
import signal
import threading
import time

import pytest

from infra import registry
from tests.conftest import ROOT

pytestmark = pytest.mark.e2e
VICTIM = "smol-permuted"


def _kill_when_benchmarking(stop: threading.Event, killed: dict) -> None:
    """Wait until the victim's server has answered the warmup and started a measured request, then SIGKILL it."""
    while not stop.is_set():
        entry = next((e for e in registry.launched() if e["arm"] == VICTIM), None)
        if entry:  # this diagnosis's log, in the default host.workdir (runs/<diagnosis id>/)
            logs = [p for p in (ROOT / "runs").glob(f"*/{VICTIM}.server.log") if p.stat().st_mtime > killed["since"]]
            text = logs[0].read_text(errors="replace") if logs else ""
            if text.count("POST /v1/chat/completions") >= 2:  # warmup + first measured request
                time.sleep(2.0)
                os.killpg(entry["pgid"], signal.SIGKILL)
                killed["pgid"] = entry["pgid"]
                return
        time.sleep(0.3)


def test_killed_server_fails_its_arm_only(cli, tmp_path, no_servers_left):
    killed = {"since": time.time()}
    stop = threading.Event()
    watcher = threading.Thread(target=_kill_when_benchmarking, args=(stop, killed), daemon=True)
    watcher.start()
    try:
        done = cli("--drafter", VICTIM, "--no-control", "--prompts", "3", "--max-tokens", "24")
    finally:
        stop.set()
    assert "pgid" in killed, "the watcher never saw the victim benchmarking"
    assert done.returncode == 1  # an arm failed
    assert {a: r.info.status for a, r in done.arms.items()} == {"baseline": "FINISHED", VICTIM: "FAILED"}
    assert done.arms["baseline"].info.start_time > done.arms[VICTIM].info.start_time  # measured after the failure
    assert done.arms["baseline"].data.metrics["sys/requests_ok"] == 3
    run = done.arms[VICTIM]
    error = run.data.tags["specdiag.error"]
    assert "requests failed" in error or "ServerDied" in error or "Connect" in error
    assert f"arm {VICTIM} FAILED" in done.output
    artifacts = {a.path for a in done.client.list_artifacts(run.info.run_id)}
    assert {f"{VICTIM}.server.log", "error.txt", "metrics_before.txt", "requests.csv"} <= artifacts
    assert "POST /v1/chat/completions" in done.artifact_text(run, f"{VICTIM}.server.log")
    assert "sys/server_ready_s" in run.data.metrics and "sys/requests_failed" in run.data.metrics
    assert done.parent.data.tags["specdiag.verdict"] == "inconclusive"  # a crashed candidate decides nothing
