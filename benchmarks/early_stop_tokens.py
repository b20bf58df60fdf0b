"""Early stop: output tokens spent to reach the same verdict, early stop vs the fixed budget; and per-arm
orchestration overhead (diagnosis wall time minus server start and benchmark), both measured in this one run.

    python benchmarks/early_stop_tokens.py [--pairs smol-permuted:smol-self,smol-noisy:smol-self] [--prompts 12]
Runs the demo diagnosis twice per candidate:control pair on the embedded engine: a fixed budget of --prompts
measured requests per arm, then with bench.early_stop (the same --prompts as the cap). Goal: early stop spends <= 50% of the tokens for the same
verdict; overhead <= 5 s per arm.
"""
import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "120")

from flows.diagnose import diagnose  # noqa: E402
from infra.tracking import Tracker  # noqa: E402


def run(args, tmp: str, drafter: str, control: str, early: bool):
    sets = [f"host.workdir={tmp}/runs", f"bench.num_prompts={args.prompts}", f"bench.max_tokens={args.max_tokens}",
            f"bench.early_stop={'true' if early else 'false'}", f"target.port={args.port}"]
    start = time.monotonic()
    results = diagnose("demo", drafter, control, sets=sets)
    wall = time.monotonic() - start  # the whole call: Prefect, static checks, every arm, verdict, plots
    tracker = Tracker()
    parent = tracker.client.get_run(results[0].run_id).data.tags["mlflow.parentRunId"]
    verdict = tracker.client.get_run(parent).data.tags["specdiag.verdict"]
    return results, verdict, wall


def report(fixed, early) -> tuple[float, float]:
    (fixed, v_fixed, w_fixed), (early, v_early, w_early) = fixed, early
    print(f"\n{'arm':15} {'fixed tokens':>12} {'early tokens':>12} {'early/fixed':>11}   acceptance fixed -> early")
    for f, e in zip(fixed, early):
        ft, et = f.metrics.get("output_tokens", 0), e.metrics.get("output_tokens", 0)
        acc = (f"{f.metrics['acceptance_rate']:.3f} -> {e.metrics['acceptance_rate']:.3f}"
               if "acceptance_rate" in f.metrics and "acceptance_rate" in e.metrics else "-")
        print(f"{f.arm:15} {ft:12.0f} {et:12.0f} {et / ft if ft else 0:11.2f}   {acc}")
    tf = sum(r.metrics.get("output_tokens", 0) for r in fixed)
    te = sum(r.metrics.get("output_tokens", 0) for r in early)
    print(f"tokens: fixed {tf:.0f}, early stop {te:.0f}: {te / tf:.0%} of the fixed budget")
    print(f"verdict: fixed {v_fixed!r}, early stop {v_early!r} ({'same' if v_fixed == v_early else 'DIFFERENT'})")
    print("orchestration overhead: diagnosis wall time minus server-ready and benchmark time (warmup requests count "
          "as benchmark)")
    for label, rs, wall in (("fixed", fixed, w_fixed), ("early", early, w_early)):
        measured = sum(r.metrics.get("server_ready_s", 0) + r.metrics.get("bench_s", 0) for r in rs)
        print(f"  {label}: diagnosis {wall:.1f} s - ready and benchmark {measured:.1f} s = {wall - measured:.1f} s "
              f"over {len(rs)} arms = {(wall - measured) / len(rs):.1f} s per arm; inside each arm: "
              + ", ".join(f"{r.arm} {r.metrics.get('overhead_s', 0):.1f} s" for r in rs))
    return tf, te


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--pairs", default="smol-permuted:smol-self,smol-noisy:smol-self",
                    help="candidate:control pairs, each diagnosed with a fixed budget and with early stop")
    ap.add_argument("--prompts", type=int, default=12)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--port", type=int, default=8096)
    args = ap.parse_args()
    totals = []
    with tempfile.TemporaryDirectory() as tmp:
        os.environ["MLFLOW_TRACKING_URI"] = f"sqlite:///{tmp}/mlflow.db"
        for pair in args.pairs.split(","):
            drafter, control = pair.split(":")
            runs = [run(args, tmp, drafter, control, early) for early in (False, True)]
            print(f"\n=== {drafter} vs {control}, {args.prompts} prompts x {args.max_tokens} tokens per arm")
            totals.append(report(*runs))
    tf, te = (sum(t[i] for t in totals) for i in (0, 1))
    print(f"\nall pairs: fixed {tf:.0f} tokens, early stop {te:.0f}: {te / tf:.0%} of the fixed budget (goal <= 50%)")


if __name__ == "__main__":
    main()
