"""Arm reuse: a three-arm demo diagnosis of a new candidate on a fresh store, and the same diagnosis as a follow-up
to an earlier one (--first), where the baseline and the control are reused; server loads and wall time side by side,
measured in this one run.

    python benchmarks/reuse_followup.py [--first smol-permuted] [--then smol-noisy] [--control smol-self]
Goal: the follow-up loads one server, and takes well under half the full run's wall time.
"""
import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "120")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--first", default="smol-permuted")
    ap.add_argument("--then", default="smol-noisy")
    ap.add_argument("--control", default="smol-self")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        os.environ["MLFLOW_TRACKING_URI"] = f"sqlite:///{tmp}/mlflow.db"
        from flows.diagnose import diagnose  # the store is read when the flow starts

        diagnose("demo", args.first, args.control)  # seeds the store (and starts Prefect's temporary server)
        rows = []
        for label, store in (("full", "fresh.db"), ("follow-up", "mlflow.db")):  # the same diagnosis of --then
            os.environ["MLFLOW_TRACKING_URI"] = f"sqlite:///{tmp}/{store}"
            start = time.monotonic()
            results = diagnose("demo", args.then, args.control)
            wall = time.monotonic() - start
            rows.append((label, args.then, sum(1 for r in results if not r.reused_from), wall,
                         [r.arm for r in results if r.reused_from]))
    (_, _, full_loads, full_wall, _), (_, _, loads, wall, reused) = rows
    print(f"\n{'run':10} {'candidate':15} {'server loads':>12} {'wall s':>8}  reused")
    for label, drafter, n, w, r in rows:
        print(f"{label:10} {drafter:15} {n:12d} {w:8.1f}  {', '.join(r) or '-'}")
    print(f"follow-up / full: server loads {loads}/{full_loads}, wall time {wall / full_wall:.2f}x")


if __name__ == "__main__":
    main()
