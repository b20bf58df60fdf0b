"""An under-trained drafter (smol-noisy) against the known-good control (smol-self) -> training_quality, measured
with early stop on: each arm ends once the real counters, read mid-window, say enough."""
import pytest
from mlflow.tracking import MlflowClient

from flows.diagnose import diagnose

pytestmark = pytest.mark.e2e


def test_noisy_drafter_is_named_training_quality(prefect_server, mlflow_uri, tmp_path, no_servers_left):
    results = diagnose("demo", "smol-noisy", "smol-self", sets=[f"host.workdir={tmp_path / 'runs'}",
                                                                 "bench.early_stop=true", "bench.num_prompts=9"])
    assert all(r.ok for r in results)
    noisy = next(r for r in results if r.arm == "smol-noisy")
    control = next(r for r in results if r.arm == "smol-self")
    # tuned to land clearly between the permuted fault (~0) and the control (~1)
    assert 0.2 < noisy.metrics["acceptance_rate"] < 0.8
    assert control.metrics["acceptance_rate"] > 0.9
    client = MlflowClient(mlflow_uri)
    parent = client.get_run(client.get_run(noisy.run_id).data.tags["mlflow.parentRunId"])
    assert parent.data.tags["specdiag.verdict"] == "training_quality"
    # the control accepts everything: 30 drafts put its interval clear of the verdict's thresholds, well before
    # the 8-request cap (a broken mid-window counter read would leave only the tok/s rule, without "acceptance")
    assert control.metrics["requests_ok"] < 8 and control.metrics["early_stopped"] == 1.0
    assert "acceptance" in client.get_run(control.run_id).data.tags["specdiag.early_stop"]
