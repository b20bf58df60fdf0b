"""Prefect's temporary server as flows/diagnose.py boots it (infra/prefect_boot.py): real servers, each in a fresh
process as the program runs it, since it sets the process's Prefect API for good."""
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

PROGRAM = """
import json, sys
sys.path.insert(0, %r)
from infra.prefect_boot import early_server
early = early_server()
from prefect import flow
from prefect.settings import PREFECT_API_URL, PREFECT_FLOWS_HEARTBEAT_FREQUENCY, temporary_settings

@flow
def probe():  # what a flow run of this process is configured with
    return {"api": PREFECT_API_URL.value(), "heartbeat_s": PREFECT_FLOWS_HEARTBEAT_FREQUENCY.value()}

configured = {PREFECT_API_URL: sys.argv[1]} if len(sys.argv) > 1 else {}
with temporary_settings(configured):
    with temporary_settings(early.serve()):  # as main() runs the diagnosis
        seen = probe() if not configured else {}
print(json.dumps({"early": early.api_url, "seen": seen, "running": early.proc.poll() is None}))
"""


def run(*args: str) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "PREFECT_API_URL"}
    done = subprocess.run([sys.executable, "-c", PROGRAM % str(ROOT), *args], env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_the_diagnosis_runs_on_the_temporary_server_without_heartbeats():
    """Its flow run is this process's own server's, and beats no heartbeat: nothing outlives the process to watch for
    one, and the flow's end would wait up to 1 s for the heartbeat thread's sleep (Prefect's default beats)."""
    out = run()
    assert out["seen"]["api"] == out["early"], out
    assert out["seen"]["heartbeat_s"] is None, out
    assert out["running"], out  # it serves to the end: Prefect's exit hooks report to it


def test_a_configured_prefect_server_wins_and_the_early_one_stops():
    """A server in Prefect's settings is the API: the early server is stopped, unused, and sets nothing."""
    out = run("http://127.0.0.1:9/api")
    assert not out["running"], out


def test_flow_runs_a_dead_diagnosis_left_running_are_ended_by_the_next(prefect_server):
    """A SIGKILLed diagnosis leaves its flow runs RUNNING in the database the temporary servers share. Each carries its
    owner (flows/diagnose.main tags them); the next start ends those whose owner is gone, and no other."""
    from prefect import flow
    from prefect.client.orchestration import get_client
    from prefect.states import Running

    from infra import registry
    from infra.prefect_boot import OWNED, end_orphan_flow_runs
    from infra.registry import owner_tag

    @flow
    def arm():
        pass

    me = registry.owner()
    dead = {**me, "owner_pid": 2 ** 22 + 7}
    with get_client(sync_client=True) as client:
        runs = {who: client.create_flow_run(arm, tags=[OWNED, owner_tag(o)], state=Running()).id
                for who, o in (("dead", dead), ("live", me))}
        assert end_orphan_flow_runs() >= 1
        states = {who: client.read_flow_run(rid).state for who, rid in runs.items()}
    assert states["dead"].type.value == "CRASHED" and f"pid {2 ** 22 + 7}" in states["dead"].message
    assert states["live"].type.value == "RUNNING"
