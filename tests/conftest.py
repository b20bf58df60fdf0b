"""Shared fixtures: a real Prefect server (one per test session), a real MLflow store per test, and the CLI run as
users run it."""
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

ROOT = Path(__file__).resolve().parents[1]

os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")


@pytest.fixture(scope="session")
def prefect_server():
    from prefect.testing.utilities import prefect_test_harness

    with prefect_test_harness(server_startup_timeout=120):
        yield


@pytest.fixture
def mlflow_uri(tmp_path, monkeypatch):
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    return uri


@dataclass
class Diagnosis:
    """What a user has after `python flows/diagnose.py ...`: the exit code, the printed output, the MLflow record."""

    returncode: int
    output: str
    client: MlflowClient
    parent: object  # the parent run
    arms: dict  # arm name -> child run

    def artifact_text(self, run, name: str) -> str:
        return Path(self.client.download_artifacts(run.info.run_id, name)).read_text(errors="replace")


def diagnose(mlflow_uri: str, *args: str, timeout: float = 1500, prefect_api: bool = True) -> Diagnosis:
    """Run the README's main command as a subprocess with the CLI's defaults: the default host.workdir (runs/ in the
    project), cache and artifact layout. Only two things are pointed elsewhere, both as a user can: the MLflow store
    (MLFLOW_TRACKING_URI, so a test reads the record it wrote) and the Prefect API (PREFECT_API_URL: the test session's
    server, as a user with a persistent Prefect server has it; it saves booting one per command).
    prefect_api=False: no Prefect server configured, as on a fresh machine (the program boots its own)."""
    from prefect.settings import PREFECT_API_URL

    env = {**os.environ, "MLFLOW_TRACKING_URI": mlflow_uri, "PREFECT_API_URL": PREFECT_API_URL.value(),
           "PYTHONUNBUFFERED": "1"}
    if not prefect_api:
        env.pop("PREFECT_API_URL")
    proc = subprocess.run([sys.executable, "flows/diagnose.py", *args], cwd=ROOT, env=env, text=True,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=timeout)
    client = MlflowClient(mlflow_uri)
    runs = [r for e in client.search_experiments() for r in client.search_runs([e.experiment_id])]
    parents = [r for r in runs if r.data.tags.get("specdiag.kind") == "diagnosis"]
    assert parents, proc.stdout[-3000:]
    parent = max(parents, key=lambda r: r.info.start_time)  # this command's, where a test runs several
    arms = {r.data.tags["specdiag.arm"]: r for r in runs if r.data.tags.get("specdiag.kind") == "arm"
            and r.data.tags.get("mlflow.parentRunId") == parent.info.run_id}
    return Diagnosis(proc.returncode, proc.stdout, client, parent, arms)


@pytest.fixture
def cli(prefect_server, mlflow_uri):
    """`python flows/diagnose.py ARGS` on this test's MLflow store (diagnose above)."""
    return lambda *args, **kw: diagnose(mlflow_uri, *args, **kw)


@pytest.fixture(scope="session")
def demo_store(tmp_path_factory) -> str:
    """One MLflow store for the end-to-end tests that build on the demo diagnosis below (tests/e2e): what they
    measure with the demo's settings reuses its arms, as a user's next diagnosis does."""
    return f"sqlite:///{tmp_path_factory.mktemp('demo-store')}/mlflow.db"


@pytest.fixture
def demo_cli(prefect_server, demo_store):
    """`python flows/diagnose.py ARGS` on the demo store: what it measures with the demo's settings (the baseline, the
    control) is the demo diagnosis's, reused."""
    return lambda *args, **kw: diagnose(demo_store, *args, **kw)


@pytest.fixture(scope="session")
def demo(prefect_server, demo_store) -> Diagnosis:
    """The README's main job, `python flows/diagnose.py` with every default, run once per test session on the demo
    store: tests/e2e/test_demo_diagnosis.py checks its record; other tests reuse its arms or compare with its verdict
    (the sequential run of the diagnosis that test_spread spreads over two hosts)."""
    return diagnose(demo_store)
