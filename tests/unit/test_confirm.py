"""--confirm: which fix one more arm applies for each cause, and how its arm is judged against the candidate."""
import pytest

from infra.arms import plan_arms
from infra.config import load_profile
from tasks.confirm import fix_arm, judge
from tasks.verdict import decide
from tests.unit.test_verdict import BASE, VOCAB, arm


def _plan(drafter, control, **extra):
    cfg = load_profile("demo", {"drafter": drafter, "control": control, **extra})
    return cfg, plan_arms(cfg)


def _speed(r, tok_s):
    r.request_tok_s = [tok_s] * 8
    return r


def test_draft_overhead_fix_is_the_candidate_at_the_recommended_k():
    cfg, arms = _plan("smol-self", "")
    v = decide([BASE, arm("cand", "candidate", 0.99)], {})
    v.cause, v.fix = "draft_overhead", {"num_speculative_tokens": 2}
    fixed, why = fix_arm(cfg, v, arms)
    assert fixed.name == "smol-self@fix-k=2" and fixed.role == "confirm" and why == ""
    assert fixed.spec.num_speculative_tokens == 2 and fixed.spec.model == arms[1].spec.model


def test_a_vocabulary_fault_is_confirmed_by_the_candidate_with_the_controls_mapping():
    v = decide([BASE, arm("cand", "candidate", 0.01), arm("ctl", "control", 0.99)], VOCAB)
    assert v.cause == "vocab_mismatch" and v.fix == {"probe": "control_mapping"}
    cfg, arms = _plan("smol-eagle3-scrambled", "smol-eagle3")
    fixed, _ = fix_arm(cfg, v, arms)
    assert fixed.role == "confirm" and fixed.mapping_from == "embedded:smol-eagle3"
    cfg, arms = _plan("smol-permuted", "smol-self")  # draft models have no d2t to swap: no arm, and why
    fixed, why = fix_arm(cfg, v, arms)
    assert fixed is None and "EAGLE-3" in why


def test_evidence_that_is_already_the_intervention_runs_nothing_more():
    probe = arm("c@raw", "probe", 0.60)
    probe.probe = "raw_prompts"
    v = decide([BASE, arm("cand", "candidate", 0.25), probe], {})
    assert v.cause == "template_mismatch"
    cfg, arms = _plan("smol-self", "")
    assert fix_arm(cfg, v, arms) == (None, "confirmed by the probe arm c@raw")
    v = decide([BASE, arm("cand", "candidate", 0.45), arm("ctl", "control", 0.99)], {})  # training_quality
    fixed, why = fix_arm(cfg, v, arms)
    assert fixed is None and "no fix that one more arm can apply for `training_quality`" in why


@pytest.mark.parametrize("fixed_rate, outcome", [(0.60, "confirmed"), (0.02, "not confirmed")])
def test_a_fix_arm_is_confirmed_only_when_it_accepts_clearly_more(fixed_rate, outcome):
    v = decide([BASE, arm("cand", "candidate", 0.01), arm("ctl", "control", 0.99)], VOCAB)
    results = [BASE, arm("cand", "candidate", 0.01), arm("cand@control-mapping-fix", "confirm", fixed_rate)]
    assert judge(v, results)[0] == outcome


@pytest.mark.parametrize("fixed_tok_s, outcome", [(14.0, "confirmed"), (9.05, "not confirmed")])
def test_a_k_fix_is_confirmed_only_when_its_paired_speedup_lies_above_the_candidates(fixed_tok_s, outcome):
    base = _speed(arm("baseline", "baseline"), 10.0)
    cand = _speed(arm("cand", "candidate", 0.99), 9.0)
    cand.request_tok_s = [9.0, 9.3, 8.8, 9.1, 9.2, 8.9, 9.0, 9.1]
    fixed = _speed(arm("cand@fix-k=2", "confirm", 0.99), fixed_tok_s)
    fixed.request_tok_s = [fixed_tok_s + d for d in (0.1, -0.2, 0.3, 0.0, -0.1, 0.2, 0.1, -0.1)]
    base.request_tok_s = [10.0, 10.2, 9.9, 10.1, 10.0, 9.8, 10.1, 10.0]
    v = decide([base, cand], {})
    v.cause = "draft_overhead"
    status, line = judge(v, [base, cand, fixed])
    assert status == outcome and "paired speedup" in line


@pytest.mark.parametrize("probe_rate, outcome", [(0.60, "confirmed"), (0.02, "not confirmed")])
def test_under_confirm_the_controls_mapping_is_a_window_planned_up_front(capsys, probe_rate, outcome):
    """The fix a vocabulary verdict implies, the candidate with the control's d2t, is planned with --confirm as a probe
    on the candidate's server (swapped in: a window, not a load after the verdict), and --confirm judges that arm."""
    from flows.diagnose import main
    from tasks.confirm import SERVED, confirm

    cfg, arms = _plan("smol-eagle3-scrambled", "smol-eagle3", confirm=True)
    assert [a.name for a in arms if a.probe == "control_mapping"] == ["smol-eagle3-scrambled@control-mapping"]
    assert len([a for a in arms if a.probe == "aux_layers"]) >= 2
    assert main(["--drafter", "smol-eagle3-scrambled", "--control", "smol-eagle3", "--confirm", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "plan: 2 server load(s)" in out and "smol-eagle3-scrambled@control-mapping: swapped into" in out, out
    assert "smol-eagle3-scrambled@aux=1,14,26: swapped into" in out  # the demo serves eager: aux ids swap too
    assert not [a for a in _plan("smol-permuted", "smol-self", confirm=True)[1] if a.probe]  # draft models: no d2t
    probe = arm("smol-eagle3-scrambled@control-mapping", "probe", probe_rate)
    probe.probe = "control_mapping"
    results = [BASE, arm("cand", "candidate", 0.01), arm("ctl", "control", 0.99), probe]
    v = decide(results[:3], VOCAB)
    assert fix_arm(cfg, v, arms, results) == (None, SERVED + probe.arm)  # nothing more is loaded

    class Record:
        def tag(self, *a): pass
        def text(self, *a): pass
    assert f"--confirm: `{outcome}`" in confirm.fn(Record(), "run", v, results, SERVED + probe.arm).evidence[-1]
