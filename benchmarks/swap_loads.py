"""Server loads and wall time with and without swapping drafters into a running server, side by side in one run
(issue 38).

    python benchmarks/swap_loads.py [--sets demo,eagle3]

Each set is diagnosed twice on the embedded engine, as a user runs it, `python flows/diagnose.py ...` with every
default (swapping on) and with --no-swap, alternating which goes first, each in a fresh process with its own MLflow
store (no arm is reused). Printed per run: server loads, the wall time, the time in loads and swaps, and the verdict;
then the loads and the wall-time ratio swap / no-swap (goals: the demo 2 loads instead of 3, the EAGLE-3 set 2 instead
of 5, wall <= 0.6x) and whether the verdicts agree.

The sets:
- demo: the README's main job, smol-permuted (candidate) vs smol-self (control).
- eagle3: smol-eagle3-scrambled (candidate) vs smol-eagle3 (control), smol-eagle3-wrongaux and smol-eagle3-noisy as
  extra arms: four EAGLE-3 heads of one shape.
"""
import argparse
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.decisive_default import diagnose  # noqa: E402
from infra import embedded  # noqa: E402
from infra.config import load_profile  # noqa: E402

SETS = {
    "demo": ["--drafter", "smol-permuted", "--control", "smol-self"],
    "eagle3": ["--drafter", "smol-eagle3-scrambled", "--control", "smol-eagle3", "--arms", "smol-eagle3-wrongaux",
               "smol-eagle3-noisy"],
}


def line(label: str, r: dict) -> str:
    return (f"  {label:8} {r['server_loads']} server loads; wall {r['wall']:6.1f} s; in loads {r['loads']:.1f} s, "
            f"swaps {r['swaps']:.1f} s, benchmarks {r['bench']:.1f} s; verdict {r['verdict']}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sets", default="demo,eagle3")
    ap.add_argument("--port", type=int, default=8097)
    args = ap.parse_args()
    drafters = load_profile("demo").drafters
    for name in {n for s in args.sets.split(",") for n in SETS[s] if n in drafters}:
        embedded.resolve(drafters[name].model)  # built on a machine's first use, before the clock starts
    with tempfile.TemporaryDirectory() as tmp:
        for i, name in enumerate(args.sets.split(",")):
            order = [("swap", ()), ("no-swap", ("--no-swap",))]
            runs = dict((order if i % 2 == 0 else order[::-1]))  # alternate which goes first on a noisy machine
            measured = {label: diagnose(Path(tmp), args.port, *SETS[name], *extra, extra_metrics=True)
                        for label, extra in runs.items()}
            print(f"\n=== {name}: {' '.join(SETS[name])}")
            for label in ("swap", "no-swap"):
                print(line(label, measured[label]))
            s, n = measured["swap"], measured["no-swap"]
            print(f"  loads {s['server_loads']} vs {n['server_loads']}; wall swap / no-swap {s['wall'] / n['wall']:.3f}x"
                  f" (goal <= 0.6x); verdict {'the same' if s['verdict'] == n['verdict'] else 'DIFFERENT'}")


if __name__ == "__main__":
    main()
