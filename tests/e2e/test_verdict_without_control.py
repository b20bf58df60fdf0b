"""Two short diagnoses without a control: a config that silently does nothing, and a healthy drafter."""
import pytest
from mlflow.tracking import MlflowClient

from flows.diagnose import diagnose

pytestmark = pytest.mark.e2e


def _verdict(mlflow_uri, run_id):
    client = MlflowClient(mlflow_uri)
    return client.get_run(client.get_run(run_id).data.tags["mlflow.parentRunId"]).data.tags["specdiag.verdict"]


def test_drafter_that_never_drafts_is_named_spec_disabled(prefect_server, mlflow_uri, tmp_path, no_servers_left):
    results = diagnose("demo", "ngram-never", None, sets=[f"host.workdir={tmp_path / 'runs'}", "control=null"])
    cand = next(r for r in results if r.arm == "ngram-never")
    assert cand.ok and cand.metrics["num_drafts"] == 0 and cand.metrics["output_tokens"] > 0
    assert _verdict(mlflow_uri, cand.run_id) == "spec_disabled"


def test_target_as_its_own_drafter_is_named_healthy(prefect_server, mlflow_uri, tmp_path, no_servers_left):
    results = diagnose("demo", "smol-self", None, sets=[f"host.workdir={tmp_path / 'runs'}", "control=null"])
    cand = next(r for r in results if r.arm == "smol-self")
    assert cand.ok and cand.metrics["acceptance_rate"] > 0.9
    assert _verdict(mlflow_uri, cand.run_id) == "healthy"
