import json

import pytest

from infra.config import SpecdiagError
from infra.promptsets import load as load_prompts
from tasks.bench import BenchResult, RequestRecord
from tasks.compare import comparison_table
from tasks.record import ArmResult


def _rec(i, ttft, tpot, e2e, toks, itl=(), ok=True):
    return RequestRecord(i, ok=ok, completion_tokens=toks, prompt_tokens=5, ttft_ms=ttft, tpot_ms=tpot,
                         e2e_ms=e2e, itl_ms=list(itl))


def test_summary_counts_only_successful_requests_and_uses_numpy_percentiles():
    recs = [_rec(0, 100, 10, 500, 40, [9, 11]), _rec(1, 300, 30, 900, 20, [29, 31]),
            _rec(2, float("nan"), float("nan"), float("nan"), 0, ok=False)]
    s = BenchResult(recs, duration_s=2.0).summary()
    assert s["output_tokens"] == 60 and s["output_tok_s"] == 30.0
    assert s["requests_ok"] == 2 and s["requests_failed"] == 1
    assert s["ttft_ms_p50"] == 200 and s["ttft_ms_p99"] == pytest.approx(298)
    assert s["itl_ms_p50"] == 20


def test_frame_has_one_row_per_request_with_itl_list():
    frame = BenchResult([_rec(0, 1, 2, 3, 4, [1.5])], 1.0).frame()
    assert list(frame["completion_tokens"]) == [4] and json.loads(frame["itl_ms"][0]) == [1.5]


def test_prompts_cycle_and_bad_sets_are_clear(tmp_path):
    prompts = load_prompts("math", 20)
    assert len(prompts) == 20 and prompts[16] == prompts[0] and len(set(prompts)) == 16
    assert load_prompts("math", 20, repeat=False) == prompts[:16]
    with pytest.raises(SpecdiagError, match="shipped sets: chat"):
        load_prompts("nope", 1)
    bad = tmp_path / "p.jsonl"
    bad.write_text('{"text": "x"}\n')
    with pytest.raises(SpecdiagError, match="p.jsonl: entry 1 has no .prompt."):
        load_prompts(str(bad), 1)


def test_comparison_speedup_is_against_baseline():
    results = [ArmResult("baseline", "baseline", "r0", True, metrics={"output_tok_s": 10.0}),
               ArmResult("cand", "candidate", "r1", True, metrics={"output_tok_s": 5.0, "acceptance_rate": 0.02}),
               ArmResult("ctl", "control", "r2", False, error="boom")]
    table = comparison_table(results).set_index("arm")
    assert table.loc["baseline", "speedup_vs_baseline"] == 1.0
    assert table.loc["cand", "speedup_vs_baseline"] == 0.5
    assert table.loc["ctl", "status"] == "FAILED"


def test_every_throughput_figure_the_verdict_prints_is_a_recorded_metric_with_the_same_digits(tmp_path, prefect_server):
    """Aggregate output tok/s, the mean of the requests' own tok/s (per stream) and the speedup paired by prompt,
    each with its interval, recorded on the arm's run; the verdict's line prints those numbers, as the table does."""
    from infra.tracking import Tracker
    from tasks.compare import compare, comparison_markdown
    from tasks.verdict import throughput_lines

    tracker = Tracker(f"sqlite:///{tmp_path}/mlflow.db")
    exp = tracker.experiment("t")
    parent = tracker.start(exp, "p", {})
    base = ArmResult("baseline", "baseline", tracker.start(exp, "b", {}, parent), metrics={"output_tok_s": 15.381}, ok=True,
                     request_tok_s=[15.2, 15.9, 15.0, 15.6])
    cand = ArmResult("cand", "candidate", tracker.start(exp, "c", {}, parent), metrics={"output_tok_s": 1.879}, ok=True,
                     request_tok_s=[1.9, 2.2, 1.8, 2.1])
    frame = compare.fn(tracker, parent, [base, cand])
    got = tracker.client.get_run(cand.run_id).data.metrics
    assert got["speedup_vs_baseline"] == pytest.approx(1.879 / 15.381)
    assert got["stream_tok_s"] == pytest.approx(2.0) and got["stream_tok_s_lo"] < 2.0 < got["stream_tok_s_hi"]
    assert got["speedup_paired_lo"] < got["speedup_paired"] < got["speedup_paired_hi"]
    line = throughput_lines([base, cand])[0]
    assert f"{got['stream_tok_s']:.3f} tok/s per stream" in line and f"speedup {got['speedup_paired']:.3f}x" in line
    table = comparison_markdown(frame)
    assert f"| {got['stream_tok_s']:.3f} | {got['speedup_paired']:.3f} |" in table
