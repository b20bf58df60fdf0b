"""One server: cleanup -> launch -> wait -> per arm (warmup -> scrape -> bench -> scrape) -> teardown -> record.

Most servers measure one arm. Arms that would start the very same server and whose speed the verdict does not judge
(a probe that changes only the benchmark: raw_prompts, temperature, thinking) ride on it after the arm that loaded it
(infra/arms.shared_servers): each in its own MLflow run and window, for one load instead of one each.
"""
# No `from __future__ import annotations` here: a served run's process gets this flow's function pickled by value,
# with only the globals its code uses, so string annotations ('Profile') cannot be resolved there.

import json
import time
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from prefect import flow
from prefect.runtime import deployment as prefect_deployment
from pydantic import TypeAdapter

from infra import vllm
from infra.arms import Arm, local_dir, plan_server, same_server
from infra.swap import install as swap_module
from infra.config import Profile
from infra.executor import executor_for
from infra.fingerprint import digest
from infra.hostlock import Lapse, LeaseLapsed, host_lock
from infra import spread
from infra.spread import RemoteRuns
from infra.tracking import Tag, Tracker, interruption, signal_name
from tasks.acceptance import request_acceptance, request_metrics
from tasks.bench import benchmark, sweep, sweep_metrics, warmup
from tasks.cleanup import cleanup
from tasks.health import wait_healthy
from tasks.launch import launch_server
from tasks.record import ArmEvidence, ArmResult, arm_run, known_before, record_arm
from tasks.reuse import arm_result, asked_beside
from tasks.swap import swap_drafter
from tasks.scrape import counter_metrics, log_crosscheck, scrape, spec_totals, spec_window
from tasks.teardown import stop_unreturned, teardown
from tasks.verdict import questions, speed_judged
from tasks.verdict.asks import Compared


@dataclass(frozen=True)
class Rider:
    """An arm measured on another arm's server, after it: its offline numbers and fingerprint go with it."""

    arm: Arm
    offline: dict[str, float] | None = None
    fingerprint: dict | None = None


@flow(name="arm", flow_run_name="arm-{arm.name}", log_prints=True)
def run_arm(cfg: Profile, arm: Arm, tracking_uri: str, experiment_id: str, parent_run_id: str,
            workdir: str, prompts: list[str], offline: dict[str, float] | None = None,
            baseline_tok_s: list[float] | None = None, blockers: list[str] | None = None,
            fingerprint: dict | None = None, candidate: dict[str, float] | None = None,
            beside: bool = False, riders: list[Rider] | None = None,
            compared: Compared | None = None, control: dict[str, float] | None = None) -> list[ArmResult]:
    """baseline_tok_s: the baseline arm's per-request tok/s, once measured: the early stop compares with it.
    candidate: the candidate arm's metrics, once measured: a control's early stop compares with its acceptance
    (tasks/verdict/asks.questions; other roles ignore it). control: the control's metrics, where it was measured
    before the candidate (reused): the candidate's early stop compares with its acceptance.
    blockers: static findings that make a server load pointless; the arm then fails before its server starts.
    fingerprint: what decides the measurement (infra/fingerprint.py): tagged by digest, so a later diagnosis reuses it.
    beside: measured beside the diagnosis's other arms (spread over hosts): what of baseline_tok_s and candidate
    was not known at its start is read from their MLflow runs as they end (tasks/reuse.asked_beside).
    riders: arms measured on this arm's server after it, each in its own run. Returns this arm's result, then each
    rider's. compared: a baseline's, measured after the drafters: the arms whose speedup over it its window settles
    (tasks/verdict/asks.speed_compared); None where it is measured first."""
    if prefect_deployment.id:  # a worker's flow run (spread): its code-choosing settings are its own profile's
        spread.vet(cfg, [arm, *(r.arm for r in riders or [])])
        print(f"[{arm.name}] engine, hosts, target and drafter env checked against this worker's {cfg.source}")
    tracker, where = Tracker(tracking_uri), (experiment_id, parent_run_id)
    first = Window.start(tracker, arm, where, offline, fingerprint)
    windows, server, ready = [first], None, False
    executor, held, lapse = executor_for(cfg.host), ExitStack(), None
    swaps = any(not same_server(arm, r.arm) for r in riders or [])  # the server takes other drafters of its shapes
    try:
        with first.attempt():
            if blockers:
                raise StaticCheckFailed("; ".join(blockers) + " (the server was not started; --force launches anyway)")
            # one server per host at a time, across flow runs: queued here, held until teardown
            hold = held.enter_context(host_lock(cfg.host, cfg.server_port))
            first.ev.metrics["host_lock_wait_s"], lapse = hold.wait_s, hold.lapse
            first.lapse = lapse
            plan = plan_server(cfg, arm, workdir, swappable=swaps)
            first.params, first.ev.log_path = plan.params, plan.log_path
            first.ev.metrics.update(cleanup(executor, cfg.host))
            if swaps:
                swap_module(executor, workdir)
            lapse.check()  # a lock lost while waiting or cleaning up: no server starts unprotected
            server = launch_server(plan, executor)
            lapse.on_lapse(lambda: executor.stop_group(server.process.pgid, grace_s=5))  # nor runs on unprotected
            first.ev.server_cmd = server.process.command
            first.ev.metrics["server_ready_s"] = wait_healthy(server, cfg.health_timeout_s)
            ready = True
            first.measure(cfg, server, prompts, _asks(arm, offline, baseline_tok_s, candidate, beside, tracker, where,
                                                      compared, control))
        learned, loaded = {"candidate": candidate, "control": control}, arm
        for rider in riders or []:  # the same server, one window each; a drafter of the same shapes swapped in
            learned.update(_learned(windows[-1]))  # riders compare with the windows just measured (asks.py)
            swapping = not same_server(loaded, rider.arm)
            if swapping and not (ready and executor.is_alive(server.process.pid)):
                break  # no server to swap into: the rest load afresh (flows/diagnose._measure)
            windows.append(w := Window.start(tracker, rider.arm, where, rider.offline, rider.fingerprint))
            w.result.served_with, w.lapse = arm.name, lapse
            with w.attempt():
                w.params = {**plan_server(cfg, rider.arm, workdir, swappable=swaps).params,
                            "server_shared_with": arm.name}
                w.ev.server_cmd, w.ev.log_path = first.ev.server_cmd, first.ev.log_path
                if not ready:
                    raise ServerNotReady(f"it rides on {arm.name}'s server, which did not come up: "
                                         f"{first.result.error}")
                if swapping:
                    lapse.check()
                    loaded, w.result.swapped_into = rider.arm, first.result.run_id
                    w.ev.metrics["swap_s"] = swap_drafter(server, rider.arm, cfg.swap.timeout_s)
                w.measure(cfg, server, prompts, _asks(rider.arm, rider.offline, baseline_tok_s, learned["candidate"],
                                                       False, tracker, where, control=learned["control"]))
            if swapping and not w.result.ok and "swap_s" not in w.ev.metrics:
                break  # a failed swap: the server is stopped, the next arm loads afresh
    finally:  # every step guarded: whatever fails here, each window's run is still recorded and ended
        _step(first, "teardown", lambda: first.ev.metrics.update(shm_files_removed=teardown(server))
              if server is not None else stop_unreturned(executor, arm.name))
        _step(first, "releasing the host lock", held.close)  # the host is free for the next server
        _finish(tracker, executor, windows, parent_run_id)
    return [w.result for w in windows]


def _step(w: "Window", what: str, call, fails: bool = True) -> None:
    """One step of an arm's end: a failure fails the arm (unless not `fails`: a check whose absence leaves the
    measurement standing), naming the step, and the end goes on."""
    try:
        call()
    except Exception as exc:
        if fails:
            w.result.ok, w.result.error = False, f"{w.result.error}\n{what}: {type(exc).__name__}: {exc}".strip()
        print(f"[{w.arm.name}] {what} failed: {exc}")


@dataclass
class Window:
    """One arm's measurement on a server: its MLflow run, what it measured, and when it began."""

    arm: Arm
    result: ArmResult
    ev: ArmEvidence
    params: dict = field(default_factory=dict)
    began: float = field(default_factory=time.monotonic)
    lapse: Lapse | None = None  # the host lock's: once it lapsed, the server was stopped, and the arm fails saying so

    @classmethod
    def start(cls, tracker: Tracker, arm: Arm, where: tuple[str, str], offline, fingerprint) -> "Window":
        run_name, tags = arm_run(arm)
        if fingerprint:
            tags[Tag.FINGERPRINT] = digest(fingerprint)
        result = ArmResult(arm.name, arm.role, tracker.start(where[0], run_name, tags, parent=where[1]),
                           probe=arm.probe, method=arm.spec.method if arm.spec else "",
                           k=arm.spec.num_speculative_tokens if arm.spec else 0)
        if fingerprint:
            tracker.text(result.run_id, json.dumps(fingerprint, indent=1, sort_keys=True, default=str),
                         "fingerprint.json")
        return cls(arm, result, ArmEvidence(metrics=known_before(arm, offline)))

    @contextmanager
    def attempt(self):
        """A failure fails this arm, and the server's other arms go on; Ctrl-C, SIGTERM or a Prefect cancellation
        ends it as interrupted and goes on up (the server is stopped on the way)."""
        try:
            yield
            self.result.ok = True
        except Exception as exc:
            self.result.error = f"{type(exc).__name__}: {exc}"
            if self.lapse is not None and self.lapse.event.is_set() and not isinstance(exc, LeaseLapsed):
                self.result.error = f"LeaseLapsed: {self.lapse.why}; its server was stopped (then {self.result.error})"
            self.ev.bench = self.ev.bench or getattr(exc, "result", None)
            print(f"[{self.arm.name}] FAILED: {self.result.error}")
        except BaseException as exc:
            self.result.interrupted = interruption(exc)
            self.result.error = f"interrupted ({signal_name(exc)}) during arm {self.arm.name}"
            self.ev.bench = self.ev.bench or getattr(exc, "result", None)
            print(f"[{self.arm.name}] {self.result.error}: stopping its server")
            raise

    def measure(self, cfg: Profile, server, prompts: list[str], asks) -> None:
        ev, bench_cfg, bench_start = self.ev, self.arm.bench_config(cfg), time.monotonic()
        warmup(server.base_url, bench_cfg, prompts[:cfg.bench.warmup])
        ev.before = scrape(server)
        ev.bench = benchmark(server.base_url, bench_cfg, prompts[cfg.bench.warmup:],
                             spec_window(server, ev.before) if self.arm.spec else None, asks, self.arm.name)
        ev.after = scrape(server)
        ev.metrics["bench_s"] = time.monotonic() - bench_start
        ev.metrics.update(counter_metrics(self.arm.name, ev.before, ev.after, speculative=self.arm.spec is not None))
        if cfg.bench.concurrency_sweep:  # load shapes beyond the verdict's window, on the same server
            ev.sweep = sweep(server.base_url, bench_cfg, prompts[cfg.bench.warmup:],
                             spec_totals(server) if self.arm.spec else None)
            ev.metrics.update(sweep_metrics(ev.sweep))


def _finish(tracker: Tracker, executor, windows: list[Window], parent_run_id: str) -> None:
    """After teardown: the server's log (fetched from a remote host) and each window's figures into its run. Each
    window's wall time runs until the next one began; the last one's includes the teardown."""
    log_path, log_text = windows[0].ev.log_path, ""
    try:  # a host gone at the end of an arm must not keep what was measured out of MLflow
        log_text = executor.read_tail(log_path, 1 << 20) if log_path else ""
    except Exception as exc:
        print(f"[{windows[0].arm.name}] could not read the server log on {executor.host}: {exc}")
    version = vllm.parse_engine_version(log_text) or ""
    if log_path and executor.host != "local":  # the log lands in MLflow from a local copy
        log_path = str(_fetch(executor, log_path, local_dir(parent_run_id)))
    ends = [w.began for w in windows[1:]] + [time.monotonic()]
    for w, end in zip(windows, ends):
        ev, m = w.ev, w.ev.metrics
        ev.engine_version = version
        if ev.before:  # a shared server's log lines mix its windows: each reads up to its own closing scrape
            _step(w, "cross-checking the server log", lambda: m.update(
                log_crosscheck(executor, ev.log_path, ev.before, ev.after if len(windows) > 1 else None)), fails=False)
        ev.log_path = log_path if ev.log_path else ""
        if ev.bench:
            m.update(ev.bench.summary() | request_metrics(ev.bench.records))
            w.result.request_tok_s = ev.bench.request_tok_s()
            w.result.request_acceptance = request_acceptance(ev.bench.records)
        m["arm_wall_s"] = end - w.began
        m["overhead_s"] = m["arm_wall_s"] - m.get("server_ready_s", 0.0) - m.get("swap_s", 0.0) \
            - m.get("bench_s", 0.0) - m.get("host_lock_wait_s", 0.0)
        w.result.metrics = m
        try:
            record_arm(tracker, w.result, w.params, ev)
        except Exception as exc:  # this run ends FAILED; the server's other arms are still recorded
            w.result.ok, w.result.error = False, f"{w.result.error}\nrecording: {exc}".strip()
            print(f"[{w.arm.name}] recording failed: {exc}")
            _step(w, "ending its run", lambda: tracker.finish(w.result.run_id, False, killed=w.result.interrupted))
    _step(windows[0], "closing the connection", executor.close, fails=False)


def _learned(w: Window) -> dict:
    """What a window just measured on this server tells the arms after it: a candidate's or a control's figures, as
    the verdict reads them (spread over requests)."""
    if w.arm.role not in ("candidate", "control") or not w.result.ok:
        return {}
    return {w.arm.role: w.ev.metrics | request_metrics(w.ev.bench.records)}


def _asks(arm: Arm, offline, baseline_tok_s, candidate, beside: bool, tracker: Tracker, where: tuple[str, str],
          compared: Compared | None = None, control: dict[str, float] | None = None):
    """What the verdict will ask of this arm, for its early stop; where measured beside the other arms, learned as the
    ones its questions compare with end: the candidate for a probe, the control for the candidate, the baseline for an
    arm whose speed is judged."""
    def ask(learned: dict):
        tok_s, cand = learned.get("baseline", baseline_tok_s), learned.get("candidate", candidate)
        return questions(arm.role, offline, tuple(tok_s or ()), cand,
                         arm.position_limit, arm.spec.num_speculative_tokens if arm.spec else 1, arm.probe, compared,
                         learned.get("control", control))
    wants = {"candidate": candidate} if arm.role == "probe" else {"control": control} if arm.role == "candidate" else {}
    if speed_judged(arm.role, arm.probe) and arm.role != "baseline":
        wants["baseline"] = baseline_tok_s
    return asked_beside(ask, wants, tracker, *where) if beside and wants else ask({})


def remote_arm(runs: RemoteRuns, host: str, params: dict) -> list[ArmResult]:
    """run_arm(**params) by the worker of HOST (infra/spread.py), read back from the MLflow runs it recorded."""
    tracker, arms = Tracker(params["tracking_uri"]), [params["arm"], *(r.arm for r in params.get("riders") or [])]
    flow_run = runs.run(host, TypeAdapter(dict).dump_python(params, mode="json"), params["arm"].name)
    return [_read_back(tracker, params, arm, flow_run, host) for arm in arms]


def _read_back(tracker: Tracker, params: dict, arm: Arm, flow_run, host: str) -> ArmResult:
    found = tracker.arm_run(params["experiment_id"], params["parent_run_id"], arm.name)
    error = f"its flow run {flow_run.name} on host {host} ended {flow_run.state.name} before recording anything: " \
            f"{flow_run.state.message or 'see the worker log'}"
    if found and found.info.status == "RUNNING":  # its worker was lost while it measured: ended here
        tracker.tag(found.info.run_id, Tag.ERROR, error[:500])
        tracker.finish(found.info.run_id, False)
        found = tracker.run(found.info.run_id)
    if found:
        return arm_result(tracker, found, arm.role)
    name, tags = arm_run(arm)
    run_id = tracker.start(params["experiment_id"], name, tags, parent=params["parent_run_id"])
    tracker.tag(run_id, Tag.ERROR, error[:500])
    tracker.finish(run_id, False)
    print(f"[{arm.name}] FAILED: {error}")
    return ArmResult(arm.name, arm.role, run_id, False, error)


class StaticCheckFailed(Exception):
    """A checkpoint fault that the engine would refuse or serve wrongly, found before the server load."""


class ServerNotReady(Exception):
    """The server an arm rides on did not come up (its loading arm failed before it was healthy)."""


def _fetch(executor, path: str, dest_dir: Path) -> Path:
    try:
        return executor.fetch(path, dest_dir / Path(path).name)
    except Exception as exc:  # a log that cannot be fetched must not hide what was measured
        print(f"could not fetch {path} from {executor.host}: {exc}")
        return dest_dir / Path(path).name
