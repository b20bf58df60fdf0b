"""An under-trained drafter (smol-noisy) against the known-good control (smol-self) -> training_quality."""
import pytest
from mlflow.tracking import MlflowClient

from flows.diagnose import diagnose

pytestmark = pytest.mark.e2e


def test_noisy_drafter_is_named_training_quality(prefect_server, mlflow_uri, tmp_path, no_servers_left):
    results = diagnose("demo", "smol-noisy", "smol-self", sets=[f"host.workdir={tmp_path / 'runs'}"])
    assert all(r.ok for r in results)
    noisy = next(r for r in results if r.arm == "smol-noisy")
    control = next(r for r in results if r.arm == "smol-self")
    # tuned to land clearly between the permuted fault (~0) and the control (~1)
    assert 0.2 < noisy.metrics["acceptance_rate"] < 0.8
    assert control.metrics["acceptance_rate"] > 0.9
    parent = MlflowClient(mlflow_uri).get_run(
        MlflowClient(mlflow_uri).get_run(noisy.run_id).data.tags["mlflow.parentRunId"])
    assert parent.data.tags["specdiag.verdict"] == "training_quality"
