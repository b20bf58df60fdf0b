"""One demo diagnosis spread over two hosts by real Prefect workers, recorded by one real MLflow tracking server.

The hosts are `local` and the loopback sshd (tests/ssh), each server pinned to its own core and port, each host's
arms run by its own `prefect worker` process on its own work queue. The same diagnosis run in order on one host
(the session's demo diagnosis, tests/conftest.py) gives the same verdict."""
import contextvars
import threading
import time
from pathlib import Path
from secrets import token_urlsafe

import httpx

import pytest
import yaml
from mlflow.tracking import MlflowClient
from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import DeploymentFilter, DeploymentFilterName, FlowRunFilter
from prefect.settings import PREFECT_API_AUTH_STRING, PREFECT_API_URL, temporary_settings

from infra import embedded, spread
from infra.browser import mlflow_server
from infra.config import PROFILES_DIR
from infra.stack import prefect_server as prefect_server_at, workers
from tests.conftest import diagnose
from tests.ssh.conftest import sshd  # noqa: F401  (the loopback host)

pytestmark = pytest.mark.e2e


def spread_profile(sshd, tmp_path: Path) -> str:  # noqa: F811
    """The demo profile with two hosts, as a user writes one: each confines its servers to one core, on its own port.
    Without --hosts the diagnosis runs on `local` as described here (pinned to core 0): no `host:` needed."""
    profile = yaml.safe_load((PROFILES_DIR / "demo.yaml").read_text())
    profile["hosts"] = {
        "local": {"cpus": [0]},
        "sshbox": {"kind": "ssh", "address": "127.0.0.1", "port": sshd["port"], "user": "root",
                   "key_file": sshd["key"], "known_hosts": sshd["known_hosts"], "python": embedded.engine_python(),
                   "server_port": 8012, "cpus": [1]}}
    path = tmp_path / "twohosts.yaml"
    path.write_text(yaml.safe_dump(profile))
    return str(path)


def test_demo_diagnosis_spread_over_two_hosts_by_prefect_workers(prefect_server, demo, sshd,  # noqa: F811
                                                                  tmp_path, no_servers_left, monkeypatch):
    """The services run with their own authentication, as docs/services.md starts them: a request without
    credentials is refused by both, and so is a diagnosis that would spread over an open one."""
    profile, prefect_auth, mlflow_auth = spread_profile(sshd, tmp_path), f"specdiag:{token_urlsafe(16)}", \
        ("specdiag", token_urlsafe(16))
    creds = {"PREFECT_API_AUTH_STRING": prefect_auth, "MLFLOW_TRACKING_USERNAME": mlflow_auth[0],
             "MLFLOW_TRACKING_PASSWORD": mlflow_auth[1]}
    with prefect_server_at(tmp_path / "prefect", auth=prefect_auth) as api, \
            mlflow_server(f"sqlite:///{tmp_path}/mlflow.db", artifacts=tmp_path / "artifacts", auth=mlflow_auth) \
            as tracking, workers(api, "specdiag", ["local", "sshbox"], tmp_path / "workers", env=creds) as procs:
        for url in (f"{api}/admin/version", f"{tracking}/api/2.0/mlflow/experiments/search?max_results=1"):
            assert httpx.get(url, timeout=10).status_code == 401, url  # no credentials, no answer
        for key, value in creds.items():
            monkeypatch.setenv(key, value)  # the diagnosis's, and this test's MLflow reads
        with temporary_settings({PREFECT_API_URL: api, PREFECT_API_AUTH_STRING: prefect_auth}):
            done = diagnose(tracking, "--profile", profile, "--hosts", "local", "sshbox", "--fresh", timeout=1200)
            assert done.returncode == 0, done.output[-4000:]
            with get_client(sync_client=True) as client:
                flow_runs = client.read_flow_runs(deployment_filter=DeploymentFilter(
                    name=DeploymentFilterName(any_=["spread"])), flow_run_filter=FlowRunFilter())
            lost = _handed_to_a_dead_worker(procs["sshbox"], flow_runs[0].parameters, monkeypatch)
        parent, arms = done.parent, done.arms
        artifacts = {n: {a.path for a in MlflowClient(tracking).list_artifacts(r.info.run_id)} for n, r in arms.items()}
    assert set(arms) == set(demo.arms) == {"baseline", "smol-permuted", "smol-self"}
    assert lost.state.type.value == "CRASHED" and "the worker of host sshbox is gone" in lost.state.message
    # every arm was measured by a worker, on both hosts, recorded through the one tracking server
    hosts = {name: run.data.params["host"] for name, run in arms.items()}
    assert set(hosts.values()) == {"local", "sshbox"}, hosts
    # one flow run per server: smol-permuted has smol-self's shapes, so it is swapped into that server, on its host
    assert arms["smol-permuted"].data.tags["specdiag.served"] == f"swapped into {arms['smol-self'].info.run_id}"
    assert hosts["smol-permuted"] == hosts["smol-self"]
    assert sorted(r.state.type.value for r in flow_runs) == ["COMPLETED"] * 2
    assert sorted(r.work_queue_name for r in flow_runs) == sorted(f"host-{hosts[a]}" for a in ("baseline", "smol-self"))
    # each worker checked the run's code-choosing settings against its own copy of the profile before serving
    assert all("checked against this worker's" in (tmp_path / "workers" / f"worker-{h}.log").read_text()
               for h in set(hosts.values()))
    # each measured beside the others: its early stop learns their numbers from MLflow as they end (tasks/reuse.py)
    assert all(r.parameters.get("beside") is True for r in flow_runs), [r.parameters for r in flow_runs]
    for name, run in arms.items():
        core, port = (1, 8012) if hosts[name] == "sshbox" else (0, 8011)
        assert f"taskset -c {core} " in run.data.params["server_cmd"] and f"--port {port}" in run.data.params["server_cmd"]
        server = "smol-self" if name == "smol-permuted" else name  # the server it was measured on
        assert {"requests.csv", f"{server}.server.log"} <= artifacts[name]  # written by its worker through the server
    # arms on the two hosts ran at the same time
    spans = sorted((r.info.start_time, r.info.end_time, hosts[n]) for n, r in arms.items())
    assert any(a[2] != b[2] and b[0] < a[1] for a, b in zip(spans, spans[1:])), spans
    # the same verdict as the same diagnosis in order on one host (the session's demo diagnosis: same drafters,
    # prompts and settings, its arms one after another in the diagnosis's own process)
    assert parent.data.tags["specdiag.verdict"] == demo.parent.data.tags["specdiag.verdict"]
    assert parent.data.tags["specdiag.verdict"] in done.output


def _handed_to_a_dead_worker(worker, parameters: dict, monkeypatch):
    """An arm handed to a host whose worker died is not waited for forever: once its queue goes unpolled (3 s here,
    the workers poll every second; WORKER_SILENT_S in use), the flow run is ended CRASHED, saying why."""
    worker.kill()
    worker.wait(10)
    monkeypatch.setattr(spread, "WORKER_SILENT_S", 3.0)
    monkeypatch.setattr(spread, "CHECK_S", 1.0)
    out, start = {}, time.monotonic()
    context = contextvars.copy_context()  # this block's Prefect settings (the authenticated server), in the thread
    waiter = threading.Thread(target=lambda: context.run(lambda: out.update(run=spread.RemoteRuns(
        "arm/spread", "specdiag").run("sshbox", parameters, "lost"))), daemon=True)
    waiter.start()
    waiter.join(60)
    assert not waiter.is_alive(), "waited on for a dead worker"
    assert time.monotonic() - start < 30
    return out["run"]
