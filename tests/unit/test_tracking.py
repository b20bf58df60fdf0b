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
