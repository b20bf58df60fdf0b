"""Load shapes and the early stop, with our real client against a real loopback streaming server."""
import socket
import subprocess
import sys
import time
from dataclasses import replace

import httpx
import numpy as np
import pytest

from infra.config import BenchConfig
from tasks.bench import BenchResult, RequestRecord, benchmark
from tasks import verdict
from tasks.verdict import decision_thresholds, questions
from tasks.verdict.evidence import NARROW
from infra.stats import speedup_interval
from tasks.earlystop import Progress, Questions, should_stop


@pytest.fixture(scope="module")
def null_server():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([sys.executable, "-m", "infra.nullserver", "--port", str(port), "--tokens-per-s", "200"])
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 20
    while True:
        try:
            httpx.get(f"{url}/health", timeout=1)
            break
        except httpx.TransportError:
            assert time.monotonic() < deadline, "null server did not start"
            time.sleep(0.1)
    yield url
    proc.terminate()
    proc.wait(5)


def test_fixed_concurrency_counts_every_token_and_percentiles_are_numpys(null_server, capsys):
    cfg = BenchConfig(max_tokens=20, concurrency=4)
    result = benchmark.fn(null_server, cfg, ["hello"] * 12, spec_so_far=lambda: (30.0, 0.25, 1.0), arm="cand")
    # the progress line, at least at the end: requests, tokens and the acceptance so far
    assert "[cand] benchmark: 12/12 requests, 240 tokens, acceptance so far 0.250 over 30 drafts" in \
        capsys.readouterr().out
    assert [r.completion_tokens for r in result.records] == [20] * 12
    s = result.summary()
    ttft = [r.ttft_ms for r in result.records]
    assert s["ttft_ms_p50"] == pytest.approx(np.percentile(ttft, 50)) and s["ttft_ms_p99"] == pytest.approx(np.percentile(ttft, 99))
    assert all(len(r.itl_ms) == 19 for r in result.records)
    assert 3.0 < s["itl_ms_p50"] < 10.0  # 200 tokens/s per stream = 5 ms apart
    starts = sorted(r.start_s for r in result.records)
    assert starts[3] < 0.05 and starts[4] > 0.05  # four at once, the fifth after one finished (~100 ms)


def test_poisson_arrivals_follow_the_rate(null_server):
    cfg = BenchConfig(max_tokens=2, concurrency=16, request_rate=20.0, early_stop=False)  # every arrival
    result = benchmark.fn(null_server, cfg, ["hi"] * 30)
    starts = np.array([r.start_s for r in result.records])
    expected = np.cumsum(np.random.default_rng(0).exponential(1 / 20.0, 30))
    assert np.all(starts >= expected - 1e-3) and np.all(starts < expected + 0.05)
    assert 0.8 < 30 / starts[-1] / 20.0 < 1.6  # about 20 requests per second


def test_early_stop_ends_the_window_once_precise(null_server):
    cfg = BenchConfig(max_tokens=10, early_stop=True, min_requests=3)
    result = benchmark.fn(null_server, cfg, ["hi"] * 40)
    assert 3 <= len(result.records) < 10 and "tok/s known" in result.stop_reason
    assert result.asked == "tok/s to its own precision"  # what the window was measured towards, for its run's tag
    budget = BenchConfig(max_tokens=10, early_stop=True, max_output_tokens=50, tok_s_rel_half_width=1e-9)
    assert len(benchmark.fn(null_server, budget, ["hi"] * 40).records) == 5


def test_the_window_reaches_the_early_stop_in_prompt_order():
    """With several requests in flight they finish out of order; the early stop reads them as the verdict does, in
    prompt order, so the speedup it settles pairs request i with the baseline's i."""
    from tasks.bench import window_progress

    done = [RequestRecord(i, ok=True, completion_tokens=32, e2e_ms=ms) for i, ms in ((2, 4000.0), (0, 1000.0),
                                                                                    (1, 2000.0))]
    p = window_progress(done + [RequestRecord(3, ok=False)], 5.0, Questions(), None)
    assert p.request_tok_s == [32.0, 16.0, 8.0] and p.requests_ok == 3 and p.output_tokens == 96 and p.drafts is None


def test_the_window_settles_the_interval_the_verdict_will_use():
    """The early stop reads acceptance as the verdict does (tasks.acceptance.acceptance_interval): from 6 requests on,
    Wilson over the drafts joined with the spread over requests, from each request's own counts. Requests that
    disagree keep the window open where the drafts alone would look narrow."""
    from tasks.bench import window_progress

    # 8 requests of 60 drafts of one token each, half accepting 0.2 and half 0.8: 0.5 over 480 drafts
    done = [RequestRecord(i, ok=True, completion_tokens=64, e2e_ms=1000.0, step_drafted=[1] * 60,
                          step_accepted=[1] * (12 if i % 2 else 48) + [0] * (48 if i % 2 else 12)) for i in range(8)]
    asks = Questions(narrow=NARROW, tok_s_judged=False)
    p = window_progress(done, 5.0, asks, (480.0, 0.5, 0.5))
    drafts_only = verdict.acceptance_interval({"acceptance_rate": 0.5, "num_drafts": 480.0})
    assert drafts_only[1] - drafts_only[0] < NARROW  # [0.455-0.545]: narrow, over the drafts alone
    assert p.interval[0] < drafts_only[0] - 0.1 and p.interval[1] > drafts_only[1] + 0.1, p.interval
    assert should_stop(BenchConfig(), p) == ""  # the verdict could not call a candidate this control's match
    agreeing = [RequestRecord(i, ok=True, completion_tokens=64, e2e_ms=1000.0, step_drafted=[1] * 60,
                              step_accepted=[1] * 30 + [0] * 30) for i in range(8)]
    assert "acceptance known" in should_stop(BenchConfig(), window_progress(agreeing, 5.0, asks, (480.0, 0.5, 0.5)))


def _progress(n=10, tok_s=(10.0, 10.1, 9.9, 10.0), drafts=None, rate=0.0, decisions=(), baseline=(), judged=True,
              interval=None, **more):
    return Progress(n, 100 * n, 5.0, list(tok_s) * 3, drafts, rate,
                    Questions(decisions, baseline_tok_s=baseline, tok_s_judged=judged, **more), interval=interval)


def test_stop_rule_waits_for_both_intervals():
    cfg = BenchConfig()
    assert should_stop(cfg, _progress(n=2)) == ""  # fewer than min_requests
    assert should_stop(cfg, _progress(tok_s=(5.0, 15.0, 8.0, 12.0))) == ""  # tok/s too noisy
    assert "tok/s known" in should_stop(cfg, _progress())  # no spec decoding: tok/s is all there is
    assert should_stop(cfg, _progress(drafts=40, rate=0.5)) == ""  # 0.5 over 40 drafts: +-0.15
    assert "acceptance known" in should_stop(cfg, _progress(drafts=400, rate=0.5))  # +-0.049
    assert "acceptance known" in should_stop(cfg, _progress(drafts=40, rate=0.0))  # near zero narrows fast
    assert "token budget" in should_stop(BenchConfig(max_output_tokens=500), _progress(n=5, tok_s=(1.0, 50.0)))
    assert "time budget" in should_stop(BenchConfig(max_bench_s=5), _progress(n=1))


def test_failed_requests_do_not_count_toward_precision():
    records = [RequestRecord(i, ok=i % 2 == 0, completion_tokens=10, e2e_ms=1000.0) for i in range(6)]
    assert len(BenchResult(records, 1.0).request_tok_s()) == 3


def test_concurrency_sweep_gives_one_row_per_level(null_server):
    from tasks.bench import sweep, sweep_metrics

    frame = sweep.fn(null_server, BenchConfig(max_tokens=8, concurrency_sweep=[1, 4]), ["hi"] * 8)
    assert list(frame["concurrency"]) == [1, 4] and (frame["requests_failed"] == 0).all()
    assert frame.loc[1, "output_tok_s"] > 2 * frame.loc[0, "output_tok_s"]  # 4 streams: more tokens per second
    assert {"output_tok_s_c1", "tpot_ms_p50_c4"} <= set(sweep_metrics(frame))


def test_acceptance_clear_of_the_verdicts_thresholds_is_enough():
    cfg = BenchConfig()
    candidate = decision_thresholds("candidate")
    assert candidate == (verdict.NEAR_ZERO, verdict.HEALTHY) and Progress(1, 1, 1, [1.0]).asks.min_drafts == verdict.MIN_DRAFTS
    # 0.36 over 60 drafts is [0.25, 0.48]: far from +-0.05, but below 0.6 and above 0.1 whatever more drafts say
    assert "clear of the verdict's thresholds 0.1, 0.6" in should_stop(cfg, _progress(drafts=60, rate=0.36,
                                                                                        decisions=candidate))
    assert should_stop(cfg, _progress(drafts=60, rate=0.36)) == ""  # no thresholds: the half-width rule alone
    assert should_stop(cfg, _progress(drafts=20, rate=0.36, decisions=candidate)) == ""  # under MIN_DRAFTS
    assert should_stop(cfg, _progress(drafts=60, rate=0.55, decisions=candidate)) == ""  # [0.42, 0.67] holds 0.6
    # the control is judged against CONTROL_GOOD: 0.36 over 60 drafts still straddles 0.3
    assert should_stop(cfg, _progress(drafts=60, rate=0.36, decisions=decision_thresholds("control"))) == ""
    # with the offline acceptance known, half its lower bound is a threshold too (the integration rule)
    offline = {"offline_acceptance_rate": 0.4, "offline_num_slots": 600, "offline_mean_acceptance_length": 1.5}
    bound = decision_thresholds("candidate", offline)[-1]
    assert bound == pytest.approx(verdict.INTEGRATION_RATIO * verdict.offline_interval(offline)[0], abs=1e-4)
    assert should_stop(cfg, _progress(drafts=60, rate=bound, decisions=(bound,))) == ""


def test_a_control_settles_only_narrow_enough_for_any_candidate_to_be_compared_with_it():
    """versus_control compares every candidate with the control, in this diagnosis and in each later one that reuses
    it, and overlapping intervals decide only when narrower than NARROW: the control settles only once that narrow,
    even where it already lies clear of the candidate measured before it and of its own thresholds."""
    cfg = BenchConfig()
    near_zero = {"acceptance_rate": 0.0, "num_drafts": 93.0}  # a permuted candidate: [0, 0.04]
    asks = questions("control", candidate=near_zero)
    assert asks.narrow == NARROW and asks.rival is None and not asks.decisions and not asks.tok_s_judged
    assert asks.describe() == "acceptance to an interval narrower than 0.15; tok/s not judged"
    assert questions("baseline").describe(speculative=False) == "tok/s to its own precision"  # no drafts to ask about
    control = dict(judged=False, narrow=asks.narrow)
    # 0.5 over 100 drafts: [0.40, 0.60], clear of the candidate and of 0.3, yet too wide to call a candidate its match
    assert should_stop(cfg, _progress(drafts=100, rate=0.5, **control)) == ""
    assert "acceptance known to +-0.07" in should_stop(cfg, _progress(drafts=180, rate=0.5, **control))  # [0.43-0.57]
    # a good control narrows fast: 26 of 26 accepted is [0.87, 1]
    assert "acceptance known" in should_stop(cfg, _progress(drafts=26, rate=1.0, **control))
    # the interval is the verdict's: Wilson over drafts joined with the spread over requests, so a control whose
    # requests disagree stays open though its drafts alone would call it narrow
    spread = verdict.acceptance_interval({"acceptance_rate": 0.5, "num_drafts": 180.0, "spec_requests": 8.0,
                                          "acceptance_rate_req_lo": 0.38, "acceptance_rate_req_hi": 0.6})
    assert spread == (0.38, 0.6)
    assert should_stop(cfg, _progress(drafts=180, rate=0.5, interval=spread, **control)) == ""
    assert questions("candidate", candidate=near_zero).rival is None  # a candidate is compared with the control


def test_candidate_after_a_reused_control_settles_apart_from_it_or_narrow():
    """A control reused from an earlier diagnosis is known before the candidate runs: the candidate then answers
    versus_control's question too. Overlapping intervals decide only when narrow, so a candidate clear of its own
    thresholds but inside the control's goes on until narrow; one clear of the control ends as before."""
    cfg = BenchConfig()
    control = {"acceptance_rate": 0.32, "num_drafts": 470.0}  # [0.28, 0.36]: the demo head as the control
    asks = questions("candidate", control=control)
    assert asks.rival == pytest.approx(verdict.acceptance_interval(control)) and asks.min_drafts == verdict.MIN_DRAFTS
    assert "acceptance against the compared arm's [0.279-0.363]" in asks.describe()
    assert asks.narrow == NARROW and not questions("candidate").narrow  # narrow as versus_control needs it
    assert questions("candidate").rival is None and questions("control", control=control).rival is None
    # versus_control may call it healthy from the control's lower end on, so its speed is judged from there, not 0.6
    assert asks.speed_from == pytest.approx(verdict.acceptance_interval(control)[0])
    assert questions("candidate").speed_from == verdict.HEALTHY
    assert questions("candidate", control={"acceptance_rate": 0.2, "num_drafts": 470.0}).speed_from == verdict.HEALTHY
    # 0.33 over 120 drafts: [0.25, 0.42], clear of 0.1 and 0.6 (enough before), but inside the control's: go on
    matching = dict(decisions=asks.decisions, rival=asks.rival, min_drafts=asks.min_drafts, judged=False,
                    narrow=asks.narrow)
    assert should_stop(cfg, _progress(drafts=120, rate=0.33, **matching)) == ""
    assert "clear of the verdict's thresholds" in should_stop(cfg, _progress(drafts=120, rate=0.33, **{
        **matching, "rival": None}))
    assert "acceptance known to +-0.065" in should_stop(cfg, _progress(drafts=200, rate=0.33, **matching))
    # a candidate far below the control: apart, over the candidate's floor of drafts
    assert "and of [0.279-0.363]" in should_stop(cfg, _progress(drafts=80, rate=0.17, **matching))  # [0.10, 0.27]


def test_tok_s_clear_of_the_baseline_is_enough():
    """The speedup the verdict reports (infra.stats.speedup_interval, over the baseline's requests) clear of 1 settles
    the arm's tok/s, however wide its own interval."""
    cfg, noisy = BenchConfig(), (5.0, 15.0, 8.0, 12.0)  # mean 10 +-27%: not narrow enough on its own
    slow, fast, near = (20.0, 22.0, 21.0), (2.0, 4.0, 3.0), (11.0, 13.0, 12.0)  # baselines' per-request tok/s
    assert should_stop(cfg, _progress(tok_s=noisy)) == ""
    # ... but a slowdown against a baseline at about 21 tok/s, whatever more requests say
    got = should_stop(cfg, _progress(tok_s=noisy, baseline=slow))
    assert "0.439x the baseline [" in got and "clear of 1x" in got
    assert "clear of 1x" in should_stop(cfg, _progress(tok_s=noisy, baseline=fast))  # a speedup
    assert should_stop(cfg, _progress(tok_s=noisy, baseline=near)) == ""  # [0.58-1.03]x: speedup ~1 undecided
    # the same interval as the verdict's (tasks/speedup.speedup_interval): the early stop ends on what it will read
    assert speedup_interval(list(noisy) * 3, list(near))[2] > 1 > speedup_interval(list(noisy) * 3, list(slow))[2]
    # acceptance must still be settled too
    assert should_stop(cfg, _progress(tok_s=noisy, baseline=slow, drafts=40, rate=0.5)) == ""
    assert "acceptance known" in should_stop(cfg, _progress(tok_s=noisy, baseline=slow, drafts=400, rate=0.5))


def test_a_drafter_below_healthy_need_not_settle_tok_s():
    """draft_overhead judges a drafter's speed only where its acceptance is healthy: one whose acceptance lies clear
    below HEALTHY ends on its acceptance alone, its tok/s however noisy; one that may reach it settles tok/s too. A
    k_sweep probe's speed is judged whatever it accepts (the verdict recommends the k measured fastest)."""
    cfg, noisy = BenchConfig(), (5.0, 15.0, 8.0, 12.0)  # mean 10 +-27%, and no baseline measured yet
    asks = questions("candidate")
    assert asks.speed_from == verdict.HEALTHY and asks.tok_s_judged
    assert asks.describe() == ("acceptance against 0.1, 0.6; over at least 30 drafts; tok/s to its own precision "
                               "where its acceptance reaches 0.6")

    def stop(drafts, rate, q=asks):
        return should_stop(cfg, Progress(12, 1200, 5.0, list(noisy) * 3, drafts, rate, q, None, rate))
    assert "and tok/s not judged (acceptance below 0.6)" in stop(60, 0.0)  # a permuted drafter: [0, 0.06]
    assert "not judged" in stop(400, 0.55)  # [0.50-0.598]: known, and below 0.6
    steady = Progress(12, 1200, 5.0, [10.0, 10.1, 9.9] * 4, 60, 0.0, asks)  # its tok/s known too: the reason given is
    assert "tok/s not judged" in should_stop(cfg, steady)  # what the verdict reads, whatever else happened to settle
    assert stop(400, 0.58) == ""  # [0.53-0.63]: it may be healthy, so its speed may be judged
    assert stop(20, 0.0) == ""  # under the verdict's floor of drafts nothing is settled
    sweep = questions("probe", probe="k_sweep")
    assert sweep.speed_from == 0.0 and stop(60, 0.0, sweep) == ""


def test_a_baseline_measured_after_the_drafters_settles_their_speedups():
    """On one host the baseline comes last, asked the comparisons the verdict will make with it: each judged arm's
    speedup over it clear of that arm's bound. With none judged it ends at its first requests; its own tok/s known
    to +-10% still ends it, once it has served every prompt of the arms it is compared with."""
    from tasks.record import ArmResult
    from tasks.verdict import speed_compared

    cfg, noisy, steady = BenchConfig(), (5.0, 15.0, 8.0, 12.0), (10.0, 10.1, 9.9, 10.0)

    def stop(tok_s, compared, n=3):
        q = questions("baseline", compared=compared)
        return should_stop(cfg, Progress(n, 100 * n, 5.0, list(tok_s)[:n], None, 0.0, q))
    assert stop(noisy, ()) == "tok/s not compared (no arm measured before it has its speed judged) after 3 requests"
    assert stop(noisy, None) == ""  # measured first: its own precision, +-27% is not enough
    assert questions("baseline", compared=()).describe(False) == \
        "tok/s: no arm measured before it has its speed judged"
    fast, near = ((20.0, 21.0, 19.0), 1.0, "fast"), ((11.0, 13.0, 12.0), 1.0, "near")
    assert "tok/s against fast: 2.169x [1.636-2.876], clear of 1x after 12 requests" == stop(noisy * 3, (fast,), n=12)
    assert stop(noisy * 3, (fast, near), n=12) == ""  # near's [0.9-1.5]x holds 1: go on
    assert stop((8.0, 12.0, 10.0), ((fast[0] * 2, 1.0, "fast"),)) == ""  # clear, but over 3 of the 6 prompts it served
    assert "fast: 1.995x [1.907-2.087]" in stop(steady * 2, ((fast[0] * 2, 1.0, "fast"),), n=6)  # paired by prompt
    assert stop(noisy * 3, ((fast[0], 2.5, "fast"),), n=12) == ""  # 2x against draft_overhead's bound 2.5
    assert "known to" in stop(steady * 3, (near,), n=12)  # its own precision caps it, the comparison open
    assert stop(steady * 3, ((near[0] * 2, 1.0, "near"),)) == ""  # ... once it has served near's 6 prompts
    assert questions("baseline", compared=(fast,)).describe(False) == "tok/s against fast (3 requests, bound 1x)"

    def arm(name, role, rate, drafts=100.0, k=2, **more):
        return ArmResult(name, role, "run", True, request_tok_s=[10.0, 11.0, 12.0], k=k, **more, metrics={
            "acceptance_rate": rate, "num_drafts": drafts, "mean_acceptance_length": 1 + rate * k})
    measured = [arm("base", "baseline", 0.0, 0.0, 0), arm("permuted", "candidate", 0.0), arm("good", "extra", 0.8),
                arm("self", "control", 0.9), arm("rider", "probe", 0.8, probe="temperature", served_with="good"),
                arm("k1", "probe", 0.0, k=1, probe="k_sweep"), replace(arm("broken", "extra", 0.9), ok=False)]
    assert speed_compared(measured) == (((10.0, 11.0, 12.0), 1.3, "good"), ((10.0, 11.0, 12.0), 1.0, "k1"))
    # an n-gram drafter proposes fewer than k tokens where its match runs out: the tokens a step emits are the
    # engine's mean acceptance length (1.9 here), not 1 + acceptance x k (4.6, whose bound would be 2.3x)
    short = replace(arm("ngram", "extra", 0.9, k=4), metrics={"acceptance_rate": 0.9, "num_drafts": 100.0,
                                                              "mean_acceptance_length": 1.9})
    assert speed_compared([short])[0][1] == 1.0
    # a drafter as good as a middling control may be called healthy (versus_control), and its speed then judged: with
    # such a control measured, the baseline settles its speedup too; beside a low control (low_control decides first)
    # or a good one, only from 0.6
    middling = [*measured, replace(arm("mid", "extra", 0.32, drafts=400.0), request_tok_s=[9.0, 9.5, 9.2])]
    assert "mid" not in {a for _, _, a in speed_compared(middling)}
    at_control = [replace(r, metrics={"acceptance_rate": 0.3, "num_drafts": 470.0}) if r.role == "control" else r
                  for r in middling]
    assert "mid" in {a for _, _, a in speed_compared(at_control)}
    low = [replace(r, metrics={"acceptance_rate": 0.2, "num_drafts": 470.0}) if r.role == "control" else r
           for r in middling]
    assert "mid" not in {a for _, _, a in speed_compared(low)}


def test_the_speedup_pairs_prompts_over_equal_counts_and_keeps_every_request_otherwise():
    """Paired by prompt where both arms measured the same prompts: a shared per-prompt swing cancels. Where the early
    stop ended them at different counts, Welch's interval over every request of both: a baseline's later requests
    still narrow it, instead of being dropped to pair the first few."""
    arm, base = [10.0, 20.0, 15.0], [5.0, 10.0, 7.5]  # exactly twice the baseline, prompt by prompt
    assert speedup_interval(arm, base) == pytest.approx((2.0, 2.0, 2.0), abs=1e-6)
    steady = [10.0, 10.5, 9.5, 10.2, 9.8, 10.1, 9.9, 10.0]
    few, many = speedup_interval([20.0, 19.0, 21.0], steady[:3]), speedup_interval([20.0, 19.0, 21.0], steady)
    assert few[1] < many[1] < 2 < many[2] < few[2]  # the baseline's five later requests narrow the unpaired interval
    assert speedup_interval([10.0], steady) is None and speedup_interval(steady, [10.0]) is None
    # a request that emitted no token has no ratio: dropped (with its pair), not a log of 0 that settles anything
    assert speedup_interval([20.0, 0.0, 21.0, 19.0], [10.0, 10.5, 9.5, 10.0]) == pytest.approx(
        speedup_interval([20.0, 21.0, 19.0], [10.0, 9.5, 10.0]))
    assert speedup_interval([20.0, 0.0, 19.0], steady) == pytest.approx(speedup_interval([20.0, 19.0], steady))


def test_a_drafter_whose_steps_emit_many_tokens_settles_tok_s_against_draft_overheads_bound():
    """draft_overhead also calls a drafter that gains under half the tokens each step emits: with k=4 at 0.9
    acceptance a step emits 4.6 tokens, so being faster than the baseline does not settle its question; being clear
    of 2.3 times the baseline's interval does (tasks/verdict/rules.draft_overhead tests the same bound)."""
    cfg, noisy = BenchConfig(), (5.0, 15.0, 8.0, 12.0)  # mean 10 +-27%

    def stop(baseline, rate=0.9, k=4, per_draft=None):  # drafts of k tokens each, unless told
        progress = _progress(tok_s=noisy, baseline=baseline, drafts=400, rate=rate, k=k)
        return should_stop(cfg, replace(progress, accepted_per_draft=k * rate if per_draft is None else per_draft))
    fast, faster = (2.0, 4.0, 3.0), (1.0, 1.5, 1.2)
    assert stop(fast) == ""  # 3.2x [1.6-6.2] the baseline: faster, but it still holds 2.3
    assert "clear of 2.3x" in stop(faster)  # 7.5x [5.1-11.3]
    assert "clear of 1x" in stop(fast, rate=0.2)  # 1.8 tokens a step: the bound is 1
    assert "clear of 2.3x" in stop((20.0, 22.0, 21.0))  # a slowdown is clear of both
    # the tokens a step emits are counted per draft, as the verdict's speed model counts them: n-gram drafts shorter
    # than k (0.9 of 1.1 draft tokens accepted) emit 1.99 tokens a step, not 4.6, and the bound is 1
    assert "clear of 1x" in stop(fast, per_draft=0.99)


def test_the_control_and_probes_need_only_their_acceptance():
    cfg, noisy = BenchConfig(), (5.0, 15.0, 8.0, 12.0)  # tok/s unsettled, overlapping the baseline
    assert verdict.speed_judged("candidate") and verdict.speed_judged("baseline")
    assert not verdict.speed_judged("control") and not verdict.speed_judged("probe", "raw_prompts")
    assert verdict.speed_judged("probe", "k_sweep")  # the verdict recommends the k whose measured speedup is best
    control = decision_thresholds("control")
    # a control accepting 0.97 of 40 drafts is above 0.6 whatever more drafts say; its speed is not judged
    near = (9.0, 11.0, 10.0)  # the baseline's per-request tok/s: a speedup about 1, undecided
    reason = should_stop(cfg, _progress(tok_s=noisy, baseline=near, drafts=40, rate=0.97, decisions=control,
                                        judged=False))
    assert reason.startswith("acceptance [") and "tok/s" not in reason
    # the same numbers on an arm whose speedup the verdict reports must wait for tok/s
    assert should_stop(cfg, _progress(tok_s=noisy, baseline=near, drafts=40, rate=0.97, decisions=control)) == ""
    # unsettled acceptance still holds it, and a no-spec arm always needs its tok/s
    assert should_stop(cfg, _progress(tok_s=noisy, drafts=40, rate=0.5, decisions=control, judged=False)) == ""
    assert should_stop(cfg, _progress(tok_s=noisy, judged=False)) == ""


def test_a_probe_settles_against_the_measured_candidate_where_the_probes_rule_would_flip():
    """A probe arm's question is tasks/verdict/rules.probes's: does its acceptance differ from the candidate's (apart
    from its interval, by PROBE_RATIO)? Clear of NEAR_ZERO and HEALTHY alone it has not settled that; clear of the
    flips from the candidate's measured window as well, it has. A probe counted only upwards (control_mapping) has
    no flips below the candidate."""
    from tasks.verdict import probe_flips

    cfg, cand = BenchConfig(), {"num_drafts": 400, "acceptance_rate": 0.30}  # [0.256-0.348]
    flips = probe_flips("raw_prompts", cand)
    assert flips == pytest.approx((0.45, 0.2))  # 1.5 x 0.30 lies above 0.348, 0.30 / 1.5 below 0.256
    assert probe_flips("control_mapping", cand) == flips[:1] and probe_flips("k_sweep", cand) == ()
    wide = {"num_drafts": 20, "acceptance_rate": 0.30}  # [0.145-0.519]: its ends lie beyond the ratios
    assert probe_flips("raw_prompts", wide) == pytest.approx((0.5190, 0.1455), abs=1e-3)
    assert probe_flips("raw_prompts", None) == () and probe_flips("raw_prompts", {"num_drafts": 0}) == ()

    def stop(rate, drafts=60, probe="raw_prompts"):
        asks = questions("probe", candidate=cand, probe=probe)
        return should_stop(cfg, Progress(10, 1000, 5.0, [10.0, 30.0] * 5, drafts, rate, asks))
    # 0.45 of 60 drafts: [0.33-0.58], clear of 0.1 and 0.6 but holding 1.5x the candidate's rate
    assert stop(0.45) == "" and questions("probe").decisions == decision_thresholds("probe")
    assert "clear of the verdict's thresholds" in should_stop(cfg, Progress(10, 1000, 5.0, [10.0, 30.0] * 5, 60, 0.45,
                                                                            questions("probe")))
    assert "clear of the verdict's thresholds" in stop(0.80)  # [0.68-0.88]: far above, differs is settled
    assert "clear of the verdict's thresholds" in stop(0.30, drafts=300)  # [0.25-0.35]: inside, no clear difference
    assert stop(0.19, drafts=150) == ""  # [0.14-0.26]: below the candidate, holding its rate over 1.5
    assert "clear of the verdict's thresholds" in stop(0.19, drafts=150, probe="control_mapping")  # counted upwards


def test_each_probe_arm_is_asked_its_own_question():
    """As the arm flow asks them (flows/arm._asks): a probe riding on the candidate's server gets the flips of the
    candidate's window; a k_sweep arm, whose speedup picks the recommended k, settles its tok/s against the
    baseline's; the control settles narrow, whatever the candidate's interval."""
    from flows.arm import _asks
    from infra.arms import plan_arms
    from infra.config import load_profile

    plan = {a.name: a for a in plan_arms(load_profile("demo", sets=["probes=[k_sweep, raw_prompts]", "k_sweep=[2]"]))}
    cand, base = {"num_drafts": 400, "acceptance_rate": 0.30}, [10.0, 11.0, 10.5]
    raw = _asks(plan["smol-permuted@raw"], None, base, cand, False, None, ("e", "p"))
    assert {0.45, 0.2} <= set(raw.decisions) and not raw.tok_s_judged
    sweep = _asks(plan["smol-permuted@k=2"], None, base, cand, False, None, ("e", "p"))
    assert sweep.tok_s_judged and sweep.baseline_tok_s and 0.45 not in sweep.decisions
    assert _asks(plan["smol-self"], None, base, cand, False, None, ("e", "p")).narrow == NARROW


def test_the_thinking_switch_reaches_chat_requests_and_only_them():
    """bench.chat_template_kwargs goes into every chat request as vLLM reads it (ChatCompletionRequest's
    chat_template_kwargs); raw completions have no template to pass it to."""
    from infra.config import BenchConfig
    from tasks.bench import _payload

    path, body = _payload(BenchConfig(chat_template_kwargs={"thinking": False}), "m", "hi", 8)
    assert path == "/v1/chat/completions" and body["chat_template_kwargs"] == {"thinking": False}
    assert "chat_template_kwargs" not in _payload(BenchConfig(), "m", "hi", 8)[1]
    raw = BenchConfig(endpoint="completions", chat_template_kwargs={"thinking": False})
    assert "chat_template_kwargs" not in _payload(raw, "m", "hi", 8)[1]


def test_a_drafter_served_past_its_positions_settles_acceptance_before_and_past_them():
    """context_limit's question (static check position_limit): the window ends only once acceptance before the
    drafter's declared positions and past them are each over the rules' floor (MIN_DRAFTS drafts of k tokens) and
    apart, or both narrow; without per-request counts the verdict cannot ask it, so it holds nothing."""
    cfg = BenchConfig()
    asks = questions("candidate", position_limit=128, k=4)
    assert (asks.position_limit, asks.k) == (128, 4)

    def stop(split, drafts=400, rate=0.5):  # 0.5 over 400 drafts: the arm's own acceptance is known to +-0.049
        return should_stop(cfg, Progress(10, 1000, 5.0, [10.0, 10.1, 9.9, 10.0] * 3, drafts, rate, asks, split))
    assert "acceptance known" in stop(None) and "position" not in stop(None)  # no per-request counts
    assert stop(((380.0, 400.0), (4.0, 100.0))) == ""  # 25 drafts past 128: under the floor, however far apart
    assert stop(((380.0, 400.0), (0.0, 0.0))) == ""  # nothing served past it yet
    apart = stop(((380.0, 400.0), (4.0, 400.0)))
    assert "before position 128 [0." in apart and apart.endswith(": apart")
    assert stop(((70.0, 120.0), (60.0, 120.0))) == ""  # 30 drafts a side: [0.41-0.74] against [0.33-0.67]
    assert stop(((1000.0, 2000.0), (1000.0, 2000.0))).endswith("both known to +-0.05")  # 500 drafts a side
    assert stop(((380.0, 400.0), (4.0, 400.0)), drafts=40, rate=0.5) == ""  # the arm's own acceptance still open
    assert questions("candidate").position_limit == 0  # a drafter within its positions is not asked
