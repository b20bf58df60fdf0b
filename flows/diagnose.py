"""specdiag: why is speculative decoding disappointing? One controlled, tracked experiment per arm."""
import gc
import json
import os
import signal
import sys
import time
from contextlib import closing
from dataclasses import replace
from pathlib import Path

if __package__ in (None, ""):  # run as `python flows/diagnose.py`
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

# The ephemeral Prefect server migrates its database on first start: slow on 2 cores.
os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "120")
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
PROCESS_START = None  # run as a program: when it started (the flow's first lap, startup_s, counts from there)
if __name__ == "__main__":  # Prefect's temporary server boots while the rest imports and the inputs are checked
    from infra.prefect_boot import early_server
    PROCESS_START, PREFECT_SERVER = time.monotonic(), early_server()

from prefect import flow, tags as prefect_tags  # noqa: E402
from prefect.exceptions import TerminationSignal  # noqa: E402
from prefect.settings import PREFECT_FLOWS_HEARTBEAT_FREQUENCY, temporary_settings  # noqa: E402

from flows.arm import Rider, remote_arm, run_arm
from infra import secrets, spread, swap
from infra.arms import plan_arms, resolved_drafters, resolved_target, run_dir, shared_servers, validate_inputs
from infra.config import PROJECT_ROOT, DrafterRef, NoControl, ProfileRef, SpecdiagError, load_profile
from infra.fingerprint import digest
from infra.prefect_boot import end_orphan_flow_runs, owner_tags
from infra.tracking import Tag, Tracker, check_store, interrupted_where, interruption, signal_name, tracking_uri
from infra.promptsets import distinct as distinct_prompts, load as load_prompts
from tasks.compare import compare, comparison_markdown
from tasks.confirm import confirm, fix_arm
from tasks.inspect import findings_markdown, inspect_arms, position_limit
from tasks.offline import Stop, offline_eval
from tasks.plots import plots
from tasks.report import report
from tasks.reuse import PROFILE, fingerprints, newest_match, rerun_inputs, reuse_arm
from tasks.record import ArmResult
from tasks.verdict import speed_compared, speed_judged, verdict
from tasks.verdict.settle import window_lines


def prepare(profile: str = "demo", overrides: dict | None = None, sets: list[str] | None = None):
    """Everything that can be checked before a server starts: bad input fails here, in seconds."""
    cfg = load_profile(profile, overrides, sets)
    check_store()
    arms = plan_arms(cfg)
    for on_host in _hosts(cfg).values():
        validate_inputs(on_host, arms)
    if cfg.spread.hosts:
        spread.check(cfg, tracking_uri())
    # greedy decoding answers a repeated prompt identically: a window never repeats one (window_plan says so)
    prompts = load_prompts(cfg.bench.prompts, cfg.bench.warmup + cfg.bench.num_prompts, cfg.bench.temperature > 0)
    return cfg, arms, prompts


@flow(name="diagnose", log_prints=True)
def diagnose(profile: ProfileRef = "demo", drafter: DrafterRef | None = None,
             control: DrafterRef | NoControl | None = None, arms: list[DrafterRef] | None = None,
             sets: list[str] | None = None) -> list[ArmResult]:
    """Baseline vs candidate drafter vs known-good control, each on a fresh server, recorded in MLflow.

    Args:
        profile: a profile under infra/profiles (target, drafters, hosts, benchmark), or the path of a YAML file
        drafter: the candidate: a drafter the profile names, or a checkpoint folder's path on the host
        control: the known-good control, as drafter; empty for none; unset for the profile's own
        arms: extra drafter arms after the control
        sets: profile fields to override, each KEY=VALUE with a dotted key, e.g. bench.max_tokens=64,
            bench.num_prompts=8, host=gpu-box, probes=[k_sweep]
    """
    laps = Laps(PROCESS_START)  # startup_s: imports, input checks and Prefect's start, where this is the program
    cfg, plan, prompts = prepare(profile, {"drafter": drafter, "control": control, "arms": arms}, sets)
    tracker = Tracker()
    experiment = tracker.experiment(cfg.name)
    tracker.end_orphans(experiment)  # a SIGKILLed diagnosis's runs, left RUNNING
    title = f"{cfg.drafter} vs {cfg.control or 'no control'}"
    parent = tracker.start(experiment, title, {Tag.KIND: "diagnosis", Tag.DRAFTER: cfg.drafter or "none"})
    # from its creation the parent ends FINISHED, FAILED or KILLED, never RUNNING; the offline evaluation ends with it
    with tracker.terminated(parent), closing(Stop()) as stop:
        tracker.params(parent, {"profile": cfg.name, "arms": ",".join(a.name for a in plan)})
        tracker.text(parent, cfg.model_dump_json(indent=1), PROFILE)  # whole, secrets as markers: --rerun reads it
        tracker.text(parent, "\n".join(json.dumps({"prompt": p}) for p in prompts) + "\n", "prompts.jsonl")
        target, drafters, workdir = resolved_target(cfg), resolved_drafters(plan), run_dir(cfg, parent)
        findings = inspect_arms(target, drafters, cfg.host, cfg.target.max_model_len())  # seconds, before any server
        window_plan(cfg, plan, prompts)
        static = findings_markdown(findings)
        tracker.text(parent, static, "static_checks.md")
        laps.lap("setup_s")
        evaluating = offline_eval.submit(cfg, drafters, target, prompts[cfg.bench.warmup:], workdir, tracker, parent,
                                         stop)
        if cfg.host.kind == "local":  # here it shares the first server's cores; a remote host's CPUs are idle
            evaluating.wait()        # while its GPUs load: there it runs beside the baseline's load
        laps.lap("offline_s")
        where = (experiment, parent)
        runs = spread.RemoteRuns(cfg.spread.deployment, cfg.spread.pool) if cfg.spread.hosts else None
        results = _arms(cfg, drafters, findings, evaluating, tracker, where, prompts, target, runs)
        offline = evaluating.result()
        laps.lap("arms_s")
        table = compare(tracker, parent, results)
        decision = verdict(tracker, parent, results, findings, offline)
        if cfg.confirm:
            decision, table = _confirmed(cfg, decision, drafters, results, tracker, where, prompts, runs)
        tracker.note(parent, decision.markdown() + "\n\n## Arms\n\n" + comparison_markdown(table))
        report(tracker, parent, experiment, results, decision, static, plots(tracker, parent, results), title)
        tracker.metrics(parent, laps.lap("finish_s"))
    print("\n" + table.to_string(index=False, float_format=lambda v: f"{v:.3f}"))
    print(f"\nwall time {laps['diagnosis_wall_s']:.0f} s ({laps.line()}); per arm: " + ", ".join(map(_spent, results)))
    for r in results:
        if not r.ok:
            print(f"arm {r.arm} FAILED: {r.error.splitlines()[0]}")
    if offline.line():
        print(offline.line().replace("offline evaluation failed", "offline evaluation FAILED"))
    print("\n" + decision.markdown())
    print(f"\nMLflow: {tracker.run_url(experiment, parent)}")
    return results


def _spent(r: ArmResult) -> str:
    """Where an arm's time went, for the closing line."""
    if r.reused_from:
        return f"{r.arm} reused"
    if r.swapped_into:
        load = f"swapped into {r.served_with}'s server in {r.metrics.get('swap_s', 0):.1f} s"
    else:
        load = f"on {r.served_with}'s server" if r.served_with else \
            f"fresh load, {r.metrics.get('server_ready_s', 0):.0f} s ready"
    return f"{r.arm} {load} + {r.metrics.get('bench_s', 0):.0f} s bench + {r.metrics.get('overhead_s', 0):.0f} s other"


class Laps(dict):
    """Seconds spent between marks, by name, and diagnosis_wall_s: where a diagnosis's time goes outside its arms."""

    def __init__(self, process_start: float | None = None):
        super().__init__()
        self._start = self._mark = process_start or time.monotonic()
        if process_start:
            self.lap("startup_s")

    def lap(self, name: str) -> "Laps":
        now = time.monotonic()
        self[name], self._mark, self["diagnosis_wall_s"] = now - self._mark, now, now - self._start
        return self

    def line(self) -> str:
        return ", ".join(f"{k.removesuffix('_s')} {v:.0f} s" for k, v in self.items() if k != "diagnosis_wall_s")


def _hosts(cfg) -> dict:
    """Where the arms run, by host name: each host of spread.hosts (by its worker), else the profile's host."""
    return {h: cfg.on_host(h) for h in cfg.spread.hosts} if cfg.spread.hosts else {cfg.host.name: cfg}


def _arms(cfg, drafters, findings, evaluating, tracker, where, prompts, target, runs) -> list[ArmResult]:
    """Every arm, in order here on the profile's host, or by the workers of spread.hosts (runs: their flow runs):
    each next server to the first free host, with the arms that ride on it (infra/arms.shared_servers). A drafter arm
    waits for the offline evaluation (its numbers go with it); the baseline does not. On this machine the baseline
    comes last (_in_order). Results in the plan's order."""
    on = _hosts(cfg)
    drafters = [_position_limited(a, findings) for a in drafters]
    prints = {h: fingerprints(c, drafters, target, prompts) for h, c in on.items()}
    blockers = _blockers(cfg, drafters, findings)
    results: list[ArmResult] = []  # as they end: a later arm's early stop compares with the earlier ones
    found: dict = {}  # arm -> the run it reuses, where looked up before any arm ran

    def one(group, host):
        with tracker.interrupts(where[1], ", ".join(a.name for a in group)):
            offline = {a.name: evaluating.result().metrics.get(a.name) if a.spec else None for a in group}
            measured = _measure(on[host], group, tracker, where, prompts, offline, results, blockers, prints[host],
                                runs, host, found)
        results.extend(measured)
        return measured
    groups = grouped(cfg, drafters, blockers, target)
    if not runs:  # in order, in this thread: Ctrl-C reaches the arm's own teardown
        found = {a.name: run for a in drafters if (run := _reusable(cfg, a, tracker, prints[cfg.host.name], blockers))}
        done = [r for g in _in_order(cfg, groups, set(found)) for r in one(g, cfg.host.name)]
    else:
        try:
            with tracker.interrupts(where[1], f"{', '.join(a.name for a in drafters)} (spread over {', '.join(on)})"):
                done = [r for rs in spread.dispatch(list(on), groups, one) for r in rs]
        except BaseException:  # Ctrl-C, SIGTERM: each worker stops its arm, whose teardown stops the server
            runs.cancel()
            raise
    order = [a.name for a in drafters]
    return sorted(done, key=lambda r: order.index(r.arm))


def grouped(cfg, drafters, blockers: dict, target: str) -> list:
    """The arms by server (infra/arms.shared_servers), decided before any server starts: drafters of the same shapes
    share one load by swapping (infra/swap.py). Prints the plan, one line per arm, saying how each is served and why."""
    blocked = {name for name, why in blockers.items() if why}
    found = swap.shapes(cfg, [a for a in drafters if a.name not in blocked], target) if cfg.swap.enabled else {}
    drafters = [replace(a, swap_aux=found[a.name].aux_ids) if a.name in found else a for a in drafters]
    groups = shared_servers(drafters, lambda a: not speed_judged(a.role, a.probe) and a.name not in blocked,
                            {name: s.key for name, s in found.items() if s.key})
    lines = swap.plan_lines(groups, found, cfg.swap.enabled, blocked)
    loads = sum(1 for g in groups if g[0].name not in blocked)
    print(f"plan: {loads} server load(s)\n  " + "\n  ".join(lines))
    return groups


def window_plan(cfg, plan, prompts: list[str]) -> None:
    """Before measuring: the requests a window can take, and whether they can settle the candidate against its
    control."""
    measured = len(prompts) - cfg.bench.warmup
    dropped = cfg.bench.num_prompts - measured
    roles = {a.role for a in plan}
    print("\n".join(window_lines(measured, distinct_prompts(cfg.bench.prompts), dropped, cfg.bench.prompts,
                                 cfg.bench.max_tokens, {"candidate", "control"} <= roles)))


def _blockers(cfg, drafters, findings: dict) -> dict[str, list[str]]:
    """arm -> the static findings that make its server load pointless (none with --force)."""
    return {a.name: [] if cfg.force else [f"{f.code}: {f.message}" for f in findings.get(a.name, []) if f.gating]
            for a in drafters}


def _in_order(cfg, groups: list, reused: set[str]) -> list:
    """Reused arms first: they cost nothing, and the arms measured after them compare with them as they run (a
    reused baseline's requests, a reused control's acceptance). Then the baseline's server last where it is measured
    on this machine, where the offline evaluation has ended before any arm: its window then settles exactly the
    speedups the verdict will judge (tasks/earlystop.py), not its own tok/s to a precision none may need; first on a
    remote host, where its load runs beside the offline evaluation (the drafter arms wait for those numbers)."""
    first = [g for g in groups if all(a.name in reused for a in g)]
    rest = [g for g in groups if g not in first]
    if cfg.host.kind == "local":
        rest.sort(key=lambda g: g[0].role == "baseline")  # stable: the others keep the plan's order
    return first + rest


def _reusable(cfg, arm, tracker, prints: dict, blockers: dict):
    """The newest successful run of this arm's fingerprint, where reuse is on and nothing blocks the arm."""
    fingerprint = prints.get(arm.name)
    return newest_match(tracker, digest(fingerprint), cfg.reuse.max_age_h) \
        if fingerprint and cfg.reuse.enabled and not blockers.get(arm.name) else None


def _position_limited(arm, findings):
    """An arm served past its drafter's declared positions (static check position_limit): its early stop also asks
    context_limit's question, acceptance before that position against past it."""
    limit = position_limit(findings.get(arm.name, []))
    return replace(arm, position_limit=limit) if limit else arm


def _measure(cfg, group, tracker, where, prompts, offline, results, blockers, prints, runs=None,
             host="", found: dict | None = None) -> list[ArmResult]:
    """Each arm of the group reused from MLflow where an arm with its fingerprint succeeded before (found: the runs
    looked up before any arm ran; an arm not among them is looked up again, as an arm measured earlier in this
    diagnosis may match it); the others measured on one server, the first loading it: here, or by the worker of its
    host (runs: the spread's flow runs)."""
    experiment, parent = where
    out, todo = [], []
    for arm in group:
        if run := (found or {}).get(arm.name) or _reusable(cfg, arm, tracker, prints, blockers):
            out.append(reuse_arm(tracker, run, arm, experiment, parent, offline.get(arm.name)))
        else:
            todo.append(arm)
    while todo:  # after a failed swap, the arms not measured load afresh
        done = _serve(cfg, todo, tracker, where, prompts, offline, results + out, blockers, prints, runs, host)
        out += done
        todo = [a for a in todo if a.name not in {r.arm for r in done}] if not runs else []
    return out


def _serve(cfg, todo, tracker, where, prompts, offline, results, blockers, prints, runs, host) -> list[ArmResult]:
    """One server: the first arm loads it, the others ride on it or are swapped into it (flows/arm.run_arm)."""
    experiment, parent = where
    arm, riders = todo[0], [Rider(a, offline.get(a.name), prints.get(a.name)) for a in todo[1:]]
    base = next((r.request_tok_s for r in results if r.role == "baseline" and r.ok), None)
    cand = next((r.metrics for r in results if r.role == "candidate" and r.ok), None)
    ctrl = next((r.metrics for r in results if r.role == "control" and r.ok), None)
    params = dict(cfg=cfg, arm=arm, tracking_uri=tracker.uri, experiment_id=experiment, parent_run_id=parent,
                  workdir=run_dir(cfg, parent), prompts=prompts, offline=offline.get(arm.name), baseline_tok_s=base,
                  blockers=blockers.get(arm.name), fingerprint=prints.get(arm.name), candidate=cand, riders=riders,
                  control=ctrl)
    if arm.role == "baseline" and any(r.role != "baseline" for r in results):  # after drafters: their speedups
        params["compared"] = speed_compared(results)
    if runs:  # measured beside the other arms: it learns their numbers as they end
        return remote_arm(runs, host, {**params, "beside": True})
    # The diagnosis's own flow run beats for this process; an arm's own heartbeat thread would hold its end for up to
    # a second (Prefect joins it after its current 1 s sleep), every arm.
    with temporary_settings({PREFECT_FLOWS_HEARTBEAT_FREQUENCY: None}):
        return run_arm(**params)


def _confirmed(cfg, decision, drafters, results, tracker, where, prompts, runs=None):
    """--confirm: the verdict's fix served as one more arm (none where the evidence already is the intervention),
    on the profile's host or, spread, by the first host's worker (every arm has ended: all hosts are free)."""
    parent = where[1]
    arm, why = fix_arm(cfg, decision, drafters, results)
    if arm:
        host, on = next(iter(_hosts(cfg).items()))
        with tracker.interrupts(parent, arm.name):
            results += _measure(on, [resolved_drafters([arm])[0]], tracker, where, prompts, {}, results, {}, {},
                                runs, host)
    return confirm(tracker, parent, decision, results, why), compare(tracker, parent, results)


def main(argv: list[str] | None = None, early=None) -> int:
    """early: Prefect's temporary server, booting since the program started (infra/prefect_boot.py); stopped at
    exit, after Prefect's own exit hooks, or at once on bad input."""
    from infra.cli import overrides, parser

    args = parser().parse_args(argv)
    if args.serve:
        diagnose.serve(name="diagnose")
        return 0
    over = overrides(args)
    try:
        if args.rerun:  # the recorded profile and prompt texts, every arm measured again
            args.profile, again = rerun_inputs(Tracker(), args.rerun, PROJECT_ROOT / "runs" / f"rerun-{args.rerun}")
            args.sets = again + args.sets
        cfg, plan, prompts = prepare(args.profile, over, args.sets)  # fail fast, before a flow runs
        if args.dry_run:
            dry_run(cfg, plan, prompts)
            if early:
                early.stop()
            return 0
    except SpecdiagError as exc:
        print(f"specdiag: error: {exc}", file=sys.stderr)
        if early:
            early.stop()
        return 2
    sets = secrets.hide_sets(args.sets + [f"{k}={json.dumps(v)}" for k, v in over.items()
                                          if v is not None and k not in ("drafter", "control", "arms")])
    signal.signal(signal.SIGTERM, _terminated)  # SIGTERM ends like Ctrl-C (Prefect re-raises it here after its own)
    try:
        # checked by prepare() already, and a profile of the user's own may name drafters the form's choices lack
        with temporary_settings(early.serve() if early else {}), prefect_tags(*owner_tags()):
            end_orphan_flow_runs()  # a SIGKILLed diagnosis's, left running
            results = diagnose.with_options(validate_parameters=False)(args.profile, cfg.drafter, cfg.control,
                                                                         cfg.arms, sets)
    except SpecdiagError as exc:  # e.g. the engine environment could not be built
        print(f"specdiag: error: {exc}", file=sys.stderr)
        return 2
    except BaseException as exc:  # Ctrl-C, SIGTERM, a Prefect cancellation: already torn down and recorded
        if not interruption(exc):
            raise
        print(f"specdiag: interrupted ({signal_name(exc)}) {interrupted_where(exc)}: its server was stopped and "
              "what it measured is in its MLflow run (KILLED)", file=sys.stderr)
        return 130
    return 0 if all(r.ok for r in results) else 1


def dry_run(cfg, plan, prompts: list[str]) -> None:
    """--dry-run: the plan as the flow would make it (static checks, shapes, grouping, the windows), printed; no server
    starts."""
    target, drafters = resolved_target(cfg), resolved_drafters(plan)
    findings = inspect_arms.fn(target, drafters, cfg.host, cfg.target.max_model_len())
    window_plan(cfg, plan, prompts)
    grouped(cfg, drafters, _blockers(cfg, drafters, findings), target)
    print("(dry run: nothing was started; `python flows/diagnose.py` without --dry-run runs this plan)")


def _terminated(signum, _frame):
    raise TerminationSignal(signum)


if __name__ == "__main__":
    code = main(early=PREFECT_SERVER)
    gc.freeze()  # the heap ends with the process: its exit skips collecting it (0.5 s of the exit on 2 cores)
    sys.exit(code)
