"""What a diagnosis spends, by default against --fixed, side by side in one run (issue 19).

    python benchmarks/decisive_default.py [--pairs smol-permuted:smol-self,smol-noisy:smol-self]

Each candidate:control pair is diagnosed twice on the embedded engine, as a user runs it: `python flows/diagnose.py
--drafter D --control C` (the default: each arm ends once its numbers settle what the verdict asks of it, the
profile's num_prompts being the cap), then the same with --fixed (every prompt of num_prompts measured). Each run is
a fresh process with no Prefect server configured, so it pays for imports and Prefect's temporary server every time,
and with its own MLflow store (one run's arms must not be reused by the next). What only a machine's first
diagnosis pays is paid before the clock starts, as a user's later diagnoses find it: each store is created (MLflow's
schema migrations, 2.6 s on 2 cores) and the pairs' embedded checkpoints are built (smol-noisy: ~4 s). Printed per
run: the process's wall time against the sum of its arms' server loads and benchmarks (goal <= 1.1x), where the rest
went, the output tokens measured and the verdict; then tokens by default over --fixed for the same verdict (goal <=
25%).
"""
import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from mlflow.tracking import MlflowClient  # noqa: E402

from infra import embedded  # noqa: E402
from infra.config import load_profile  # noqa: E402
from infra.tracking import check_store  # noqa: E402


def diagnose(tmp: Path, port: int, *args: str, extra_metrics: bool = False) -> dict:
    """One diagnosis in a fresh process and store; extra_metrics: also its server loads and time in swaps."""
    store = tmp / f"run{len(list(tmp.iterdir()))}"
    store.mkdir()
    env = {k: v for k, v in os.environ.items() if k != "PREFECT_API_URL"}
    env.update(MLFLOW_TRACKING_URI=f"sqlite:///{store}/mlflow.db", PYTHONUNBUFFERED="1")
    check_store(env["MLFLOW_TRACKING_URI"])  # created, as a user's store is after their first diagnosis
    start = time.monotonic()
    done = subprocess.run([sys.executable, "flows/diagnose.py", *args, "--set", f"target.port={port}", "--set",
                           f"host.workdir={store}/runs"], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=1800)
    wall = time.monotonic() - start
    if done.returncode != 0:
        raise SystemExit(f"diagnose {' '.join(args)} failed ({done.returncode}):\n{done.stdout[-3000:]}"
                         f"\n{done.stderr[-3000:]}")
    client = MlflowClient(env["MLFLOW_TRACKING_URI"])
    parent = client.search_runs([e.experiment_id for e in client.search_experiments()],
                                "tags.`specdiag.kind` = 'diagnosis'")[0]
    arms = client.search_runs([parent.info.experiment_id], f"tags.mlflow.parentRunId = '{parent.info.run_id}'")
    m = parent.data.metrics
    return {"wall": wall, "verdict": parent.data.tags["specdiag.verdict"], "flow": m["sys/diagnosis_wall_s"],
            "laps": {k: m.get(f"sys/{k}_s", 0.0) for k in ("startup", "setup", "offline", "finish")},
            "loads": sum(a.data.metrics.get("sys/server_ready_s", 0.0) for a in arms),
            "bench": sum(a.data.metrics.get("sys/bench_s", 0.0) for a in arms),
            "tokens": sum(a.data.metrics.get("sys/output_tokens", 0.0) for a in arms),
            "requests": {a.data.tags["specdiag.arm"]: int(a.data.metrics.get("sys/requests_ok", 0)) for a in arms},
            **({"server_loads": sum(1 for a in arms if "sys/server_ready_s" in a.data.metrics),
                "swaps": sum(a.data.metrics.get("sys/swap_s", 0.0) for a in arms)} if extra_metrics else {})}


def line(label: str, r: dict) -> str:
    measured = r["loads"] + r["bench"]
    laps = ", ".join(f"{k} {v:.1f} s" for k, v in r["laps"].items())
    return (f"  {label:8} wall {r['wall']:6.1f} s = {r['wall'] / measured:.3f}x of loads {r['loads']:.1f} s + "
            f"benchmarks {r['bench']:.1f} s; {laps}, exit {r['wall'] - r['flow']:.1f} s; "
            f"{r['tokens']:.0f} tokens; requests {r['requests']}; verdict {r['verdict']}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--pairs", default="smol-permuted:smol-self,smol-noisy:smol-self")
    ap.add_argument("--port", type=int, default=8096)
    args = ap.parse_args()
    totals = {"default": 0.0, "fixed": 0.0}
    drafters = load_profile("demo").drafters
    for name in {n for pair in args.pairs.split(",") for n in pair.split(":")}:
        embedded.resolve(drafters[name].model)  # built on a machine's first use of it, before the clock starts
    with tempfile.TemporaryDirectory() as tmp:
        for pair in args.pairs.split(","):
            drafter, control = pair.split(":")
            runs = {label: diagnose(Path(tmp), args.port, "--drafter", drafter, "--control", control, *extra)
                    for label, extra in (("default", ()), ("fixed", ("--fixed",)))}
            print(f"\n=== {drafter} vs {control}")
            for label, r in runs.items():
                print(line(label, r))
                totals[label] += r["tokens"]
            same = runs["default"]["verdict"] == runs["fixed"]["verdict"]
            print(f"  tokens default / --fixed: {runs['default']['tokens'] / runs['fixed']['tokens']:.1%}; verdict "
                  f"{'the same' if same else 'DIFFERENT'}")
    print(f"\nall pairs: default {totals['default']:.0f} tokens, --fixed {totals['fixed']:.0f}: "
          f"{totals['default'] / totals['fixed']:.1%} (goal <= 25%)")


if __name__ == "__main__":
    main()
