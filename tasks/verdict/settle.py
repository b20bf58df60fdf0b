"""What it would cost to settle an interval the verdict found too wide: the drafts that would narrow the arm's
acceptance interval enough, at the rate it measured, as requests and seconds at its own pace plus the server load a
new measurement of it takes. Where the window ran to its cap or budget undecided, the verdict names the interval and
this cost instead of a bare "rerun with more prompts".

Drafts within a request are correlated: where the interval over requests is wider than Wilson's over drafts, the
drafts needed grow by that design effect (the squared ratio of the widths).
"""
from __future__ import annotations

import math

import numpy as np
from scipy.special import stdtrit

from infra.stats import speed_logs, wilson
from tasks.verdict.evidence import NARROW, acceptance_interval

# The spread of per-request acceptance at 32 output tokens: 0.14 for the demo's EAGLE-3 head on the chat set
# (2026-12-07, 15 requests at k=3; its interval over requests was 0.354 +-0.078), taken a little wider. Drafts per
# request scale with the tokens, so the spread is taken to shrink as 1/sqrt(tokens): an estimate, said as one.
REQUEST_SD_32 = 0.16


def drafts_needed(rate: float, drafts: float, clear_of: tuple[float, ...] = (), half_width: float | None = None,
                  most: float = 1e6) -> float | None:
    """The fewest drafts (at least `drafts`) at which the Wilson interval at `rate` lies clear of every threshold in
    `clear_of` or is at most `half_width` wide each side; None when no number up to `most` does (a rate on the
    threshold itself)."""
    n = max(drafts, 1.0)
    while n <= most:
        lo, hi = wilson(rate * n, n)
        if (half_width and (hi - lo) / 2 <= half_width) or (clear_of and not any(lo <= t <= hi for t in clear_of)):
            return n
        n = math.ceil(n * 1.1)
    return None


def width(m: dict[str, float]) -> float:
    lo, hi = acceptance_interval(m)
    return hi - lo


def requests_to_narrow(max_tokens: int, width: float = NARROW) -> int:
    """About the requests an arm needs before its acceptance interval over requests is narrower than `width` (versus
    the control: a candidate as good as its control is told from it only once both are), at REQUEST_SD_32."""
    sd, n = REQUEST_SD_32 * math.sqrt(32 / max(1, max_tokens)), 2
    while stdtrit(n - 1, 0.975) * sd / math.sqrt(n) > width / 2:
        n += 1
    return n


def window_lines(measured: int, distinct: int, dropped: int, source: str, max_tokens: int, paired: bool) -> list[str]:
    """Said before measuring: how many requests a window can take, and where that is too few to tell a candidate as
    good as its control from it (paired: both are planned)."""
    lines = [f"prompts: at most {measured} measured per arm ({source!r} holds {distinct} distinct prompts)"]
    if dropped:
        lines.append(f"  {dropped} repeat(s) dropped: greedy decoding answers a repeated prompt identically, so a "
                     "repeat is no new evidence; pass a larger set (--prompt-set) for more")
    need = requests_to_narrow(max_tokens)
    if paired and measured < need:
        lines.append(f"  too few to settle a candidate as good as its control: both intervals must be narrower than "
                     f"{NARROW:g}, about {need} requests each at {max_tokens} tokens (estimated, per-request spread "
                     f"{REQUEST_SD_32:g} at 32 tokens); " + ("use a larger set or raise --max-tokens" if dropped
                                                             else "raise --prompts or --max-tokens"))
    return lines


def next_step(prompts: list[int | None]) -> str:
    """The command that would settle every interval named: the most prompts any of them needs."""
    if any(p == 0 for p in prompts):
        return "rerun with more prompts or tokens (--prompts, --max-tokens)"
    known = [p for p in prompts if p]
    return f"rerun with --prompts {max(known)} from a set holding that many distinct prompts besides the warmup (or a " \
        "budget that allows it)" if known else \
        "judge it against a control run beside it: more of the same measurement cannot settle it"


def settle(arm: str, m: dict[str, float], clear_of: tuple[float, ...] = (), half_width: float | None = None,
           at_least: float = 0.0) -> tuple[str, int | None]:
    """(an evidence line naming the arm's interval and what settling it costs, the prompts per arm that would: 0 where
    the arm's pace is not known, None where no number would)."""
    drafts, rate, ok = m.get("num_drafts", 0.0), m.get("acceptance_rate", 0.0), m.get("requests_ok", 0.0)
    lo, hi = acceptance_interval(m)
    wanted = " and ".join(filter(None, [f"clear of {', '.join(f'{t:g}' for t in clear_of)}" if clear_of else "",
                                        f"within +-{half_width:g}" if half_width else ""]))
    line = f"{arm}: acceptance [{lo:.3f}-{hi:.3f}] over {drafts:.0f} drafts in {ok:.0f} requests is too wide " \
           f"(it needs to lie {wanted})"
    need = drafts_needed(rate, drafts, clear_of, half_width)
    if need is None:
        return line + ": its rate sits on the threshold, and no budget settles it", None
    w_lo, w_hi = wilson(rate * drafts, drafts)
    inflate = ((hi - lo) / (w_hi - w_lo)) ** 2 if w_hi > w_lo and hi - lo > w_hi - w_lo else 1.0
    need = max(need * inflate, at_least)
    if not drafts or not ok:  # no pace to convert drafts into requests
        return f"{line}; settling it takes about {need - drafts:.0f} more drafts", 0
    extra = max(1, math.ceil((need - drafts) / (drafts / ok)))
    seconds = extra * m.get("bench_duration_s", 0.0) / ok
    cost = f"about {need - drafts:.0f} more drafts: {extra} more requests, ~{seconds:.0f} s of benchmark at its " \
           f"pace plus a server load ({m.get('server_ready_s', 0.0):.0f} s here)"
    return f"{line}; settling it costs {cost}", int(ok + extra)


def pairs_needed(arm_tok_s: list[float], base_tok_s: list[float], bound: float, most: int = 10000) -> int | None:
    """The fewest prompts, measured in both arms (--fixed: paired), at which the speedup of these per-request tok/s
    (infra.stats.speedup_interval) would lie clear of `bound`, at the same spread of log ratios: the pairs' own where
    the counts match, else the two arms' spreads added (no pairing measured to take any out). None when none up to
    `most` would (a speedup on the bound itself) or the spread is not known."""
    a, b, paired = speed_logs(arm_tok_s, base_tok_s)
    if a.size < 2 or b.size < 2:
        return None
    sd = float(np.std(a - b, ddof=1) if paired else np.sqrt(a.var(ddof=1) + b.var(ddof=1)))
    # the speedup's log, paired or not: the mean logs' difference (infra.stats.speedup_interval's centre)
    gap, start = abs(a.mean() - b.mean() - math.log(bound)), min(a.size, b.size)
    return next((n for n in range(start, most + 1) if stdtrit(n - 1, 0.975) * sd / math.sqrt(n) < gap), None)
