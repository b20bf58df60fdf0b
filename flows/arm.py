"""One arm: cleanup -> launch -> wait -> warmup -> scrape -> bench -> scrape -> teardown -> record."""
# No `from __future__ import annotations` here: a served run's process gets this flow's function pickled by value,
# with only the globals its code uses, so string annotations ('Profile') cannot be resolved there.

import json
import time
from contextlib import ExitStack
from pathlib import Path

from prefect import flow
from pydantic import TypeAdapter

from infra import vllm
from infra.arms import Arm, local_dir, plan_server
from infra.config import Profile
from infra.executor import executor_for
from infra.fingerprint import digest
from infra.hostlock import host_lock
from infra.spread import RemoteRuns
from infra.stats import mean_interval
from infra.tracking import Tracker, interruption, signal_name
from tasks.acceptance import request_acceptance, request_metrics
from tasks.bench import benchmark, sweep, sweep_metrics, warmup
from tasks.cleanup import cleanup
from tasks.health import wait_healthy
from tasks.launch import launch_server
from tasks.record import ArmEvidence, ArmResult, arm_run, known_before, record_arm
from tasks.reuse import FINGERPRINT, arm_result, asked_beside
from tasks.scrape import counter_metrics, log_crosscheck, scrape, spec_totals, spec_window
from tasks.teardown import stop_unreturned, teardown
from tasks.verdict import questions, speed_judged


@flow(name="arm", flow_run_name="arm-{arm.name}", log_prints=True)
def run_arm(cfg: Profile, arm: Arm, tracking_uri: str, experiment_id: str, parent_run_id: str,
            workdir: str, prompts: list[str], offline: dict[str, float] | None = None,
            baseline_tok_s: list[float] | None = None, blockers: list[str] | None = None,
            fingerprint: dict | None = None, candidate: dict[str, float] | None = None,
            beside: bool = False) -> ArmResult:
    """baseline_tok_s: the baseline arm's per-request tok/s, once measured: the early stop compares with it.
    candidate: the candidate arm's metrics, once measured: a control's early stop compares with its acceptance
    (tasks/verdict/evidence.questions; other roles ignore it).
    blockers: static findings that make a server load pointless; the arm then fails before its server starts.
    fingerprint: what decides the measurement (infra/fingerprint.py): tagged by digest, so a later diagnosis reuses it.
    beside: measured beside the diagnosis's other arms (spread over hosts): what of baseline_tok_s and candidate
    was not known at its start is read from their MLflow runs as they end (tasks/reuse.asked_beside)."""
    tracker = Tracker(tracking_uri)
    run_name, tags = arm_run(arm)
    if fingerprint:
        tags[FINGERPRINT] = digest(fingerprint)
    result = ArmResult(arm.name, arm.role, tracker.start(experiment_id, run_name, tags, parent=parent_run_id),
                       probe=arm.probe, method=arm.spec.method if arm.spec else "",
                       k=arm.spec.num_speculative_tokens if arm.spec else 0)
    if fingerprint:
        tracker.text(result.run_id, json.dumps(fingerprint, indent=1, sort_keys=True, default=str), "fingerprint.json")
    bench_cfg = arm.bench_config(cfg)
    ev, server, params, start = ArmEvidence(metrics=known_before(arm, offline)), None, {}, time.monotonic()
    executor, held = executor_for(cfg.host), ExitStack()
    try:
        if blockers:
            raise StaticCheckFailed("; ".join(blockers) + " (the server was not started; --force launches anyway)")
        # one server per host at a time, across flow runs: queued here, held until teardown
        ev.metrics["host_lock_wait_s"] = held.enter_context(host_lock(cfg.host, cfg.server_port))
        plan = plan_server(cfg, arm, workdir)
        params, ev.log_path = plan.params, plan.log_path
        ev.metrics.update(cleanup(executor, cfg.host))
        server = launch_server(plan, executor)
        ev.server_cmd = server.process.command
        ev.metrics["server_ready_s"] = wait_healthy(server, cfg.health_timeout_s)
        bench_start = time.monotonic()
        warmup(server.base_url, bench_cfg, prompts[:cfg.bench.warmup])
        ev.before = scrape(server)
        ev.bench = benchmark(server.base_url, bench_cfg, prompts[cfg.bench.warmup:],
                             spec_window(server, ev.before) if arm.spec else None,
                             _asks(arm, offline, baseline_tok_s, candidate, beside, tracker,
                                   (experiment_id, parent_run_id)), arm.name)
        ev.after = scrape(server)
        ev.metrics["bench_s"] = time.monotonic() - bench_start
        ev.metrics.update(counter_metrics(arm.name, ev.before, ev.after, speculative=arm.spec is not None))
        if cfg.bench.concurrency_sweep:  # load shapes beyond the verdict's window, on the same server
            ev.sweep = sweep(server.base_url, bench_cfg, prompts[cfg.bench.warmup:],
                             spec_totals(server) if arm.spec else None)
            ev.metrics.update(sweep_metrics(ev.sweep))
        result.ok = True
    except Exception as exc:  # the arm fails; the diagnosis goes on with the other arms
        result.error = f"{type(exc).__name__}: {exc}"
        ev.bench = ev.bench or getattr(exc, "result", None)
        print(f"[{arm.name}] FAILED: {result.error}")
    except BaseException as exc:  # Ctrl-C, SIGTERM, a Prefect cancellation: the same teardown, then on up
        result.interrupted, result.error = interruption(exc), f"interrupted ({signal_name(exc)}) during arm {arm.name}"
        ev.bench = ev.bench or getattr(exc, "result", None)
        print(f"[{arm.name}] {result.error}: stopping its server")
        raise
    finally:
        if server is not None:
            try:
                ev.metrics["shm_files_removed"] = teardown(server)
            except Exception as exc:
                result.ok, result.error = False, f"{result.error}\nteardown: {exc}".strip()
        else:
            stop_unreturned(executor, arm.name)
        held.close()  # the host is free for the next server
        log_text = executor.read_tail(ev.log_path, 1 << 20) if ev.log_path else ""
        ev.engine_version = vllm.parse_engine_version(log_text) or ""
        if ev.before:
            ev.metrics.update(log_crosscheck(executor, ev.log_path, ev.before))
        if ev.log_path and executor.host != "local":  # the log lands in MLflow from a local copy
            ev.log_path = str(_fetch(executor, ev.log_path, local_dir(parent_run_id)))
        if ev.bench:
            ev.metrics.update(ev.bench.summary() | request_metrics(ev.bench.records))
            result.request_tok_s = ev.bench.request_tok_s()
            result.request_acceptance = request_acceptance(ev.bench.records)
        ev.metrics["arm_wall_s"] = time.monotonic() - start
        ev.metrics["overhead_s"] = ev.metrics["arm_wall_s"] - ev.metrics.get("server_ready_s", 0.0) \
            - ev.metrics.get("bench_s", 0.0) - ev.metrics.get("host_lock_wait_s", 0.0)
        result.metrics = ev.metrics
        record_arm(tracker, result, params, ev)
        executor.close()
    return result


def _asks(arm: Arm, offline, baseline_tok_s, candidate, beside: bool, tracker: Tracker, where: tuple[str, str]):
    """What the verdict will ask of this arm, for its early stop; where measured beside the other arms, learned as the
    one its questions compare with ends: the candidate for a control, the baseline for an arm whose speed is judged."""
    def ask(learned: dict):
        tok_s, cand = learned.get("baseline", baseline_tok_s), learned.get("candidate", candidate)
        return questions(arm.role, offline, mean_interval(tok_s)[1:] if tok_s and len(tok_s) > 1 else None, cand,
                         arm.position_limit, arm.spec.num_speculative_tokens if arm.spec else 1)
    wants = {"candidate": candidate} if arm.role == "control" else \
        {"baseline": baseline_tok_s} if speed_judged(arm.role) and arm.role != "baseline" else {}
    return asked_beside(ask, wants, tracker, *where) if beside and wants else ask({})


def remote_arm(runs: RemoteRuns, host: str, params: dict) -> ArmResult:
    """run_arm(**params) by the worker of HOST (infra/spread.py), read back from the MLflow run it recorded."""
    arm, tracker = params["arm"], Tracker(params["tracking_uri"])
    flow_run = runs.run(host, TypeAdapter(dict).dump_python(params, mode="json"), arm.name)
    where = (f"tags.mlflow.parentRunId = '{params['parent_run_id']}' and tags.`specdiag.arm` = '{arm.name}' "
             f"and tags.`specdiag.kind` = 'arm'")
    found = tracker.client.search_runs([params["experiment_id"]], where, order_by=["attributes.start_time DESC"],
                                       max_results=1)
    if found:
        return arm_result(tracker, found[0], arm.role)
    error = f"its flow run {flow_run.name} on host {host} ended {flow_run.state.name} before recording anything: " \
            f"{flow_run.state.message or 'see the worker log'}"
    name, tags = arm_run(arm)
    run_id = tracker.start(params["experiment_id"], name, tags, parent=params["parent_run_id"])
    tracker.tag(run_id, "specdiag.error", error[:500])
    tracker.finish(run_id, False)
    print(f"[{arm.name}] FAILED: {error}")
    return ArmResult(arm.name, arm.role, run_id, False, error)


class StaticCheckFailed(Exception):
    """A checkpoint fault that the engine would refuse or serve wrongly, found before the server load."""


def _fetch(executor, path: str, dest_dir: Path) -> Path:
    try:
        return executor.fetch(path, dest_dir / Path(path).name)
    except Exception as exc:  # a log that cannot be fetched must not hide what was measured
        print(f"could not fetch {path} from {executor.host}: {exc}")
        return dest_dir / Path(path).name
