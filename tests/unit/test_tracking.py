import pandas as pd
import pytest

from infra.tracking import Tracker


def test_runs_nest_and_a_failing_block_marks_the_run_failed(tmp_path):
    tracker = Tracker(f"sqlite:///{tmp_path}/mlflow.db")
    exp = tracker.experiment("t")
    parent = tracker.start(exp, "p", {"specdiag.kind": "diagnosis"})
    child = tracker.start(exp, "c", {"specdiag.kind": "arm"}, parent=parent)
    tracker.metrics(child, {"acceptance_rate": 0.5, "nan": float("nan")})
    with pytest.raises(RuntimeError):
        with tracker.terminated(parent):
            raise RuntimeError("boom")
    with tracker.terminated(child):
        pass
    client = tracker.client
    assert client.get_run(parent).info.status == "FAILED"
    run = client.get_run(child)
    assert run.info.status == "FINISHED" and run.data.tags["mlflow.parentRunId"] == parent
    assert run.data.metrics == {"acceptance_rate": 0.5}
    assert client.get_experiment(exp).artifact_location == (tmp_path / "mlruns").as_uri()


def test_tables_load_across_arms_with_mlflow(tmp_path, monkeypatch):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path}/mlflow.db")  # load_table searches globally
    tracker = Tracker(f"sqlite:///{tmp_path}/mlflow.db")
    exp = tracker.experiment("t")
    runs = [tracker.start(exp, arm, {"specdiag.kind": "arm"}) for arm in ("a", "b")]
    for i, run in enumerate(runs):
        tracker.table(run, pd.DataFrame({"index": [0, 1], "ttft_ms": [10.0 + i, 20.0 + i]}), "requests.csv")
    assert {a.path for a in tracker.client.list_artifacts(runs[0])} == {"requests.csv", "requests.json"}
    both = tracker.client.load_table(exp, "requests.json", run_ids=runs, extra_columns=["run_id"])
    assert len(both) == 4 and set(both["run_id"]) == set(runs)
    assert both.groupby("run_id")["ttft_ms"].sum().to_dict() == {runs[0]: 30.0, runs[1]: 32.0}
