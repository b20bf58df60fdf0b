"""Diagnoses through the SSH executor, end to end: the "remote" GPU host is this machine's sshd."""
import subprocess
import threading
import time
from pathlib import Path

import pytest
import yaml
from mlflow.tracking import MlflowClient

from flows.diagnose import diagnose
from infra import embedded, registry
from infra.config import PROFILES_DIR
from tests.ssh.conftest import kill_ssh_sessions

pytestmark = pytest.mark.e2e


def ssh_profile(sshd, tmp_path: Path) -> str:
    """The demo profile with the sshd as a host of its inventory, written as a user writes one (kimi-k25.yaml's
    `hosts:`); every other setting is the demo's, the host's workdir included (`runs` under the login directory)."""
    profile = yaml.safe_load((PROFILES_DIR / "demo.yaml").read_text())
    profile["hosts"] = {"sshbox": {"kind": "ssh", "address": "127.0.0.1", "port": sshd["port"], "user": "root",
                                   "key_file": sshd["key"], "known_hosts": sshd["known_hosts"],
                                   "python": embedded.engine_python()}}
    path = tmp_path / "sshdemo.yaml"
    path.write_text(yaml.safe_dump(profile))
    return str(path)


def no_server_left():
    left = subprocess.run(["pgrep", "-f", "vllm.entrypoints.openai.api_server"], capture_output=True, text=True)
    assert left.stdout.strip() == "", f"vLLM server processes left behind: {left.stdout}"
    assert registry.launched("sshbox") == []


def test_eagle3_diagnosis_with_offline_evaluation_runs_through_ssh(cli, sshd, tmp_path):
    """The EAGLE-3 head behind the faulty engine patch, on the SSH host: the offline evaluation runs there (script
    and job sent over SFTP, report fetched back) and the verdict compares it with what the host's server served.
    Beside it, an extra arm: smol-eagle3-wrongaux, the trained head (layers 2, 15, 27) with a config naming (1, 8, 20).
    The engine feeds it what the config says; offline, the same head on the engine's default layers accepts far more:
    `aux_layers`, with the layers it was trained on, decided by the offline evaluation (no extra server).
    And the noised head, of wrongaux's shapes: swapped into wrongaux's server on the host (the extension sent over SFTP
    into the run's folder there), its aux layers set back to the ones its config names."""
    done = cli("--profile", ssh_profile(sshd, tmp_path), "--host", "sshbox", "--drafter", "smol-eagle3-badpatch",
               "--no-control", "--arms", "smol-eagle3-wrongaux", "smol-eagle3-noisy", "--prompt-set", "topics",
               "--prompts", "8", "--max-tokens", "48")
    assert done.returncode == 0, done.output[-3000:]
    assert set(done.arms) == {"baseline", "smol-eagle3-badpatch", "smol-eagle3-wrongaux", "smol-eagle3-noisy"}
    noisy = done.arms["smol-eagle3-noisy"].data
    assert noisy.tags["specdiag.served"] == f"swapped into {done.arms['smol-eagle3-wrongaux'].info.run_id}"
    assert noisy.params["host"] == "sshbox" and noisy.metrics["num_drafts"] > 0
    assert "aux layers [2, 15, 27]" in done.output  # what the host's engine reported after the swap
    run = done.arms["smol-eagle3-badpatch"].data
    assert run.params["host"] == "sshbox"
    assert run.params["server_cmd"].startswith("setsid nohup env ")
    assert "--host 127.0.0.1" in run.params["server_cmd"]  # bound to the host's loopback, reached by forward
    assert done.parent.data.tags["specdiag.offline_eval"] == "ok"
    assert run.metrics["acceptance_rate"] < 0.5 * run.metrics["offline_acceptance_rate"]
    artifacts = {a.path for a in done.client.list_artifacts(done.arms["smol-eagle3-badpatch"].info.run_id)}
    assert "smol-eagle3-badpatch.server.log" in artifacts  # fetched over SFTP from the host
    parent_id = done.parent.info.run_id
    assert (Path.home() / "runs" / parent_id / "smol-eagle3-badpatch.server.log").exists()  # where the host wrote it
    assert (Path.home() / "runs" / parent_id / "offline_eval.json").exists()  # the report, made on the host
    assert done.parent.data.tags["specdiag.verdict"] == "integration"
    verdict = done.artifact_text(done.parent, "verdict.md")
    assert "offline acceptance" in verdict

    wrong = done.arms["smol-eagle3-wrongaux"].data
    assert wrong.metrics["offline_acceptance_rate_aux_default"] > 1.5 * wrong.metrics["offline_acceptance_rate"]
    assert wrong.tags["specdiag.arm_verdict"] == "aux_layers"
    line = next(ln for ln in verdict.splitlines() if "smol-eagle3-wrongaux on its own: `aux_layers`" in ln)
    assert "[2, 15, 27]" in line, line
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
        # host.workdir set: the watcher reads the host's log to time the drop (a user may point it anywhere too)
        results = diagnose(ssh_profile(sshd, tmp_path), "smol-permuted", None,
                           sets=["host=sshbox", "control=null", f"hosts.sshbox.workdir={remote}",
                                 "bench.num_prompts=3", "bench.max_tokens=24"])
    finally:
        stop.set()
    assert dropped.get("sessions", 0) >= 1, "the watcher never saw the benchmark start"
    victim = next(r for r in results if r.arm == "smol-permuted")
    artifacts = {a.path for a in MlflowClient(mlflow_uri).list_artifacts(victim.run_id)}
    assert "smol-permuted.server.log" in artifacts  # fetched after the reconnect
    no_server_left()
