"""The MLflow record: one experiment per profile, a parent run per diagnosis, a child run per arm.

Everything goes through MlflowClient with explicit run ids: MLflow's active run is thread-local and
Prefect tasks do not see it.
"""
from __future__ import annotations

import os
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

import pandas as pd
from mlflow.entities import Metric, Param
from mlflow.tracking import MlflowClient

from infra.config import PROJECT_ROOT

MAX_PARAM = 6000


def tracking_uri() -> str:
    return os.environ.get("MLFLOW_TRACKING_URI") or f"sqlite:///{PROJECT_ROOT / 'mlflow.db'}"


class Tracker:
    def __init__(self, uri: str | None = None):
        self.uri = uri or tracking_uri()
        self.client = MlflowClient(tracking_uri=self.uri)

    def experiment(self, name: str) -> str:
        found = self.client.get_experiment_by_name(name)
        if found:
            return found.experiment_id
        location = None
        if self.uri.startswith("sqlite:///"):  # artifacts in mlruns/ beside the database
            location = (Path(self.uri[len("sqlite:///"):]).parent / "mlruns").as_uri()
        return self.client.create_experiment(name, artifact_location=location)

    def start(self, experiment_id: str, name: str, tags: dict[str, str], parent: str | None = None) -> str:
        if parent:
            tags = {**tags, "mlflow.parentRunId": parent}
        return self.client.create_run(experiment_id, run_name=name, tags=tags).info.run_id

    def params(self, run_id: str, params: dict[str, object]) -> None:
        batch = [Param(k, str(v)[:MAX_PARAM]) for k, v in params.items()]
        for i in range(0, len(batch), 100):
            self.client.log_batch(run_id, params=batch[i:i + 100])

    def metrics(self, run_id: str, metrics: dict[str, float]) -> None:
        now = int(time.time() * 1000)
        batch = [Metric(k, float(v), now, 0) for k, v in metrics.items() if v == v]  # skip NaN
        for i in range(0, len(batch), 500):
            self.client.log_batch(run_id, metrics=batch[i:i + 500])

    def tag(self, run_id: str, key: str, value: str) -> None:
        self.client.set_tag(run_id, key, value)

    def file(self, run_id: str, path: str | Path, subdir: str | None = None) -> None:
        if path and Path(path).is_file():
            self.client.log_artifact(run_id, str(path), subdir)

    def text(self, run_id: str, text: str, name: str) -> None:
        self.client.log_text(run_id, text, name)

    def table(self, run_id: str, frame: pd.DataFrame, name: str) -> None:
        """`name` as CSV, plus MLflow's table artifact beside it (`<stem>.json`): shown as a table in the UI and
        loadable across arms: `MlflowClient().load_table(experiment_id, "<stem>.json", extra_columns=["run_id"])`."""
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / name
            frame.to_csv(path, index=False)
            self.client.log_artifact(run_id, str(path))
        self.client.log_table(run_id, frame, f"{Path(name).stem}.json")

    def finish(self, run_id: str, ok: bool) -> None:
        self.client.set_terminated(run_id, "FINISHED" if ok else "FAILED")

    @contextmanager
    def terminated(self, run_id: str):
        """The run ends FINISHED when the block completes, FAILED when it raises (Ctrl-C included)."""
        ok = False
        try:
            yield
            ok = True
        finally:
            self.finish(run_id, ok)

    def run_url(self, experiment_id: str, run_id: str) -> str:
        return f"mlflow ui --backend-store-uri {self.uri}  ->  #/experiments/{experiment_id}/runs/{run_id}"

