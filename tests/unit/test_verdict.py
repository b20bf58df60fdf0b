import pytest

from tasks.inspect import Finding
from tasks.record import ArmResult
from tasks.verdict import acceptance_interval, decide, mean_interval, throughput_lines, wilson


def arm(name, role, rate=None, drafts=200, k=4, ok=True, error="", tok_s=None):
    m = {"output_tokens": 100.0}
    if rate is not None:
        m.update(acceptance_rate=rate, num_drafts=float(drafts), num_draft_tokens=float(drafts * k))
    return ArmResult(name, role, f"run-{name}", ok, error, m, tok_s or [])


BASE = arm("baseline", "baseline")
VOCAB = {"cand": [Finding("error", "embedding_mismatch", "rows shuffled")]}


def test_wilson_matches_the_textbook_values():
    lo, hi = wilson(50, 100)
    assert (round(lo, 4), round(hi, 4)) == (0.4038, 0.5962)
    assert wilson(0, 0) == (0.0, 1.0)
    assert acceptance_interval({"acceptance_rate": 0.5, "num_drafts": 100}) == (lo, hi)


@pytest.mark.parametrize("cand, ctrl, findings, cause", [
    (arm("cand", "candidate", 0.01), arm("ctl", "control", 0.99), VOCAB, "vocab_mismatch"),
    (arm("cand", "candidate", 0.45), arm("ctl", "control", 0.99), {}, "training_quality"),
    (arm("cand", "candidate", 0.45), arm("ctl", "control", 0.99), VOCAB, "vocab_mismatch"),
    (arm("cand", "candidate", 0.99), arm("ctl", "control", 0.99), {}, "healthy"),
    (arm("cand", "candidate", 0.99), None, {}, "healthy"),
    (arm("cand", "candidate", 0.12), arm("ctl", "control", 0.10), {}, "integration"),
    (arm("cand", "candidate", ok=False, error="SpecDecodingOff: [x] no vllm:spec_decode_* series"),
     arm("ctl", "control", 0.99), {}, "spec_disabled"),
    (arm("cand", "candidate", 0.0, drafts=0), arm("ctl", "control", 0.99), {}, "spec_disabled"),
])
def test_rules_name_the_cause(cand, ctrl, findings, cause):
    results = [BASE, cand] + ([ctrl] if ctrl else [])
    v = decide(results, findings)
    assert v.cause == cause, v.evidence
    assert v.evidence


def test_verdict_never_claims_more_than_the_evidence():
    # too few drafts: no interval is narrow enough
    v = decide([BASE, arm("cand", "candidate", 0.01, drafts=10), arm("ctl", "control", 0.99)], VOCAB)
    assert v.cause == "inconclusive" and "--prompts" in v.next_step
    # wide overlapping intervals between candidate and control
    v = decide([BASE, arm("cand", "candidate", 0.50, drafts=40), arm("ctl", "control", 0.58, drafts=40)], {})
    assert v.cause == "inconclusive" and "overlap" in " ".join(v.evidence)
    # a control with a handful of drafts cannot anchor a comparison
    v = decide([BASE, arm("cand", "candidate", 0.45), arm("ctl", "control", 1.0, drafts=5)], {})
    assert v.cause == "inconclusive" and "too few drafts" in " ".join(v.evidence)
    # ...but a control that accepted all of 26 drafts can
    v = decide([BASE, arm("cand", "candidate", 0.32, drafts=56), arm("ctl", "control", 1.0, drafts=26)], {})
    assert v.cause == "training_quality"
    # a mediocre drafter with no control to compare with
    v = decide([BASE, arm("cand", "candidate", 0.45)], {})
    assert v.cause == "inconclusive" and "--control" in v.next_step
    # the candidate arm crashed for another reason
    v = decide([BASE, arm("cand", "candidate", ok=False, error="ServerDied: boom"), arm("ctl", "control", 0.99)], {})
    assert v.cause == "inconclusive"


def test_near_zero_without_a_static_fault_is_not_called_vocab_mismatch():
    v = decide([BASE, arm("cand", "candidate", 0.01), arm("ctl", "control", 0.99)], {})
    assert v.cause == "training_quality"


def test_throughput_interval_and_speedup_line():
    mean, lo, hi = mean_interval([10.0, 12.0, 11.0, 13.0])
    assert mean == 11.5 and lo < 11.5 < hi
    lines = throughput_lines([arm("baseline", "baseline", tok_s=[10, 11, 9, 10]),
                              arm("cand", "candidate", 0.5, tok_s=[5, 5.5, 4.5, 5])])
    assert lines and "speedup 0.50x" in lines[0]
