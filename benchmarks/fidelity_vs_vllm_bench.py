"""Fidelity: our benchmark client vs `vllm bench serve` against the same server and the same prompts.

    python benchmarks/fidelity_vs_vllm_bench.py [--prompts 8] [--max-tokens 64] [--rounds 4] [--shared-cores]
One embedded vLLM CPU server (SmolLM2, no drafter); after one unmeasured pass each, the two clients take turns
(ours, theirs, theirs, ours...). Prints output tok/s, median TPOT and median TTFT of each, the median per-round ratio,
and the server's own mean inter-token latency during each client's runs (from its /metrics histogram).
The clients run on the first core and the server on the others: a client on the server's cores slows the server by
its own CPU use, which shows as a server_itl_ms ratio away from 1 (try --shared-cores).
Goal: every ratio within 1 +- 0.02.
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


def theirs(base_url: str, target: str, prompts_file: Path, n: int, max_tokens: int, out: Path) -> dict:
    vllm_cli = embedded.vllm_bench_cli()
    cmd = [vllm_cli, "bench", "serve", "--backend", "openai-chat", "--endpoint", "/v1/chat/completions",
           "--base-url", base_url, "--model", "smollm2", "--tokenizer", target, "--dataset-name", "custom",
           "--dataset-path", str(prompts_file), "--custom-output-len", str(max_tokens), "--num-prompts", str(n),
           "--skip-chat-template",  # else its custom dataset templates client-side and the server templates again
           "--max-concurrency", "1", "--temperature", "0", "--disable-tqdm", "--save-result",
           "--result-dir", str(out.parent), "--result-filename", out.name]
    done = subprocess.run(cmd, capture_output=True, text=True, env={"HF_HUB_OFFLINE": "1", "PATH": "/usr/bin:/bin"})
    if done.returncode != 0:
        sys.exit(f"vllm bench serve failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    r = json.loads(out.read_text())
    return {"output_tok_s": r["output_throughput"], "tpot_ms_p50": r["median_tpot_ms"],
            "ttft_ms_p50": r["median_ttft_ms"], "output_tokens": r["total_output_tokens"]}


def ours(base_url: str, prompts: list[str], max_tokens: int) -> dict:
    s = benchmark.fn(base_url, BenchConfig(max_tokens=max_tokens, warmup=0), prompts).summary()
    return {k: s[k] for k in ("output_tok_s", "tpot_ms_p50", "ttft_ms_p50", "output_tokens")}


def server_itl(url: str) -> tuple[float, float]:
    """(sum in s, count) of the server's own inter-token latency histogram."""
    for family in text_string_to_metric_families(httpx.get(f"{url}/metrics", timeout=10).text):
        if family.name == "vllm:inter_token_latency_seconds":
            samples = {s.name: s.value for s in family.samples if s.name.endswith(("_sum", "_count"))}
            return samples[family.name + "_sum"], samples[family.name + "_count"]
    sys.exit("the server's /metrics has no vllm:inter_token_latency_seconds")


def with_server_itl(url: str, run) -> dict:
    """Adds the mean inter-token latency the server itself saw during `run`: the same server speed for both
    clients shows as the same value; a difference there is the server, not the measurement."""
    (s0, n0), result, (s1, n1) = server_itl(url), run(), server_itl(url)
    return {**result, "server_itl_ms": (s1 - s0) / (n1 - n0) * 1000}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--shared-cores", action="store_true",
                    help="let the clients share the server's cores (by default the clients get the first core and the "
                         "server the others: a client sharing the server's cores slows the server by its own CPU use)")
    args = ap.parse_args()
    target, ex = str(embedded.target_model()), LocalExecutor()
    prompts = load("chat", args.prompts)
    with tempfile.TemporaryDirectory() as tmp:
        pfile = Path(tmp) / "prompts.jsonl"
        pfile.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in prompts))
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
            warmup.fn(url, BenchConfig(warmup=2), prompts[:2])
            runs = {"ours": [], "theirs": []}
            sides = {"ours": lambda i: with_server_itl(url, lambda: ours(url, prompts, args.max_tokens)),
                     "theirs": lambda i: with_server_itl(url, lambda: theirs(url, target, pfile, args.prompts,
                                                                             args.max_tokens, Path(tmp) / f"r{i}.json"))}
            for side in sides.values():  # one unmeasured pass each: the server's first passes over new shapes are
                side(-1)                  # faster or slower than its steady state, and theirs loads from a cold disk
            for i in range(args.rounds):  # ABBA: who goes first alternates, so a steady drift cancels out
                order = ["ours", "theirs"] if i % 2 == 0 else ["theirs", "ours"]
                for side in order:
                    runs[side].append(sides[side](i))
                print(f"round {i + 1} ({order[0]} first): ours {runs['ours'][-1]}\n"
                      f"         theirs {runs['theirs'][-1]}", flush=True)
        finally:
            ex.stop_group(proc.pgid)
    where = "clients on the server's cores" if bind == "auto" else f"clients on core {cores[0]}, server on {bind}"
    print(f"\n{args.prompts} chat prompts x {args.max_tokens} max tokens, single stream, {args.rounds} rounds each, "
          f"alternating; same server; {where}")
    print("ratio: median over rounds of ours / theirs within the round (each round back to back, so that machine "
          "drift hits both)")
    print(f"{'metric':14} {'ours':>10} {'vllm bench':>11} {'ours/theirs':>12} {'per round':>28}")
    for key in ("output_tok_s", "tpot_ms_p50", "ttft_ms_p50", "output_tokens", "server_itl_ms"):
        a, b = np.median([r[key] for r in runs["ours"]]), np.median([r[key] for r in runs["theirs"]])
        ratios = [o[key] / t[key] for o, t in zip(runs["ours"], runs["theirs"])]
        print(f"{key:14} {a:10.2f} {b:11.2f} {np.median(ratios):12.3f} {' '.join(f'{r:.3f}' for r in ratios):>28}")


if __name__ == "__main__":
    main()
