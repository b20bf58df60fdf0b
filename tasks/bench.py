"""Benchmark one arm: streaming requests (infra/sse.py), per-request TTFT/TPOT/ITL/e2e and exact token counts.

The same prompt list for every arm; warmup requests run first and are excluded from the measured window.
"""
from __future__ import annotations

import asyncio
import json
import ssl
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, fields

import httpx
import numpy as np
import orjson
import pandas as pd
from prefect import task
from prefect.cache_policies import NO_CACHE

from infra.config import BenchConfig
from infra.sse import SseClient, StreamError
from tasks.acceptance import acceptance_interval, request_metrics, split_at
from tasks.earlystop import Progress, Questions, should_stop
from tasks.progress import BenchProgress

@dataclass
class RequestRecord:
    index: int
    ok: bool = False
    error: str = ""
    prompt_tokens: int = 0
    completion_tokens: int = 0
    ttft_ms: float = float("nan")
    tpot_ms: float = float("nan")
    e2e_ms: float = float("nan")
    start_s: float = float("nan")  # when it was sent, from the start of the window
    itl_ms: list[float] = field(default_factory=list)
    # The engine's own per-request spec-decode counts (--per-request-spec-decode-metrics detailed): draft tokens
    # proposed and accepted at each verify step, in order. Empty without speculation or on older engines.
    step_drafted: list[int] = field(default_factory=list)
    step_accepted: list[int] = field(default_factory=list)


@dataclass
class BenchResult:
    records: list[RequestRecord]
    duration_s: float
    stop_reason: str = ""  # why the early stop ended the window, if it did
    asked: str = ""  # what the verdict asked of the window when it ended (Questions.describe), with the early stop on

    def frame(self) -> pd.DataFrame:
        rows = [{**asdict(r), **{k: json.dumps(v) for k, v in asdict(r).items() if isinstance(v, list)},
                 "itl_ms": json.dumps([round(x, 3) for x in r.itl_ms])} for r in self.records]
        return pd.DataFrame(rows)

    @classmethod
    def from_frame(cls, frame: pd.DataFrame) -> "BenchResult":
        """The records back from frame() (requests.csv): what reused and recomputed arms read their requests from."""
        lists = {f.name for f in fields(RequestRecord) if f.type.startswith("list")}
        rows = frame.astype(object).where(frame.notna(), None).to_dict("records")
        return cls([RequestRecord(**{k: json.loads(v) if k in lists else v for k, v in row.items()
                                     if v is not None or k in lists}) for row in rows], 0.0)

    def request_tok_s(self) -> list[float]:
        return [r.completion_tokens / (r.e2e_ms / 1000) for r in self.records if r.ok and r.e2e_ms > 0]

    def summary(self) -> dict[str, float]:
        ok = [r for r in self.records if r.ok]
        tokens = sum(r.completion_tokens for r in ok)
        out = {"requests_ok": float(len(ok)), "requests_failed": float(len(self.records) - len(ok)),
               "output_tokens": float(tokens), "bench_duration_s": self.duration_s,
               "output_tok_s": tokens / self.duration_s if self.duration_s > 0 else 0.0,
               "early_stopped": float(bool(self.stop_reason))}
        for name in ("ttft_ms", "tpot_ms", "e2e_ms"):
            values = np.array([getattr(r, name) for r in ok], dtype=float)
            values = values[~np.isnan(values)]
            if values.size:
                out[f"{name}_p50"] = float(np.percentile(values, 50))
                out[f"{name}_p99"] = float(np.percentile(values, 99))
        itl = np.array([x for r in ok for x in r.itl_ms], dtype=float)
        if itl.size:
            out["itl_ms_p50"] = float(np.percentile(itl, 50))
            out["itl_ms_p99"] = float(np.percentile(itl, 99))
        return out


def _payload(cfg: BenchConfig, model: str, prompt: str, max_tokens: int) -> tuple[str, dict]:
    body = {"model": model, "max_tokens": max_tokens, "temperature": cfg.temperature, "stream": True,
            "stream_options": {"include_usage": True}}
    if cfg.endpoint == "chat":
        kwargs = {"chat_template_kwargs": cfg.chat_template_kwargs} if cfg.chat_template_kwargs else {}
        return "/v1/chat/completions", {**body, **kwargs, "messages": [{"role": "user", "content": prompt}]}
    return "/v1/completions", {**body, "prompt": prompt}


def _text_of(choice: dict) -> str:
    return (choice.get("delta") or {}).get("content") or choice.get("text") or ""


async def _one(client: SseClient, path: str, body: dict, record: RequestRecord) -> RequestRecord:
    start = time.perf_counter()
    last = None

    def on_event(data: bytes, now: float) -> None:
        nonlocal last
        if data == b"[DONE]":
            return
        chunk = orjson.loads(data)  # 5x json.loads: this runs once per streamed token
        if "error" in chunk or chunk.get("object") == "error":  # vLLM reports a failure inside the stream
            raise StreamError(f"error event in the stream: {str(chunk.get('error') or chunk)[:300]}")
        for choice in chunk.get("choices") or ():
            # A token chunk, or the textless finish chunk that carries a stop token (EOS): usage counts that token,
            # so its interval belongs in TPOT and ITL too (vllm bench serve counts it the same way).
            if _text_of(choice) or (last is not None and choice.get("finish_reason")):
                if last is None:
                    record.ttft_ms = (now - start) * 1000
                else:
                    record.itl_ms.append((now - last) * 1000)
                last = now
                break
        if chunk.get("usage"):
            record.prompt_tokens = chunk["usage"]["prompt_tokens"]
            record.completion_tokens = chunk["usage"]["completion_tokens"]
            spec = (chunk.get("metrics") or {}).get("speculative_decoding") or {}
            record.step_drafted = spec.get("per_step_drafted") or []
            record.step_accepted = spec.get("per_step_accepted") or []

    try:
        await client.post(path, body, on_event)
    except StreamError as exc:  # on_event's own errors (bad JSON, error events) arrive as StreamError too
        record.error = str(exc)
        return record
    record.e2e_ms = (time.perf_counter() - start) * 1000
    if record.completion_tokens > 1 and last is not None:  # first to last token, as vllm bench serve counts it
        record.tpot_ms = ((last - start) * 1000 - record.ttft_ms) / (record.completion_tokens - 1)
    record.ok = record.completion_tokens > 0
    if not record.ok and not record.error:
        record.error = "no usage in the stream"
    return record


async def _run(base_url: str, cfg: BenchConfig, model: str, prompts: list[str], max_tokens: int,
               stop_check: Callable[[list[RequestRecord], float], str] | None = None,
               records: list[RequestRecord] | None = None) -> BenchResult:
    """`cfg.concurrency` workers take prompts in order; with `request_rate`, request i starts no earlier than its
    Poisson arrival time; with `stop_check`, no new request starts once it gives a reason to stop."""
    tls = ssl.create_default_context() if base_url.startswith("https") else None  # built once, not per worker
    arrivals = np.cumsum(np.random.default_rng(0).exponential(1 / cfg.request_rate, len(prompts))) \
        if cfg.request_rate else np.zeros(len(prompts))
    queue, stop = iter(enumerate(prompts)), {"reason": ""}
    records = [] if records is None else records  # the caller's list keeps what finished if this is interrupted
    start = time.perf_counter()

    async def worker() -> None:
        client = SseClient(base_url, cfg.request_timeout_s, tls=tls)  # one keep-alive connection per worker
        try:
            for i, prompt in queue:
                if stop["reason"]:
                    return
                delay = start + arrivals[i] - time.perf_counter()
                if delay > 0:
                    await asyncio.sleep(delay)
                url, body = _payload(cfg, model, prompt, max_tokens)
                records.append(await _one(client, url, body, RequestRecord(i, start_s=time.perf_counter() - start)))
                if stop_check and not stop["reason"]:
                    stop["reason"] = await asyncio.to_thread(stop_check, list(records), time.perf_counter() - start)
        finally:
            client.close()

    await asyncio.gather(*(worker() for _ in range(cfg.concurrency)))
    return BenchResult(sorted(records, key=lambda r: r.index), time.perf_counter() - start, stop["reason"])


def served_model(base_url: str) -> str:
    resp = httpx.get(f"{base_url}/v1/models", timeout=10.0)
    resp.raise_for_status()
    return resp.json()["data"][0]["id"]


@task(name="warmup", cache_policy=NO_CACHE)
def warmup(base_url: str, cfg: BenchConfig, prompts: list[str]) -> None:
    if cfg.warmup:
        asyncio.run(_run(base_url, cfg, served_model(base_url), prompts[:cfg.warmup], min(cfg.max_tokens, 8)))


def window_progress(records: list[RequestRecord], elapsed: float, q: Questions,
                    spec: tuple[float, float, float] | None) -> Progress:
    """The window so far, for the early stop: its requests in prompt order, as the verdict reads them (the result's
    records), so that request i pairs with the baseline's i however the requests finished; spec: (drafts, acceptance
    rate, accepted tokens per draft) so far, None without spec decode. Its acceptance interval is the verdict's: the
    engine's counters joined with the spread over requests, from each request's own counts where the engine gives
    them."""
    ok = sorted((r for r in records if r.ok), key=lambda r: r.index)
    drafts, rate, per_draft = spec or (None, 0.0, 0.0)
    by_request = request_metrics(ok) if spec else {}  # {}: the engine gave no per-request counts
    interval = acceptance_interval({"acceptance_rate": rate, "num_drafts": drafts, **by_request}) if spec else None
    split = split_at(by_request, q.position_limit) if by_request and q.position_limit else None
    return Progress(len(ok), sum(r.completion_tokens for r in ok), elapsed, BenchResult(ok, elapsed).request_tok_s(),
                    drafts, rate, q, split, per_draft, interval)


@task(name="benchmark", cache_policy=NO_CACHE)
def benchmark(base_url: str, cfg: BenchConfig, prompts: list[str],
              spec_so_far: Callable[[], tuple[float, float, float]] | None = None,
              asks: Questions | Callable[[], Questions] = Questions(), arm: str = "arm") -> BenchResult:
    """spec_so_far: (drafts, acceptance rate, accepted tokens per draft) of the window so far, for the early stop and
    the progress lines; None without spec decode. asks: what the verdict will ask of this arm's numbers, for the
    early stop (tasks/earlystop.py), or what gives it as the other arms' numbers come in (tasks/reuse.asked_beside)."""
    asked = []

    def stop_check(records: list[RequestRecord], elapsed: float) -> str:
        q = asks() if callable(asks) else asks
        asked[:] = [q.describe(spec_so_far is not None)]
        return should_stop(cfg, window_progress(records, elapsed, q, spec_so_far() if spec_so_far else None))

    progress = BenchProgress(arm, len(prompts), spec_so_far)

    def check(records: list[RequestRecord], elapsed: float) -> str:
        ok = [r for r in records if r.ok]
        progress.update(len(records), sum(r.completion_tokens for r in ok), elapsed)
        return stop_check(records, elapsed) if cfg.early_stop else ""

    records, start = [], time.perf_counter()
    try:
        result = asyncio.run(_run(base_url, cfg, served_model(base_url), prompts, cfg.max_tokens, check, records))
    except BaseException as exc:  # Ctrl-C, SIGTERM: the requests that finished are still measured
        exc.result = BenchResult(sorted(records, key=lambda r: r.index), time.perf_counter() - start)
        raise
    result.asked = asked[0] if asked else ""
    if result.stop_reason:
        print(f"[{arm}] early stop after {len(result.records)} of {len(prompts)} requests: {result.stop_reason}")
    elif cfg.early_stop:
        print(f"[{arm}] all {len(prompts)} prompts measured before its numbers settled (the cap, --prompts): the "
              f"verdict names any interval left too wide")
    failed = [r for r in result.records if not r.ok]
    if failed:
        raise BenchmarkFailed(result, f"{len(failed)} of {len(result.records)} requests failed; "
                                      f"first: {failed[0].error}")
    return result


class BenchmarkFailed(RuntimeError):
    """Carries what was measured, so the arm's run still records it."""

    def __init__(self, result: BenchResult, message: str):
        super().__init__(message)
        self.result = result


@task(name="concurrency-sweep", cache_policy=NO_CACHE)
def sweep(base_url: str, cfg: BenchConfig, prompts: list[str],
          spec_totals: Callable[[], tuple[float, float]] | None = None) -> pd.DataFrame:
    """One row per concurrency level: throughput, latency percentiles and (with spec decoding) the acceptance over
    that level's requests; spec_totals gives the cumulative (draft tokens, accepted tokens)."""
    rows, model = [], served_model(base_url)
    for level in cfg.concurrency_sweep:
        level_cfg = cfg.model_copy(update={"concurrency": level, "early_stop": False})
        before = spec_totals() if spec_totals else None
        s = asyncio.run(_run(base_url, level_cfg, model, prompts, cfg.max_tokens)).summary()
        row = {"concurrency": level, **{k: s.get(k, float("nan")) for k in (
            "output_tok_s", "ttft_ms_p50", "ttft_ms_p99", "tpot_ms_p50", "tpot_ms_p99", "requests_failed")}}
        if before is not None:
            drafted, accepted = (a - b for a, b in zip(spec_totals(), before))
            row["acceptance_rate"] = accepted / drafted if drafted else float("nan")
        rows.append(row)
        print(f"concurrency {level}: {row['output_tok_s']:.1f} tok/s, TPOT p50 {row['tpot_ms_p50']:.1f} ms")
    return pd.DataFrame(rows)


def sweep_metrics(frame: pd.DataFrame) -> dict[str, float]:
    return {f"{k}_c{int(r['concurrency'])}": float(r[k]) for r in frame.to_dict("records") for k in r
            if k != "concurrency"}
