"""End-to-end fixtures: a real Prefect server, a real MLflow store, real vLLM CPU servers."""
import os
import subprocess

import pytest

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


@pytest.fixture
def no_servers_left():
    """After the test: no server this tool launched is alive, and none is left in its registry."""
    yield
    from infra import registry

    leftover = subprocess.run(["pgrep", "-f", "vllm.entrypoints.openai.api_server"], capture_output=True, text=True)
    assert leftover.stdout.strip() == "", f"vLLM server processes left behind: {leftover.stdout}"
    assert registry.launched() == []
