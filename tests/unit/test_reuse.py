"""Arm fingerprints, read on the host by the engine's own interpreter: each input that changes a measurement
changes the fingerprint (a fresh arm); nothing else does (the arm is reused)."""
import os
import shutil
import time
from dataclasses import replace

import pytest

from infra import embedded
from infra.arms import plan_arms
from infra.config import load_profile
from infra.executor import LocalExecutor
from infra.fingerprint import digest, fields, identify


@pytest.fixture(scope="module")
def python():
    return embedded.engine_python()


def _checkpoint(folder):
    """A small EAGLE-3-shaped folder: config, a safetensors file (8-byte header length + JSON header + data)."""
    folder.mkdir()
    (folder / "config.json").write_text('{"architectures": ["LlamaForCausalLMEagle3"], "hidden_size": 64}')
    header = b'{"fc.weight":{"dtype":"F32","shape":[2,2],"data_offsets":[0,16]}}'
    (folder / "model.safetensors").write_bytes(len(header).to_bytes(8, "little") + header + bytes(16))
    return folder


def _digests(python, cfg, target, prompts, drafter_dir):
    arms = plan_arms(cfg)
    arms = [replace(a, spec=a.spec.model_copy(update={"model": str(drafter_dir)})) if a.spec else a for a in arms]
    ids = identify(LocalExecutor(), python, [str(target), str(drafter_dir)])
    return {a.name: digest(fields(cfg, a, str(target), prompts, ids, True)) for a in arms}, ids


def test_each_input_that_changes_a_measurement_changes_the_fingerprint(python, tmp_path):
    target, drafter = _checkpoint(tmp_path / "target"), _checkpoint(tmp_path / "drafter")
    cfg = load_profile("demo", {"drafter": "smol-eagle3", "control": ""})
    prompts = ["What is a prime?", "Name a river."]
    same, ids = _digests(python, cfg, target, prompts, drafter)
    assert ids["engine"] not in ("", "unknown")  # read from the engine's own installation
    assert same == _digests(python, cfg, target, prompts, drafter)[0]

    moved = tmp_path / "moved"
    shutil.copytree(drafter, moved)  # copy2 keeps mtimes: the same files elsewhere are the same drafter
    assert _digests(python, cfg, target, prompts, moved)[0]["smol-eagle3"] == same["smol-eagle3"]

    args = load_profile("demo", {"drafter": "smol-eagle3", "control": "", "target.args": cfg.target.args[:-2]})
    changed = {
        "server argument": _digests(python, args, target, prompts, drafter)[0],
        "prompt set": _digests(python, cfg, target, prompts[:1], drafter)[0],
        "benchmark": _digests(python, load_profile("demo", {"drafter": "smol-eagle3", "control": "",
                                                            "bench.max_tokens": 7}), target, prompts, drafter)[0],
    }
    for what, d in changed.items():
        assert d["baseline"] != same["baseline"] and d["smol-eagle3"] != same["smol-eagle3"], what

    time.sleep(0.01)
    (drafter / "model.safetensors").write_bytes((drafter / "model.safetensors").read_bytes())  # rewritten file
    rewritten = _digests(python, cfg, target, prompts, drafter)[0]
    assert rewritten["smol-eagle3"] != same["smol-eagle3"] and rewritten["baseline"] == same["baseline"]

    other_engine = dict(ids, engine="0.31.0")
    arm = plan_arms(cfg)[0]
    assert digest(fields(cfg, arm, str(target), prompts, other_engine, True)) != \
        digest(fields(cfg, arm, str(target), prompts, ids, True))
    # the same drafter as a control settles its acceptance narrow: another arm whose speed is not judged either (a
    # probe) does not stand for it, nor it for a candidate (tok/s settled too); under --fixed all measure alike
    ctrl = replace(plan_arms(cfg)[1], role="control")
    for fixed in (False, True):
        c = cfg.model_copy(update={"bench": cfg.bench.model_copy(update={"early_stop": not fixed})})
        as_control = digest(fields(c, ctrl, str(target), prompts, ids, False))
        assert (as_control == digest(fields(c, replace(ctrl, role="probe"), str(target), prompts, ids, False))) == fixed
        assert (as_control == digest(fields(c, replace(ctrl, role="candidate"), str(target), prompts, ids, True))) \
            == fixed
    os.utime(target / "config.json")  # the target's files too
    assert _digests(python, cfg, target, prompts, drafter)[0]["baseline"] != same["baseline"]


def test_each_requests_figures_come_back_from_the_record_as_the_flow_held_them(tmp_path):
    """requests.csv written as the arm records it, read back by the reuse and the recompute: per-request tok/s and
    acceptance equal the ones the flow computed from the records; the per-request plot draws them."""
    from tasks.acceptance import request_acceptance
    from tasks.bench import BenchResult, RequestRecord
    from tasks.plots import draw
    from tasks.record import ArmResult
    from tasks.reuse import recorded_requests
    from infra.tracking import Tracker

    records = [RequestRecord(0, True, completion_tokens=40, e2e_ms=1234.5, step_drafted=[4, 4, 4],
                             step_accepted=[4, 1, 0]),
               RequestRecord(1, True, completion_tokens=32, e2e_ms=987.25, step_drafted=[4, 4], step_accepted=[2, 2]),
               RequestRecord(2, False, error="boom"), RequestRecord(3, True, completion_tokens=8, e2e_ms=400.0)]
    bench = BenchResult(records, 3.0)
    tracker = Tracker(f"sqlite:///{tmp_path}/m.db")
    run = tracker.start(tracker.experiment("t"), "arm", {})
    tracker.table(run, bench.frame(), "requests.csv")
    tok_s, acceptance = recorded_requests(tracker, run)
    assert tok_s == pytest.approx(bench.request_tok_s()) and len(tok_s) == 3
    assert acceptance == pytest.approx(request_acceptance(records)) and acceptance == pytest.approx([5 / 12, 4 / 8])
    arm = ArmResult("cand", "candidate", run, True, "", {"acceptance_rate_req": 0.45, "acceptance_rate_req_lo": 0.3,
                                                         "acceptance_rate_req_hi": 0.6}, tok_s, acceptance)
    assert (tmp_path / "acceptance_per_request.png") in draw([arm], tmp_path)


def test_an_arm_measured_beside_others_learns_their_numbers_as_their_runs_end(tmp_path, monkeypatch):
    """Spread over hosts, a candidate starts before the baseline and the control end, a probe before the candidate
    does: their early stop reads the baseline's per-request tok/s and the candidate's and the control's acceptance
    from MLflow once those runs end well (FINISHED), as if measured one after another; an unfinished run teaches
    nothing."""
    from infra.stats import mean_interval
    from infra.tracking import Tracker
    from tasks import reuse
    from tasks.bench import BenchResult, RequestRecord
    from tasks.verdict import acceptance_interval, decision_thresholds, probe_flips, questions
    from tasks.verdict.evidence import NARROW

    monkeypatch.setattr(reuse, "BESIDE_S", 0.0)
    tracker = Tracker(f"sqlite:///{tmp_path}/m.db")
    exp = tracker.experiment("t")
    parent = tracker.start(exp, "diagnosis", {"specdiag.kind": "diagnosis"})
    probe = reuse.asked_beside(lambda known: questions("probe", candidate=known["candidate"], probe="raw_prompts"),
                               {"candidate": None}, tracker, exp, parent)
    cand = reuse.asked_beside(lambda known: questions("candidate", baseline_tok_s=mean_interval(known["baseline"])[1:]
                                                      if known["baseline"] else None, control=known["control"]),
                              {"baseline": None, "control": None}, tracker, exp, parent)
    assert probe().decisions == decision_thresholds("probe") and cand().baseline_tok_s is None
    assert cand().rival is None

    def arm(role, metrics, records=(), ok=True):
        run = tracker.start(exp, role, {"specdiag.kind": "arm", "specdiag.role": role, "specdiag.arm": role},
                            parent=parent)
        tracker.metrics(run, metrics)
        if records:
            tracker.table(run, BenchResult(list(records), 3.0).frame(), "requests.csv")
        if ok is not None:
            tracker.finish(run, ok)
    measured = {"acceptance_rate": 0.3, "num_drafts": 400.0}
    arm("candidate", measured, ok=None)  # still running
    assert probe().decisions == decision_thresholds("probe")
    base = [RequestRecord(i, True, completion_tokens=64, e2e_ms=3000.0 + 100 * i) for i in range(4)]
    arm("baseline", {"output_tok_s": 20.0}, base)
    assert cand().baseline_tok_s == pytest.approx(mean_interval(BenchResult(base, 3.0).request_tok_s())[1:])
    arm("candidate", measured)
    flips = probe_flips("raw_prompts", measured)
    assert flips and probe().decisions == decision_thresholds("probe") + flips
    control = {"acceptance_rate": 0.32, "num_drafts": 470.0}  # a control reused beside: its run ends at once
    arm("control", control)
    assert cand().rival == pytest.approx(acceptance_interval(control)) and cand().narrow == NARROW


def test_reused_arms_go_first_and_on_this_machine_a_measured_baseline_last():
    """flows/diagnose._in_order: a reused arm costs nothing and the arms measured after it compare with it (a reused
    control's acceptance is the candidate's rival); a baseline measured here comes after the drafters it compares."""
    from flows.diagnose import _in_order

    cfg = load_profile("demo", {})
    groups = [[a] for a in plan_arms(cfg)]
    names = lambda order: [g[0].name for g in order]  # noqa: E731
    assert names(groups) == ["baseline", "smol-permuted", "smol-self"]
    assert names(_in_order(cfg, groups, set())) == ["smol-permuted", "smol-self", "baseline"]
    assert names(_in_order(cfg, groups, {"baseline"})) == ["baseline", "smol-permuted", "smol-self"]
    assert names(_in_order(cfg, groups, {"smol-self"})) == ["smol-self", "smol-permuted", "baseline"]
    remote = cfg.model_copy(update={"host": cfg.host.model_copy(update={"kind": "ssh"})})
    assert names(_in_order(remote, groups, {"smol-self"})) == ["smol-self", "baseline", "smol-permuted"]
