"""Acceptance from each request's own counts (vLLM --per-request-spec-decode-metrics detailed): the interval over
requests, acceptance by position in the sequence, and the context_limit rule that reads it."""
import pytest

from infra.stats import ratio_interval
from tasks.acceptance import request_metrics, split_at, step_positions
from tasks.bench import RequestRecord, _one
from tasks.inspect import Finding, check_positions
from tasks.record import ArmResult
from tasks.verdict import acceptance_interval, decide
from tests.fixtures import formats as F


def rec(i, prompt, accepted, k=4):
    return RequestRecord(i, ok=True, prompt_tokens=prompt, completion_tokens=1 + sum(a + 1 for a in accepted),
                         step_drafted=[k] * len(accepted), step_accepted=list(accepted))


def test_a_step_starts_where_the_prompt_prefill_and_earlier_steps_left_the_sequence():
    assert step_positions(rec(0, 10, [2, 0, 3])) == [11, 14, 15]


def test_the_usage_chunk_of_a_vllm_stream_fills_the_record():
    """The final chunk as vLLM 0.32's chat serving writes it (entrypoints/openai/chat_completion/serving.py: usage,
    then metrics.speculative_decoding, protocol SpeculativeDecodingMetrics) when streamed with include_usage."""
    import asyncio

    import orjson

    chunks = [{"choices": [{"delta": {"content": "Hi"}}]}, {"choices": [{"delta": {"content": " there"}}]},
              {"choices": [], "usage": {"prompt_tokens": 7, "completion_tokens": 5, "total_tokens": 12},
               "metrics": {"speculative_decoding": {
                   "mean_acceptance_length": 2.0, "draft_acceptance_rate": 0.25, "acceptance_histogram": [1, 1, 0, 0],
                   "num_spec_steps": 2, "num_accepted_draft_tokens": 2, "num_draft_tokens": 8, "num_spec_tokens": 4,
                   "per_step_accepted": [2, 0], "per_step_drafted": [4, 4]}}}]

    class Replay:
        async def post(self, path, body, on_event):
            for i, c in enumerate(chunks):
                on_event(orjson.dumps(c), float(i))
            on_event(b"[DONE]", 9.0)

    r = asyncio.run(_one(Replay(), "/v1/chat/completions", {}, RequestRecord(0)))
    assert r.ok and (r.step_accepted, r.step_drafted, r.prompt_tokens) == ([2, 0], [4, 4], 7)


def test_the_interval_over_requests_widens_with_their_spread_and_needs_two():
    same = ratio_interval([10, 11, 10, 9], [40, 40, 40, 40])
    spread = ratio_interval([40, 0, 40, 0], [40, 40, 40, 40])
    assert same[0] == pytest.approx(0.25) and same[2] - same[1] < 0.1
    assert spread[0] == pytest.approx(0.5) and spread[2] - spread[1] > 0.8  # two kinds of request, not 160 drafts
    assert ratio_interval([3], [4]) is None


def test_the_verdict_takes_the_wider_interval_once_enough_requests_ran():
    short, long = [rec(i, 20, [4] * 10) for i in range(4)], [rec(i, 400, [0] * 10) for i in range(4, 8)]
    m = request_metrics(short + long)
    assert m["spec_requests"] == 8 and m["acceptance_rate_req"] == pytest.approx(0.5)
    m |= {"acceptance_rate": 0.5, "num_drafts": 80.0}
    lo, hi = acceptance_interval(m)
    assert (lo, hi) == (pytest.approx(m["acceptance_rate_req_lo"]), pytest.approx(m["acceptance_rate_req_hi"]))
    assert hi - lo > 0.5  # drafts as the unit would say [0.39, 0.61]
    few = request_metrics(short[:2] + long[:2]) | {"acceptance_rate": 0.5, "num_drafts": 40.0}
    assert acceptance_interval(few)[1] - acceptance_interval(few)[0] < 0.35  # 4 requests: drafts are the unit


def test_positions_are_bucketed_by_powers_of_two_and_split_at_a_limit():
    m = request_metrics([rec(0, 20, [4] * 10), rec(1, 300, [0] * 10)])
    assert (m["seqpos_0_accepted"], m["seqpos_0_drafted"]) == (40, 40)
    assert (m["seqpos_256_accepted"], m["seqpos_256_drafted"]) == (0, 40)
    assert split_at(m, 128) == ((40, 40), (0, 40))
    assert split_at(m, 4096) == ((40, 80), (0, 0))


@pytest.mark.parametrize("head, limit", [(F.eagle_repo, 2048), (F.specforge, 4096)])
def test_a_head_declaring_fewer_positions_than_served_is_flagged(tmp_path, head, limit):
    """SafeAILab/EAGLE's traineagle3 config declares 2048 positions (yuhuili's Llama-3.1 heads; vLLM #48894),
    SpecForge's 4096; a Llama-3.1 target serves 131072."""
    from infra.checkpoints import read_drafter, read_target
    from infra.executor import LocalExecutor

    fs = LocalExecutor()
    d = read_drafter(fs, str(head(tmp_path / "h", F.LLAMA)))
    t = read_target(fs, str(F.write_target(tmp_path / "t", F.LLAMA)))
    (f,) = check_positions(d, t, None)
    assert (f.severity, f.code, f.value) == ("warning", "position_limit", limit) and "131072" in f.message
    assert check_positions(d, t, served=limit) == []  # served no longer than it declares: nothing to say


def _arm(metrics, k=4):
    m = {"output_tokens": 500.0, "num_drafts": 300.0, "num_draft_tokens": 1200.0, **metrics}
    return ArmResult("short", "candidate", "r", True, "", m, method="draft_model", k=k)


LIMIT = [Finding("warning", "position_limit", "declares 128", 128.0)]


def test_far_less_acceptance_past_the_declared_limit_is_context_limit():
    """The demo's smol-self-short as vLLM CPU served it: 260 of 261 accepted before position 128, 0 of 909 after."""
    m = {"acceptance_rate": 0.222, "seqpos_0_accepted": 260.0, "seqpos_0_drafted": 261.0, "seqpos_128_accepted": 0.0,
         "seqpos_128_drafted": 72.0, "seqpos_256_accepted": 0.0, "seqpos_256_drafted": 837.0}
    v = decide([_arm(m)], {"short": LIMIT})
    assert v.cause == "context_limit", v.evidence
    assert any("beyond position 128: 0 of 909" in e for e in v.evidence) and "--max-model-len" in v.next_step
    assert decide([_arm(m)], {}).cause != "context_limit"  # no declared limit: position alone names nothing


def test_within_its_range_or_healthy_beyond_it_the_limit_names_nothing():
    within = {"acceptance_rate": 0.95, "seqpos_0_accepted": 1140.0, "seqpos_0_drafted": 1200.0}
    v = decide([_arm(within)], {"short": LIMIT})
    assert v.cause == "healthy" and any("stayed within its declared range" in e for e in v.evidence)
    even = {"acceptance_rate": 0.9, "seqpos_0_accepted": 540.0, "seqpos_0_drafted": 600.0,
            "seqpos_256_accepted": 540.0, "seqpos_256_drafted": 600.0}
    assert decide([_arm(even)], {"short": LIMIT}).cause == "healthy"


def test_served_only_beyond_the_limit_says_what_to_run():
    beyond = {"acceptance_rate": 0.1, "seqpos_256_accepted": 120.0, "seqpos_256_drafted": 1200.0}
    v = decide([_arm(beyond)], {"short": LIMIT})
    assert v.cause == "inconclusive" and "shorter than 128" in v.next_step, v
