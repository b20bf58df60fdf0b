"""A speculative config that silently does nothing -> `spec_disabled`, not "0% acceptance"."""
import pytest
from mlflow.tracking import MlflowClient

from flows.diagnose import diagnose

pytestmark = pytest.mark.e2e


def test_drafter_that_never_drafts_is_named_spec_disabled(prefect_server, mlflow_uri, tmp_path, no_servers_left):
    results = diagnose("demo", "ngram-never", None, sets=[f"host.workdir={tmp_path / 'runs'}", "control=null"])
    cand = next(r for r in results if r.arm == "ngram-never")
    assert cand.ok and cand.metrics["num_drafts"] == 0 and cand.metrics["output_tokens"] > 0
    parent = MlflowClient(mlflow_uri).get_run(
        MlflowClient(mlflow_uri).get_run(cand.run_id).data.tags["mlflow.parentRunId"])
    assert parent.data.tags["specdiag.verdict"] == "spec_disabled"
