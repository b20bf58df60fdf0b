"""Arm reuse: an arm whose fingerprint (infra/fingerprint.py) matches a successful arm already in MLflow is not
measured again. It becomes a child run of this diagnosis linked to the original (tag specdiag.reused_from), with the
original's params, metrics and artifacts, and the verdict reads it like a fresh one. `--fresh` measures everything;
`reuse.max_age_h` bounds how old a measurement may be."""
from __future__ import annotations

import tempfile
import time
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from subprocess import SubprocessError

import pandas as pd
from mlflow.entities import Run
from mlflow.exceptions import MlflowException
from prefect import task
from prefect.cache_policies import NO_CACHE

from infra import fingerprint
from infra.arms import Arm
from infra.config import Profile, SpecdiagError
from infra.executor import executor_for
from infra.tracking import Tag, Tracker, metric_name
from tasks.acceptance import request_acceptance
from tasks.bench import BenchResult
from tasks.earlystop import Questions
from tasks.record import ArmResult, arm_run, known_before
from tasks.verdict import speed_judged



@task(name="fingerprints", cache_policy=NO_CACHE)
def fingerprints(cfg: Profile, arms: list[Arm], target: str, prompts: list[str]) -> dict[str, dict]:
    """arm name -> its fingerprint's fields; the checkpoints are identified on the host that serves them."""
    paths = [target] + [p for a in arms if a.spec for p in (a.spec.model,) if p]
    from infra.embedded import engine_python
    executor = executor_for(cfg.host)
    try:
        ids = fingerprint.identify(executor, cfg.engine_python or engine_python(), sorted(set(paths)))
    except (SpecdiagError, OSError, SubprocessError, RuntimeError, ValueError) as exc:  # no reuse; nothing lost
        print(f"arm fingerprints unavailable ({exc}): every arm is measured, none is reused")
        return {}
    finally:
        executor.close()
    return {a.name: fingerprint.fields(cfg, a, target, prompts, ids, speed_judged(a.role, a.probe)) for a in arms}


def newest_match(tracker: Tracker, digest: str, max_age_h: float) -> Run | None:
    """The newest FINISHED arm run recorded with this fingerprint, in any experiment, no older than max_age_h."""
    return tracker.newest_finished(Tag.FINGERPRINT, digest, time.time() - max_age_h * 3600)


def per_request(folder: Path) -> tuple[list[float], list[float]]:
    """Each measured request's own tok/s and acceptance, from an arm's requests.csv in FOLDER (the paired speedup,
    the early stop and the per-request plot read them), as the flow computed them from the records."""
    if not (folder / "requests.csv").exists():
        return [], []
    bench = BenchResult.from_frame(pd.read_csv(folder / "requests.csv"))
    return bench.request_tok_s(), request_acceptance(bench.records)


def recorded_requests(tracker: Tracker, run_id: str) -> tuple[list[float], list[float]]:
    if "requests.csv" not in tracker.artifact_names(run_id):
        return [], []
    with tempfile.TemporaryDirectory() as tmp:
        tracker.download(run_id, "requests.csv", tmp)
        return per_request(Path(tmp))


BESIDE_S = 5.0  # how often an arm measured beside others looks for their results


def asked_beside(ask: Callable[[dict], Questions], known: dict[str, object], tracker: Tracker, experiment_id: str,
                 parent_run_id: str) -> Callable[[], Questions]:
    """The early stop's questions, ask(known), for an arm measured beside its diagnosis's other arms (spread over
    hosts). known: the numbers its questions compare with, by role (the baseline's per-request tok/s, the candidate's or
    the control's metrics), None where not measured when it started: read from those arms' MLflow runs once they end
    well, at most every BESIDE_S, until none is missing. A candidate then settles its tok/s against the baseline and its
    acceptance against the control (one reused ends at once), a probe its acceptance against where its comparison with
    the candidate flips, as they would measured one after another."""
    known, due = dict(known), [0.0]
    asked = [ask(known)]

    def current() -> Questions:
        missing = [role for role, value in known.items() if value is None]
        if not missing or time.monotonic() < due[0]:
            return asked[0]
        due[0] = time.monotonic() + BESIDE_S
        try:
            for run in tracker.children(experiment_id, parent_run_id, finished_arms=True):
                role = run.data.tags.get(Tag.ROLE)
                if role == "baseline" and role in missing:
                    known[role] = recorded_requests(tracker, run.info.run_id)[0] or None
                elif role in missing:  # the candidate's or the control's acceptance
                    known[role] = {metric_name(k): v for k, v in run.data.metrics.items()}
        except (MlflowException, OSError) as exc:  # a blip: asked again at the next request
            print(f"could not read the arms measured beside this one: {exc}")
        asked[0] = ask(known)
        return asked[0]
    return current


def arm_result(tracker: Tracker, run: Run, role: str | None = None) -> ArmResult:
    """An arm as the flow held it after measuring, read back from its MLflow run."""
    tags, params = run.data.tags, run.data.params
    return ArmResult(tags[Tag.ARM], role or tags[Tag.ROLE], run.info.run_id,
                     run.info.status == "FINISHED", tags.get(Tag.ERROR, ""),
                     {metric_name(k): v for k, v in run.data.metrics.items()},
                     *recorded_requests(tracker, run.info.run_id), "" if tags.get(Tag.PROBE) == "none" else
                     tags.get(Tag.PROBE, ""), "" if params.get("spec_method", "none") == "none" else
                     params["spec_method"], int(params.get("num_speculative_tokens", 0)),
                     reused_from=tags.get(Tag.REUSED_FROM, ""), served_with=params.get("server_shared_with", ""),
                     swapped_into=tags.get(Tag.SERVED, "").removeprefix("swapped into ")
                     if tags.get(Tag.SERVED, "").startswith("swapped into ") else "")


@task(name="reuse-arm", cache_policy=NO_CACHE)
def reuse_arm(tracker: Tracker, found: Run, arm: Arm, experiment_id: str, parent_run_id: str,
              offline: dict[str, float] | None) -> ArmResult:
    """The found run as this diagnosis's arm: a FINISHED child run with its params, metrics and artifacts."""
    original = found.data.tags.get(Tag.REUSED_FROM, found.info.run_id)
    when = datetime.fromtimestamp(found.info.start_time / 1000).strftime("%Y-%m-%d %H:%M")
    name, tags = arm_run(arm)
    tags.update({Tag.FINGERPRINT: found.data.tags[Tag.FINGERPRINT], Tag.REUSED_FROM: original, Tag.REUSED_AT: when,
                 Tag.SERVED: f"reused {original}"})
    run = tracker.start(experiment_id, f"{name} (reused)", tags, parent=parent_run_id)
    metrics = {metric_name(k): v for k, v in found.data.metrics.items() if not k.startswith("offline_")}
    metrics.update(known_before(arm, offline))
    copied = False
    try:
        tracker.params(run, {**found.data.params, "reused_from": original})
        tracker.metrics(run, metrics)
        with tempfile.TemporaryDirectory() as tmp:
            folder = tracker.download(found.info.run_id, "", tmp)
            tracker.folder(run, folder)
            tok_s, acceptance = per_request(Path(folder))
        copied = True
    finally:
        tracker.finish(run, copied)
    print(f"[{arm.name}] reused from run {original[:8]} (measured {when}): same fingerprint, no server load")
    return ArmResult(arm.name, arm.role, run, True, "", metrics, tok_s, acceptance, arm.probe,
                     arm.spec.method if arm.spec else "", arm.spec.num_speculative_tokens if arm.spec else 0,
                     reused_from=f"{original[:8]} ({when})")


PROFILE = "profile.json"  # a diagnosis's profile, whole (secret values as markers: infra/secrets.py)


def rerun_inputs(tracker: Tracker, run_id: str, into: Path) -> tuple[str, list[str]]:
    """A recorded diagnosis's profile and prompt texts as files in INTO, and the settings that repeat it exactly:
    `--rerun RUN_ID` measures every arm again (no reuse) on the same prompts."""
    run = tracker.run(run_id)
    if run.data.tags.get(Tag.KIND) != "diagnosis":
        parent = run.data.tags.get(Tag.PARENT)
        raise SpecdiagError(f"run {run_id} is not a diagnosis" + (f": pass its diagnosis, --rerun {parent}" if parent
                                                                   else ""))
    names = tracker.artifact_names(run_id)
    if "prompts.jsonl" not in names or not (PROFILE in names or "profile_json" in run.data.params):
        raise SpecdiagError(f"diagnosis {run_id} was recorded without its profile or prompts: it cannot be repeated")
    into.mkdir(parents=True, exist_ok=True)
    profile = into / "profile.yaml"  # JSON is YAML; secret env values are markers, taken from this environment
    if PROFILE in names:
        profile.write_text(tracker.download(run_id, PROFILE, into).read_text())
    else:  # recorded before 2026-12-07: a parameter, cut at MLflow's limit for long profiles
        profile.write_text(run.data.params["profile_json"])
    tracker.download(run_id, "prompts.jsonl", into)
    return str(profile), [f"bench.prompts={into / 'prompts.jsonl'}", "reuse.enabled=false"]
