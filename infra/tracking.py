"""The MLflow record: one experiment per profile, a parent run per diagnosis, a child run per arm.

Everything goes through MlflowClient with explicit run ids: MLflow's active run is thread-local and
Prefect tasks do not see it.
"""
from __future__ import annotations

import logging
import os
import shutil
import signal
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

import pandas as pd
from mlflow.entities import Metric, Param, Run
from mlflow.exceptions import MlflowException
from mlflow.tracking import MlflowClient

from infra import registry
from infra.config import PROJECT_ROOT, SpecdiagError
from infra.secrets import redact

MAX_PARAM = 6000


class Tag:
    """Every tag specdiag writes or reads on a run: the names live here only."""

    KIND, ARM, ROLE, DRAFTER, PROBE = "specdiag.kind", "specdiag.arm", "specdiag.role", "specdiag.drafter", \
        "specdiag.probe"
    ERROR = "specdiag.error"
    SERVED = "specdiag.served"  # how an arm was served: fresh load, swapped into <run>, on <arm>'s server, reused <run>
    ASKED, EARLY_STOP = "specdiag.asked", "specdiag.early_stop"  # what a window measured towards, and why it ended
    FINGERPRINT, REUSED_FROM, REUSED_AT = "specdiag.fingerprint", "specdiag.reused_from", "specdiag.reused_at"
    VERDICT, ARM_VERDICT, CONFIRMED = "specdiag.verdict", "specdiag.arm_verdict", "specdiag.confirmed"
    OFFLINE_EVAL, INTERRUPTED = "specdiag.offline_eval", "specdiag.interrupted"
    OWNER = "specdiag.owner"  # the process that ends the run: registry.owner()
    PARENT = "mlflow.parentRunId"

# A new sqlite store logs "Creating initial MLflow database tables..." to stderr on first use: on a new user's first
# run, before anything specdiag says (a bad input's one-line error included). Warnings still show.
logging.getLogger("mlflow.store.db.utils").setLevel(logging.WARNING)


def interruption(exc: BaseException) -> bool:
    """Ctrl-C (KeyboardInterrupt), or SIGTERM / a Prefect cancellation (Prefect's TerminationSignal): not a fault of
    the arm, and not an Exception, so `except Exception` lets it through to the `finally` blocks."""
    return not isinstance(exc, (Exception, GeneratorExit))


def signal_name(exc: BaseException) -> str:
    sig = getattr(exc, "signal", None)  # Prefect's TerminationSignal carries the signal number
    return signal.Signals(sig).name if sig else "SIGINT" if isinstance(exc, KeyboardInterrupt) else type(exc).__name__


def interrupted_where(exc: BaseException) -> str:
    """The note `Tracker.interrupts` left on the exception (or on the one it was raised from), if any."""
    while exc is not None:
        notes = getattr(exc, "__notes__", None)
        if notes:
            return notes[-1]
        exc = exc.__cause__ or exc.__context__
    return "before any arm started"


def tracking_uri() -> str:
    return os.environ.get("MLFLOW_TRACKING_URI") or f"sqlite:///{PROJECT_ROOT / 'mlflow.db'}"


MIN_FREE_MB = 200  # what a diagnosis's logs and tables need, with room to spare


def check_store(uri: str | None = None) -> None:
    """Before any server starts: the MLflow store can be reached and written, artifacts included, with room left."""
    uri = uri or tracking_uri()
    fix = "set MLFLOW_TRACKING_URI to a writable store (e.g. sqlite:///$HOME/specdiag/mlflow.db)"
    try:
        MlflowClient(tracking_uri=uri).search_experiments(max_results=1)
    except Exception as exc:
        raise SpecdiagError(f"MLflow store {uri} cannot be used ({str(exc).splitlines()[0][:200]}): {fix}") from None
    if not uri.startswith("sqlite:///"):
        return
    artifacts = Path(uri[len("sqlite:///"):]).parent / "mlruns"  # where Tracker.experiment puts them
    try:
        artifacts.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=artifacts):
            pass
    except OSError as exc:
        raise SpecdiagError(f"MLflow artifacts cannot be written to {artifacts} ({exc.strerror}): {fix}") from None
    free_mb = shutil.disk_usage(artifacts).free / 2**20
    if free_mb < MIN_FREE_MB:
        raise SpecdiagError(f"the MLflow store's disk is full: {free_mb:.0f} MB free at {artifacts} "
                            f"(a diagnosis needs {MIN_FREE_MB}): free space or {fix}")


def run_path(experiment_id: str, run_id: str) -> str:
    """A run's page in MLflow's UI; MLflow 3 opens in its GenAI views unless the link asks for model training."""
    return f"#/experiments/{experiment_id}/runs/{run_id}?workflowType=machine_learning"


# Housekeeping: where the time went, what cleanup did, the log's cross-check of the counters. Recorded under `sys/`,
# so MLflow's chart view groups them apart and the figures the verdict reads lead it under their own names.
HOUSEKEEPING = frozenset({
    "host_lock_wait_s", "server_ready_s", "swap_s", "bench_s", "bench_duration_s", "arm_wall_s", "overhead_s",
    "diagnosis_wall_s", "startup_s", "setup_s", "offline_s", "arms_s", "finish_s", "stale_servers_stopped", "shm_files_removed", "early_stopped", "requests_ok",
    "requests_failed", "output_tokens", "log_spec_lines", "log_accepted_tokens", "log_draft_tokens",
    "log_acceptance_rate"})


def metric_key(name: str) -> str:
    """The name a metric is recorded under in MLflow."""
    return f"sys/{name}" if name in HOUSEKEEPING else name


def metric_name(key: str) -> str:
    """The name the flow holds a metric under, from its MLflow key (metric_key's inverse)."""
    return key.removeprefix("sys/")


# One colour per role, in MLflow's charts (the UI reads the mlflow.runColor tag) and in our plots alike: the
# baseline grey, the candidate red, the control green, far apart rather than MLflow's neighbouring blues.
RUN_COLOR = "mlflow.runColor"
ROLE_COLORS = {"baseline": "#7f7f7f", "candidate": "#d62728", "control": "#2ca02c", "extra": "#ff7f0e",
               "probe": "#9467bd", "confirm": "#17becf"}

EXPERIMENT_KIND = "mlflow.experimentKind"  # MLflow 3's UI picks GenAI or model-development views from it
NOTE = "mlflow.note.content"


TEXT_SUFFIXES = (".log", ".txt", ".md", ".json", ".jsonl", ".html", ".csv", ".yaml", ".yml")


class Tracker:
    def __init__(self, uri: str | None = None):
        self.uri = uri or tracking_uri()
        self.client = MlflowClient(tracking_uri=self.uri)

    def experiment(self, name: str) -> str:
        """The profile's experiment, tagged so that MLflow's UI opens it as ordinary runs (not its GenAI views)."""
        found = self.client.get_experiment_by_name(name)
        if found and found.tags.get(EXPERIMENT_KIND) == "custom_model_development":
            return found.experiment_id
        location = None
        if self.uri.startswith("sqlite:///"):  # artifacts in mlruns/ beside the database
            location = (Path(self.uri[len("sqlite:///"):]).parent / "mlruns").as_uri()
        eid = found.experiment_id if found else self.client.create_experiment(name, artifact_location=location)
        self.client.set_experiment_tag(eid, EXPERIMENT_KIND, "custom_model_development")
        self.client.set_experiment_tag(eid, NOTE, f"specdiag diagnoses on profile {name!r}: each top-level run is one "
                                       "diagnosis (its description is the verdict and the comparison); its child runs "
                                       "are the arms (baseline, candidate, control, extras, probes), one server each.")
        return eid

    def note(self, run_id: str, text: str) -> None:
        """The run's description: what its page in MLflow opens on."""
        self.client.set_tag(run_id, NOTE, redact(text))

    def start(self, experiment_id: str, name: str, tags: dict[str, str], parent: str | None = None) -> str:
        """A run tagged with the process that ends it (Tag.OWNER): if that process dies unended, the next start ends
        it."""
        tags = {**tags, Tag.OWNER: registry.owner_tag(registry.owner()), **({Tag.PARENT: parent} if parent else {})}
        return self.client.create_run(experiment_id, run_name=name, tags=tags).info.run_id

    def end_orphans(self, experiment_id: str) -> list[str]:
        """Runs of this experiment left RUNNING by a specdiag process of this machine that is gone (SIGKILL, OOM, a
        reboot): ended KILLED, with why. A run of a live process, or of another machine, is left alone."""
        ended = []
        for run in self.client.search_runs([experiment_id], "attributes.status = 'RUNNING'", max_results=1000):
            owner = registry.owner_of(run.data.tags.get(Tag.OWNER))
            if owner is None or registry.owner_alive(owner):  # another's run, or a live process's
                continue
            why = (f"its process (pid {owner['owner_pid']} on {owner['machine']}) ended without ending the run "
                   "(SIGKILL, out of memory, a reboot); ended KILLED by the next diagnosis")
            self.client.set_tag(run.info.run_id, Tag.ERROR, why)
            self.client.set_terminated(run.info.run_id, "KILLED")
            ended.append(run.info.run_id)
        if ended:
            print(f"ended {len(ended)} run(s) left RUNNING by a diagnosis that died: KILLED")
        return ended

    def params(self, run_id: str, params: dict[str, object]) -> None:
        batch = [Param(k, redact(str(v))[:MAX_PARAM]) for k, v in params.items()]
        for i in range(0, len(batch), 100):
            self.client.log_batch(run_id, params=batch[i:i + 100])

    def metrics(self, run_id: str, metrics: dict[str, float]) -> None:
        now = int(time.time() * 1000)
        batch = [Metric(metric_key(k), float(v), now, 0) for k, v in metrics.items() if v == v]  # skip NaN
        for i in range(0, len(batch), 500):
            self.client.log_batch(run_id, metrics=batch[i:i + 500])

    def tag(self, run_id: str, key: str, value: str) -> None:
        self.client.set_tag(run_id, key, redact(value))

    def file(self, run_id: str, path: str | Path, subdir: str | None = None) -> None:
        """A file as an artifact; a text file (a server log, a report) with every secret value redacted."""
        if not (path and Path(path).is_file()):
            return
        path = Path(path)
        if path.suffix not in TEXT_SUFFIXES:
            self.client.log_artifact(run_id, str(path), subdir)
            return
        with tempfile.TemporaryDirectory() as tmp:
            copy = Path(tmp) / path.name
            copy.write_text(redact(path.read_text(errors="replace")))
            self.client.log_artifact(run_id, str(copy), subdir)

    def text(self, run_id: str, text: str, name: str) -> None:
        self.client.log_text(run_id, redact(text), name)

    def table(self, run_id: str, frame: pd.DataFrame, name: str) -> None:
        """`name` as CSV, plus MLflow's table artifact beside it (`<stem>.json`): shown as a table in the UI and
        loadable across arms: `MlflowClient().load_table(experiment_id, "<stem>.json", extra_columns=["run_id"])`."""
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / name
            frame.to_csv(path, index=False)
            self.client.log_artifact(run_id, str(path))
        self.client.log_table(run_id, frame, f"{Path(name).stem}.json")

    def finish(self, run_id: str, ok: bool, killed: bool = False) -> None:
        self.client.set_terminated(run_id, "FINISHED" if ok else "KILLED" if killed else "FAILED")

    @contextmanager
    def terminated(self, run_id: str):
        """The run ends FINISHED when the block completes, FAILED when it raises, KILLED when interrupted (Ctrl-C,
        SIGTERM, a Prefect cancellation)."""
        ok, killed = False, False
        try:
            yield
            ok = True
        except BaseException as exc:
            killed = interruption(exc)
            raise
        finally:
            self.finish(run_id, ok, killed)

    @contextmanager
    def interrupts(self, parent: str, arm: str):
        """An interruption inside the block names ARM on the parent run (tag specdiag.interrupted) and in a note."""
        try:
            yield
        except BaseException as exc:
            if interruption(exc):
                self.tag(parent, Tag.INTERRUPTED, f"{arm} ({signal_name(exc)})")
                exc.add_note(f"during arm {arm}")
            raise

    # -- reads: every query of the record goes through these ------------------------------------------------------
    def run(self, run_id: str) -> Run:
        """The run as recorded; SpecdiagError naming the store where there is none."""
        try:
            return self.client.get_run(run_id)
        except MlflowException:
            raise SpecdiagError(f"no run {run_id} in the MLflow store {self.uri} (MLFLOW_TRACKING_URI)") from None

    def children(self, experiment_id: str, parent: str, finished_arms: bool = False) -> list[Run]:
        """The runs under PARENT, oldest first (only the arms that ended FINISHED, with finished_arms)."""
        where = f"tags.`{Tag.PARENT}` = '{parent}'"
        if finished_arms:
            where += f" and tags.`{Tag.KIND}` = 'arm' and attributes.status = 'FINISHED'"
        return self.client.search_runs([experiment_id], where, order_by=["attributes.start_time ASC"])

    def arm_run(self, experiment_id: str, parent: str, arm: str) -> Run | None:
        """The newest run of ARM under PARENT."""
        where = f"tags.`{Tag.PARENT}` = '{parent}' and tags.`{Tag.ARM}` = '{arm}' and tags.`{Tag.KIND}` = 'arm'"
        found = self.client.search_runs([experiment_id], where, order_by=["attributes.start_time DESC"],
                                        max_results=1)
        return found[0] if found else None

    def newest_finished(self, tag: str, value: str, since_s: float) -> Run | None:
        """The newest FINISHED run of any experiment whose TAG is VALUE, started after since_s (epoch seconds)."""
        ids = [e.experiment_id for e in self.client.search_experiments()]
        runs = self.client.search_runs(ids, f"tags.`{tag}` = '{value}' and attributes.status = 'FINISHED' "
                                       f"and attributes.start_time >= {int(since_s * 1000)}",
                                       order_by=["attributes.start_time DESC"], max_results=1)
        return runs[0] if runs else None

    def artifact_names(self, run_id: str) -> set[str]:
        return {a.path for a in self.client.list_artifacts(run_id)}

    def download(self, run_id: str, path: str, into: str | Path) -> Path:
        """An artifact (a file, or "" for all of them) of the run, copied into INTO."""
        return Path(self.client.download_artifacts(run_id, path, str(into)))

    def folder(self, run_id: str, folder: str | Path) -> None:
        """Every file of FOLDER as the run's artifacts."""
        self.client.log_artifacts(run_id, str(folder))

    def run_link(self, experiment_id: str, run_id: str) -> str:
        """The run's page: on the tracking server, or on `mlflow ui`'s default address for a local store."""
        base = self.uri.rstrip("/") if self.uri.startswith(("http://", "https://")) else "http://127.0.0.1:5000"
        return f"{base}/{run_path(experiment_id, run_id)}"

    def run_url(self, experiment_id: str, run_id: str) -> str:
        return f"mlflow ui --backend-store-uri {self.uri}  ->  {run_path(experiment_id, run_id)}"

