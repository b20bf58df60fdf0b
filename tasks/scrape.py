"""Read the engine's spec-decode counters around the measured window, and the log's own summary lines."""
from __future__ import annotations

from dataclasses import dataclass

import httpx
from prefect import task
from prefect.cache_policies import NO_CACHE

from infra import vllm
from infra.executor import Executor
from tasks.launch import Server


class SpecDecodingOff(RuntimeError):
    pass


@dataclass(frozen=True)
class Snapshot:
    metrics_text: str
    counters: vllm.SpecCounters
    log_offset: int  # where the server log stood at this scrape


@task(name="scrape-metrics", cache_policy=NO_CACHE)
def scrape(server: Server) -> Snapshot:
    resp = httpx.get(f"{server.base_url}/metrics", timeout=10.0)
    resp.raise_for_status()
    offset = server.executor.size(server.process.log_path)  # where the window's log lines start: no log crosses
    return Snapshot(resp.text, vllm.parse_metrics(resp.text), offset)


def _counters(server: Server) -> vllm.SpecCounters:
    return vllm.parse_metrics(httpx.get(f"{server.base_url}/metrics", timeout=10.0).text)


def spec_window(server: Server, before: Snapshot):
    """A callable giving (drafts, acceptance rate, accepted tokens per draft) since `before`: the early stop reads it
    mid-window."""
    def so_far() -> tuple[float, float, float]:
        delta = _counters(server) - before.counters
        return (delta.num_drafts, delta.num_accepted_tokens / delta.num_draft_tokens if delta.num_draft_tokens else 0.0,
                delta.num_accepted_tokens / delta.num_drafts if delta.num_drafts else 0.0)
    return so_far


def spec_totals(server: Server):
    """A callable giving the cumulative (draft tokens, accepted tokens) on the server."""
    def totals() -> tuple[float, float]:
        c = _counters(server)
        return c.num_draft_tokens, c.num_accepted_tokens
    return totals


def counter_metrics(arm: str, before: Snapshot, after: Snapshot, speculative: bool) -> dict[str, float]:
    """Spec-decode counter deltas over the measured window; refuses to report a silent 0%."""
    if speculative and not after.counters.present:
        raise SpecDecodingOff(
            f"[{arm}] a drafter was configured but /metrics has no vllm:spec_decode_* series: "
            f"speculative decoding is OFF on this server (check the speculative config and the server log)")
    return (after.counters - before.counters).rates() if after.counters.present else {}


def log_crosscheck(executor: Executor, log_path: str, before: Snapshot, after: Snapshot | None = None
                   ) -> dict[str, float]:
    """The engine's own 'SpecDecoding metrics' lines since the window opened (read after teardown); up to its closing
    scrape where other windows followed on the same server (a line printed after it, up to 1 s of the window, is then
    left out: the cross-check is approximate there)."""
    window, _ = executor.read_from(log_path, before.log_offset)
    if after is not None:
        window = window[:max(0, after.log_offset - before.log_offset)]
    return vllm.parse_log_spec_lines(window)
