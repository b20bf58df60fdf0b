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


def test_an_arm_stopped_before_its_server_ends_failed_with_its_reason(tmp_path):
    """A gated arm has no server log (log_path ""): recording it must still end the run FAILED, reason attached."""
    from tasks.record import ArmEvidence, ArmResult, record_arm

    tracker = Tracker(f"sqlite:///{tmp_path}/mlflow.db")
    run = tracker.start(tracker.experiment("t"), "cand", {"specdiag.kind": "arm"})
    result = ArmResult("cand", "candidate", run, error="StaticCheckFailed: d2t_missing", metrics={"arm_wall_s": 0.1})
    record_arm.fn(tracker, result, {}, ArmEvidence())
    got = tracker.client.get_run(run)
    assert got.info.status == "FAILED" and got.data.tags["specdiag.error"] == "StaticCheckFailed: d2t_missing"
    assert {a.path for a in tracker.client.list_artifacts(run)} == {"error.txt"}


def test_a_failure_while_recording_still_ends_the_run(tmp_path):
    from tasks.record import ArmEvidence, ArmResult, record_arm

    tracker = Tracker(f"sqlite:///{tmp_path}/mlflow.db")
    run = tracker.start(tracker.experiment("t"), "cand", {"specdiag.kind": "arm"})
    with pytest.raises(TypeError):
        record_arm.fn(tracker, ArmResult("cand", "candidate", run, ok=True), {}, ArmEvidence(log_path=123))
    assert tracker.client.get_run(run).info.status == "FAILED"


def test_the_experiment_opens_as_ordinary_runs_with_a_description_also_when_made_before(tmp_path):
    """MLflow 3's UI opens an experiment without 'mlflow.experimentKind' in its GenAI views ("Evaluations",
    "Training runs"); one made by an older specdiag gets the tag on its next diagnosis."""
    tracker = Tracker(f"sqlite:///{tmp_path}/mlflow.db")
    old = tracker.client.create_experiment("older")
    for name in ("fresh", "older"):
        exp = tracker.client.get_experiment(tracker.experiment(name))
        assert exp.tags["mlflow.experimentKind"] == "custom_model_development"
        assert exp.tags["mlflow.note.content"].startswith(f"specdiag diagnoses on profile {name!r}")
    assert tracker.experiment("older") == old
    run = tracker.start(old, "p", {})
    tracker.note(run, "# Verdict: `healthy`")
    assert tracker.client.get_run(run).data.tags["mlflow.note.content"] == "# Verdict: `healthy`"
