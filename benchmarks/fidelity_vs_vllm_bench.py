"""Fidelity: our benchmark client vs `vllm bench serve` against the same server and the same prompts.

    python benchmarks/fidelity_vs_vllm_bench.py [--concurrency 1 8 32] [--prompts 8] [--max-tokens 64] [--rounds 2]
One embedded vLLM CPU server (SmolLM2, no drafter); after one unmeasured pass each, the two clients take turns
(ours, theirs, theirs, ours...). Prints output tok/s, median TPOT and median TTFT of each with the median per-round
ratio; then each client's readings over what the server itself measured in the same window (its /metrics histograms):
a server whose speed drifts between runs (a noisy host) moves the raw ratios but not those. vllm bench's ITL list
holds one extra near-zero interval per request (from its role-only first chunk to the first token), so its mean ITL
reads ~1/output_len below the server's; TPOT has no such term on either side.
The clients run on the first core and the server on the others: a client on the server's cores slows the server by
its own CPU use, which shows as a server_itl_ms ratio away from 1 (try --shared-cores).
At each concurrency (the set repeated to at least twice as many prompts as streams), both clients keep that many
requests in flight. Under load the server's own readings are the reference: its token count, its mean ITL (TPOT) and
TTFT from its histograms, and its tokens over its requests' summed latency (tok/s per request, which the clients
read as their tokens over their requests' summed end-to-end times). Aggregate tok/s is compared with vllm bench's.
Goal: within 1 +- 0.01 of the server's own readings at concurrency 1, 8 and 32; ours/theirs within 1 +- 0.02. The
server's TTFT starts when its engine receives the request (vllm/v1/engine/input_processor.py sets arrival_time), after
the HTTP layer rendered the chat template and tokenized: a client's TTFT includes that, so both read above it.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import httpx
import numpy as np
from prometheus_client.parser import text_string_to_metric_families

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from infra import embedded, vllm  # noqa: E402
from infra.config import BenchConfig  # noqa: E402
from infra.executor import LocalExecutor  # noqa: E402
from infra.promptsets import load  # noqa: E402
from tasks.bench import benchmark, warmup  # noqa: E402
from tasks.health import wait_healthy  # noqa: E402
from tasks.launch import Server  # noqa: E402

PORT = 8097


def theirs(base_url: str, target: str, prompts_file: Path, n: int, max_tokens: int, out: Path,
           concurrency: int = 1) -> dict:
    vllm_cli = embedded.vllm_bench_cli()
    cmd = [vllm_cli, "bench", "serve", "--backend", "openai-chat", "--endpoint", "/v1/chat/completions",
           "--base-url", base_url, "--model", "smollm2", "--tokenizer", target, "--dataset-name", "custom",
           "--dataset-path", str(prompts_file), "--custom-output-len", str(max_tokens), "--num-prompts", str(n),
           "--skip-chat-template",  # else its custom dataset templates client-side and the server templates again
           "--max-concurrency", str(concurrency), "--percentile-metrics", "ttft,tpot,itl,e2el",
           "--temperature", "0", "--disable-tqdm", "--save-result",
           "--result-dir", str(out.parent), "--result-filename", out.name]
    done = subprocess.run(cmd, capture_output=True, text=True, env={"HF_HUB_OFFLINE": "1", "PATH": "/usr/bin:/bin"})
    if done.returncode != 0:
        sys.exit(f"vllm bench serve failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    r = json.loads(out.read_text())
    return {"output_tok_s": r["output_throughput"], "tpot_ms_p50": r["median_tpot_ms"],
            "ttft_ms_p50": r["median_ttft_ms"], "output_tokens": r["total_output_tokens"],
            "request_tok_s": r["total_output_tokens"] / (r["mean_e2el_ms"] * r["completed"] / 1000),
            "tpot_ms_mean": r["mean_tpot_ms"], "itl_ms_mean": r["mean_itl_ms"], "ttft_ms_mean": r["mean_ttft_ms"]}


def ours(base_url: str, prompts: list[str], max_tokens: int, concurrency: int = 1) -> dict:
    result = benchmark.fn(base_url, BenchConfig(max_tokens=max_tokens, warmup=0, concurrency=concurrency), prompts)
    s, ok = result.summary(), [r for r in result.records if r.ok]
    return {**{k: s[k] for k in ("output_tok_s", "tpot_ms_p50", "ttft_ms_p50", "output_tokens")},
            "tpot_ms_mean": float(np.nanmean([r.tpot_ms for r in ok])),
            "itl_ms_mean": float(np.mean([x for r in ok for x in r.itl_ms])),
            "ttft_ms_mean": float(np.mean([r.ttft_ms for r in ok])),
            "request_tok_s": s["output_tokens"] / (sum(r.e2e_ms for r in ok) / 1000)}


SERVER_SERIES = ("vllm:inter_token_latency_seconds_sum", "vllm:inter_token_latency_seconds_count",
                 "vllm:time_to_first_token_seconds_sum", "vllm:time_to_first_token_seconds_count",
                 "vllm:e2e_request_latency_seconds_sum", "vllm:generation_tokens_total")


def server_counters(url: str) -> dict[str, float]:
    text = httpx.get(f"{url}/metrics", timeout=10).text
    found = {s.name: s.value for f in text_string_to_metric_families(text) for s in f.samples
             if s.name in SERVER_SERIES}
    if missing := set(SERVER_SERIES) - set(found):
        sys.exit(f"the server's /metrics lacks {sorted(missing)}")
    return found


def with_server_view(url: str, run) -> dict:
    """Adds what the server itself measured during `run` (mean ITL, mean TTFT, tokens per second of request time),
    and each client reading over the server's own: that quotient is the client's measurement error, whatever the
    server's speed was in that window, so comparing it across clients cancels a server that drifts between runs."""
    before, result, after = server_counters(url), run(), server_counters(url)
    d = {k: after[k] - before[k] for k in SERVER_SERIES}
    itl = d["vllm:inter_token_latency_seconds_sum"] / d["vllm:inter_token_latency_seconds_count"] * 1000
    ttft = d["vllm:time_to_first_token_seconds_sum"] / d["vllm:time_to_first_token_seconds_count"] * 1000
    server = {"tpot_ms_mean": itl, "itl_ms_mean": itl, "ttft_ms_mean": ttft,
              "output_tokens": d["vllm:generation_tokens_total"],
              "request_tok_s": d["vllm:generation_tokens_total"] / d["vllm:e2e_request_latency_seconds_sum"]}
    return {**result, "server_itl_ms": itl,
            **{f"{k}/server": result[k] / server[k] for k in server}}


def measure(url: str, target: str, tmp: Path, concurrency: int, n: int, max_tokens: int, rounds: int) -> dict:
    """Both clients at one concurrency on the same server: ABBA rounds, each reading with the server's own."""
    prompts = load("chat", n)
    pfile = tmp / f"prompts-c{concurrency}.jsonl"
    pfile.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in prompts))
    runs = {"ours": [], "theirs": []}
    sides = {"ours": lambda i: ours(url, prompts, max_tokens, concurrency),
             "theirs": lambda i: theirs(url, target, pfile, n, max_tokens, tmp / f"c{concurrency}-r{i}.json",
                                        concurrency)}
    for side in sides.values():  # one unmeasured pass each: the server's first passes over new shapes are
        side(-1)                  # faster or slower than its steady state, and theirs loads from a cold disk
    for i in range(rounds):  # ABBA: who goes first alternates, so a steady drift cancels out
        order = ["ours", "theirs"] if i % 2 == 0 else ["theirs", "ours"]
        for side in order:
            runs[side].append(with_server_view(url, lambda: sides[side](i)))
        print(f"c={concurrency} round {i + 1} ({order[0]} first): ours {runs['ours'][-1]}\n"
              f"         theirs {runs['theirs'][-1]}", flush=True)
    return runs


KEYS = ("output_tok_s", "tpot_ms_p50", "ttft_ms_p50", "output_tokens", "server_itl_ms", "output_tokens/server",
        "request_tok_s/server", "tpot_ms_mean/server", "ttft_ms_mean/server", "itl_ms_mean/server")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 32])
    ap.add_argument("--prompts", type=int, default=8, help="at least; twice the concurrency where that is more")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--shared-cores", action="store_true",
                    help="let the clients share the server's cores (by default the clients get the first core and the "
                         "server the others: a client sharing the server's cores slows the server by its own CPU use)")
    args = ap.parse_args()
    target, ex = str(embedded.target_model()), LocalExecutor()
    with tempfile.TemporaryDirectory() as tmp:
        argv = vllm.server_argv(embedded.engine_python(), target, PORT, ["--dtype", "bfloat16", "--max-model-len",
                                "2048", "--enforce-eager", "--distributed-executor-backend", "uni"], None, "smollm2")
        cores, bind = sorted(os.sched_getaffinity(0)), "auto"
        if len(cores) > 1 and not args.shared_cores:  # the load generator off the server's cores, as in the field
            bind = ",".join(map(str, cores[1:]))
            argv = ["taskset", "-c", bind, *argv]
            os.sched_setaffinity(0, cores[:1])  # both clients: vllm bench serve inherits it
        proc = ex.launch(argv, vllm.server_env({"VLLM_CPU_KVCACHE_SPACE": "2", "VLLM_CPU_OMP_THREADS_BIND": bind}),
                         str(Path(tmp) / "server.log"))
        try:
            url = ex.base_url(PORT)
            wait_healthy.fn(Server("fidelity", proc, url, ex), timeout_s=600)
            warmup.fn(url, BenchConfig(warmup=2), load("chat", 2))
            levels = {c: measure(url, target, Path(tmp), c, max(args.prompts, 2 * c), args.max_tokens, args.rounds)
                      for c in args.concurrency}
        finally:
            ex.stop_group(proc.pgid)
    where = "clients on the server's cores" if bind == "auto" else f"clients on core {cores[0]}, server on {bind}"
    print(f"\nchat prompts x {args.max_tokens} max tokens, {args.rounds} rounds per client and concurrency, "
          f"alternating; same server; {where}")
    print("ours/theirs: median over rounds of the ratio within the round (back to back: machine drift hits both)")
    print("x/server: the client's reading over the server's own for the same window (its /metrics): drift-free")
    for c, runs in levels.items():
        print(f"\nconcurrency {c} ({max(args.prompts, 2 * c)} prompts)")
        print(f"{'metric':22} {'ours':>10} {'vllm bench':>11} {'ours/theirs':>12}")
        for key in KEYS:
            a, b = np.median([r[key] for r in runs["ours"]]), np.median([r[key] for r in runs["theirs"]])
            ratio = np.median([o[key] / t[key] for o, t in zip(runs["ours"], runs["theirs"])])
            print(f"{key:22} {a:10.3f} {b:11.3f} {ratio:12.3f}")
    print(f"\n{'ours over the server':22} " + " ".join(f"{'c=' + str(c):>8}" for c in levels))
    for key in (k for k in KEYS if k.endswith("/server")):
        print(f"{key:22} " + " ".join(f"{np.median([r[key] for r in runs['ours']]):8.3f}" for runs in levels.values()))


if __name__ == "__main__":
    main()
