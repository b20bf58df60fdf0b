"""Every run ends (issue 39, item 4): whatever fails at the end of an arm (the host lock's release, the host gone when
its log is read), the arm's run is recorded with what it measured and ends FAILED, never RUNNING, and its server is
stopped. The arm is real (a vLLM CPU server, a benchmark window); the two failures are injected where the outside
world would fail: the Prefect call that releases the lease, and the executor's read of the server log."""
from contextlib import contextmanager

import pytest
from mlflow.tracking import MlflowClient

import flows.arm as arm_flow
from flows.diagnose import prepare
from infra.arms import resolved_drafters, run_dir
from infra.executor import LocalExecutor
from infra.hostlock import Held, Lapse
from infra.tracking import Tracker

pytestmark = pytest.mark.e2e


class HostGone(LocalExecutor):
    """This machine, whose log reads fail, as an SSH host's do once it is gone, from the server's teardown on."""

    gone = False

    def stop_group(self, pgid, grace_s=15.0):
        HostGone.gone = True
        return super().stop_group(pgid, grace_s)

    def read_tail(self, path, max_bytes=16_384):
        if HostGone.gone:
            raise OSError("Socket is closed")
        return super().read_tail(path, max_bytes)


def test_an_arm_whose_lock_release_and_log_read_fail_still_ends_recorded(prefect_server, mlflow_uri, monkeypatch,
                                                                        no_servers_left):
    @contextmanager
    def lock_that_cannot_be_released(host, port, progress_s=15.0):
        yield Held(0.0, Lapse())
        raise RuntimeError("Prefect server unreachable: the lease could not be released")

    monkeypatch.setattr(arm_flow, "host_lock", lock_that_cannot_be_released)
    monkeypatch.setattr(arm_flow, "executor_for", lambda host: HostGone())
    cfg, plan, prompts = prepare("demo", {"drafter": "ngram", "control": ""},
                                 ["bench.num_prompts=2", "bench.max_tokens=8"])
    tracker = Tracker(mlflow_uri)
    experiment = tracker.experiment(cfg.name)
    parent = tracker.start(experiment, "runs end", {"specdiag.kind": "diagnosis"})
    arm = resolved_drafters(plan)[1]
    [result] = arm_flow.run_arm(cfg, arm, mlflow_uri, experiment, parent, run_dir(cfg, parent), prompts)
    run = MlflowClient(mlflow_uri).get_run(result.run_id)
    assert run.info.status == "FAILED", run.info.status
    assert "releasing the host lock: RuntimeError: Prefect server unreachable" in run.data.tags["specdiag.error"] + \
        result.error
    assert run.data.metrics["output_tok_s"] > 0 and run.data.metrics["sys/requests_ok"] == 2  # what it measured
    assert "num_drafts" in run.data.metrics
    assert "server_cmd" in run.data.params
