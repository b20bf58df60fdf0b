"""The demo diagnosis through the SSH executor, end to end: the "remote" GPU host is this machine's sshd."""
import subprocess
import threading
import time
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from flows.diagnose import diagnose
from infra import embedded, registry
from tests.ssh.conftest import kill_ssh_sessions

pytestmark = pytest.mark.e2e


def ssh_sets(sshd, remote_dir: Path) -> list[str]:
    box = (f"{{kind: ssh, address: 127.0.0.1, port: {sshd['port']}, user: root, key_file: '{sshd['key']}', "
           f"known_hosts: '{sshd['known_hosts']}', python: '{embedded.engine_python()}', workdir: '{remote_dir}'}}")
    return [f"hosts.sshbox={box}", "host=sshbox", "control=null"]


def no_server_left():
    left = subprocess.run(["pgrep", "-f", "vllm.entrypoints.openai.api_server"], capture_output=True, text=True)
    assert left.stdout.strip() == "", f"vLLM server processes left behind: {left.stdout}"
    assert registry.launched("sshbox") == []


def test_demo_diagnosis_runs_through_ssh(prefect_server, mlflow_uri, sshd, tmp_path):
    results = diagnose("demo", "smol-permuted", None, sets=ssh_sets(sshd, tmp_path / "remote runs"))
    assert [r.arm for r in results] == ["baseline", "smol-permuted"] and all(r.ok for r in results)
    client = MlflowClient(mlflow_uri)
    run = client.get_run(results[1].run_id)
    assert run.data.params["host"] == "sshbox"
    assert run.data.params["server_cmd"].startswith("setsid nohup env ")
    assert "--host 127.0.0.1" in run.data.params["server_cmd"]  # bound to the host's loopback, reached by forward
    assert run.data.metrics["acceptance_rate"] < 0.1 and run.data.metrics["num_drafts"] > 0
    artifacts = {a.path for a in client.list_artifacts(results[1].run_id)}
    assert "smol-permuted.server.log" in artifacts  # fetched over SFTP from the host
    assert list((tmp_path / "remote runs").glob("*/smol-permuted.server.log"))  # where the host wrote it
    parent = client.get_run(run.data.tags["mlflow.parentRunId"])
    assert parent.data.tags["specdiag.verdict"] == "vocab_mismatch"
    no_server_left()


def test_dropped_ssh_connection_mid_benchmark_leaves_no_server(prefect_server, mlflow_uri, sshd, tmp_path):
    remote, dropped, stop = tmp_path / "remote", {}, threading.Event()

    def drop_when_benchmarking():
        while not stop.is_set():
            logs = list(remote.glob("*/smol-permuted.server.log"))
            if logs and logs[0].read_text(errors="replace").count("POST /v1/chat/completions") >= 2:
                time.sleep(1.0)
                dropped["sessions"] = kill_ssh_sessions(sshd)
                return
            time.sleep(0.3)

    watcher = threading.Thread(target=drop_when_benchmarking, daemon=True)
    watcher.start()
    try:
        results = diagnose("demo", "smol-permuted", None,
                           sets=ssh_sets(sshd, remote) + ["bench.num_prompts=3", "bench.max_tokens=24"])
    finally:
        stop.set()
    assert dropped.get("sessions", 0) >= 1, "the watcher never saw the benchmark start"
    victim = next(r for r in results if r.arm == "smol-permuted")
    artifacts = {a.path for a in MlflowClient(mlflow_uri).list_artifacts(victim.run_id)}
    assert "smol-permuted.server.log" in artifacts  # fetched after the reconnect
    no_server_left()
