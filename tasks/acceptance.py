"""Acceptance from each request's own counts (vLLM's --per-request-spec-decode-metrics detailed): an interval from
the spread over requests, and acceptance by position in the sequence.

Verify step j of a request happens when the sequence holds the prompt, the prefill's token and every token the
earlier steps emitted (accepted + 1 each): that length is the position its drafts start at. Positions are bucketed
by powers of two from 128, the values drafters' position limits take (2048, 4096, ...)."""
from __future__ import annotations

from collections import defaultdict
from typing import TYPE_CHECKING

from infra.stats import ratio_interval, wilson

if TYPE_CHECKING:  # tasks.bench asks this module for the early stop's split by position
    from tasks.bench import RequestRecord

FIRST_BUCKET = 128
MIN_REQUESTS = 6  # fewer requests than this give no usable spread over requests: drafts are the unit then


def over_requests(m: dict[str, float]) -> bool:
    return m.get("spec_requests", 0) >= MIN_REQUESTS and "acceptance_rate_req_lo" in m


def acceptance_interval(m: dict[str, float]) -> tuple[float, float]:
    """The acceptance interval the verdict reasons with, and the early stop settles: Wilson over the drafts, joined
    with the interval over requests where enough of them ran (drafts within one request are correlated)."""
    drafts = m.get("num_drafts", 0.0)
    lo, hi = wilson(m.get("acceptance_rate", 0.0) * drafts, drafts)
    if over_requests(m):
        return min(lo, m["acceptance_rate_req_lo"]), max(hi, m["acceptance_rate_req_hi"])
    return lo, hi


def bucket(position: int) -> int:
    """The start of the power-of-two bucket holding this position: 0, 128, 256, 512, ..."""
    return 0 if position < FIRST_BUCKET else 1 << (position.bit_length() - 1)


def step_positions(r: RequestRecord) -> list[int]:
    pos, out = r.prompt_tokens + 1, []
    for accepted in r.step_accepted:
        out.append(pos)
        pos += accepted + 1
    return out


def by_position(records: list[RequestRecord]) -> dict[int, tuple[float, float]]:
    """bucket start -> (accepted, drafted) draft tokens over every request's steps in that bucket."""
    out: dict[int, list[float]] = defaultdict(lambda: [0.0, 0.0])
    for r in records:
        for pos, acc, drafted in zip(step_positions(r), r.step_accepted, r.step_drafted):
            out[bucket(pos)][0] += acc
            out[bucket(pos)][1] += drafted
    return {b: (a, d) for b, (a, d) in sorted(out.items())}


def request_acceptance(records: list[RequestRecord]) -> list[float]:
    """Each measured request's own acceptance (its accepted over its drafted draft tokens), where it drafted."""
    return [sum(r.step_accepted) / sum(r.step_drafted) for r in records if r.ok and sum(r.step_drafted) > 0]


def request_metrics(records: list[RequestRecord]) -> dict[str, float]:
    """acceptance_rate_req with its interval over requests, and seqpos_<bucket>_{accepted,drafted}; {} when the
    engine gave no per-request counts."""
    ok = [r for r in records if r.ok and r.step_drafted]
    if not ok:
        return {}
    out = {"spec_requests": float(len(ok))}
    ci = ratio_interval([sum(r.step_accepted) for r in ok], [sum(r.step_drafted) for r in ok])
    if ci:
        out.update(acceptance_rate_req=ci[0], acceptance_rate_req_lo=ci[1], acceptance_rate_req_hi=ci[2])
    for b, (a, d) in by_position(ok).items():
        out[f"seqpos_{b}_accepted"], out[f"seqpos_{b}_drafted"] = a, d
    return out


def positions(m: dict[str, float]) -> dict[int, tuple[float, float]]:
    """The seqpos_* metrics back into bucket start -> (accepted, drafted)."""
    starts = sorted(int(k.split("_")[1]) for k in m if k.startswith("seqpos_") and k.endswith("_drafted"))
    return {b: (m[f"seqpos_{b}_accepted"], m[f"seqpos_{b}_drafted"]) for b in starts}


def bucket_end(start: int) -> int:
    return FIRST_BUCKET if start == 0 else 2 * start


def split_at(m: dict[str, float], limit: int) -> tuple[tuple[float, float], tuple[float, float]]:
    """(accepted, drafted) draft tokens wholly before `limit` and at or after it; a bucket across it counts in
    neither (a limit that is a power of two from 128 up, as they usually are, splits none)."""
    within, beyond = [0.0, 0.0], [0.0, 0.0]
    for start, (a, d) in positions(m).items():
        side = within if bucket_end(start) <= limit else beyond if start >= limit else None
        if side is not None:
            side[0] += a
            side[1] += d
    return (within[0], within[1]), (beyond[0], beyond[1])
