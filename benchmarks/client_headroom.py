"""Client headroom: how many streamed tokens/s our client processes vs `vllm bench serve`'s client.

    python benchmarks/client_headroom.py [--streams 256] [--requests 512] [--tokens 128] [--rates 0,100]
A loopback null server (infra/nullserver.py, its own process) streams `--tokens` tokens per request; both clients
drive it with `--streams` concurrent streams, taking turns, once per rate. Rate 0 means the server writes as fast
as it can, so the client is the bottleneck: that row is the headroom (goal: ours / theirs >= 1.5x). A paced rate
(tokens/s per stream) shows how close each client stays to what the server offers. Prints tokens/s each processed
(all tokens / the client's own measured duration), ours / theirs, and our client's CPU time per token.
"""
import argparse
import asyncio
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from infra import embedded  # noqa: E402
from infra.config import BenchConfig  # noqa: E402
from tasks.bench import _run  # noqa: E402


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def ours(url: str, args) -> dict:
    cfg = BenchConfig(max_tokens=args.tokens, concurrency=args.streams, request_timeout_s=600)
    cpu = time.process_time()
    result = asyncio.run(_run(url, cfg, "null", ["hi"] * args.requests, args.tokens))  # failures counted, not raised
    cpu = time.process_time() - cpu
    tokens = sum(r.completion_tokens for r in result.records)
    return {"tok_s": tokens / result.duration_s, "tokens": tokens, "cpu_us_per_token": cpu / tokens * 1e6,
            "failed": sum(not r.ok for r in result.records)}


def theirs(url: str, args, tmp: Path, i: int) -> dict:
    pfile = tmp / "prompts.jsonl"
    pfile.write_text("".join(json.dumps({"prompt": "hi"}) + "\n" for _ in range(args.requests)))
    out = tmp / f"theirs{i}.json"
    cmd = [embedded.vllm_bench_cli(), "bench", "serve", "--backend", "openai-chat",
           "--endpoint", "/v1/chat/completions", "--base-url", url, "--model", "null",
           "--tokenizer", str(embedded.target_model()), "--dataset-name", "custom", "--dataset-path", str(pfile),
           "--custom-output-len", str(args.tokens), "--num-prompts", str(args.requests), "--max-concurrency",
           str(args.streams), "--disable-tqdm", "--save-result", "--result-dir", str(tmp), "--result-filename", out.name]
    done = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    if done.returncode != 0:
        sys.exit(f"vllm bench serve failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    r = json.loads(out.read_text())
    return {"tok_s": r["total_output_tokens"] / r["duration"], "tokens": r["total_output_tokens"],
            "failed": args.requests - r["completed"]}


def measure(args, rate: float, tmp: Path) -> tuple[float, float, float]:
    port = _port()
    server = subprocess.Popen([sys.executable, "-m", "infra.nullserver", "--port", str(port), "--tokens-per-s",
                               str(rate)], cwd=Path(__file__).resolve().parents[1])
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(100):
            try:
                httpx.get(f"{url}/health", timeout=1)
                break
            except httpx.TransportError:
                time.sleep(0.1)
        runs = {"ours": [], "theirs": []}
        for i in range(args.rounds):
            runs["ours"].append(ours(url, args))
            runs["theirs"].append(theirs(url, args, tmp, i))
            print(f"rate {rate:g}, round {i + 1}: ours {runs['ours'][-1]}, theirs {runs['theirs'][-1]}", flush=True)
    finally:
        server.terminate()
        server.wait()
    mean = lambda side, key: sum(r[key] for r in runs[side]) / args.rounds  # noqa: E731
    return mean("ours", "tok_s"), mean("theirs", "tok_s"), mean("ours", "cpu_us_per_token")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--streams", type=int, default=256)
    ap.add_argument("--requests", type=int, default=512)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--rates", default="0,100", help="tokens/s per stream offered by the null server; 0 = unpaced")
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        rows = [(float(rate), *measure(args, float(rate), Path(tmp))) for rate in args.rates.split(",")]
    print(f"\n{args.streams} streams, {args.requests} requests of {args.tokens} tokens, {args.rounds} rounds per "
          f"client per rate, alternating")
    for rate, a, b, cpu in rows:
        offered = "unpaced (client-bound)" if rate == 0 else f"{rate:g} tok/s per stream ({rate * args.streams:.0f} offered)"
        print(f"{offered}: ours {a:.0f} tok/s, vllm bench serve {b:.0f} tok/s, ours / theirs = {a / b:.2f}x; "
              f"our CPU per token {cpu:.1f} us")


if __name__ == "__main__":
    main()
