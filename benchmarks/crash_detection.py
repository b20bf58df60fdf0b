"""How long after the server process dies is its arm failed? For a crash at start (while the model loads) and a
crash mid-benchmark, on real vLLM CPU servers, through the arm's own tasks (launch, wait-healthy, benchmark).

    python benchmarks/crash_detection.py [--rounds 2] [--port 8011]
The server's process group is SIGKILLed; the clock runs from the kill to the task that fails the arm raising
(ServerDied from wait-healthy, BenchmarkFailed from the benchmark). Goal: under 3 s for both.
"""
import argparse
import os
import signal
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "120")

from infra.arms import plan_arms, plan_server  # noqa: E402
from infra.config import load_profile  # noqa: E402
from infra.executor import LocalExecutor  # noqa: E402
from infra.promptsets import load as load_prompts  # noqa: E402
from tasks.bench import benchmark  # noqa: E402
from tasks.health import wait_healthy  # noqa: E402
from tasks.launch import launch_server  # noqa: E402
from tasks.teardown import teardown  # noqa: E402


def kill_later(server, when, killed: dict) -> None:
    """SIGKILL the server's group once when() says so; record the moment."""
    def watch():
        while not when():
            time.sleep(0.05)
        os.killpg(server.process.pgid, signal.SIGKILL)
        killed["at"] = time.monotonic()
    threading.Thread(target=watch, daemon=True).start()


def one(profile, tmp: str, phase: str) -> float:
    ex = LocalExecutor()
    plan = plan_server(profile, plan_arms(profile)[0], tmp)
    server, killed = launch_server(plan, ex), {}
    try:
        if phase == "start":  # while the model loads: a few seconds after launch
            launched = time.monotonic()
            kill_later(server, lambda: time.monotonic() - launched > 4.0, killed)
            wait_healthy(server, 300)
        else:
            wait_healthy(server, 300)
            log = Path(plan.log_path)  # once a measured request is being served
            kill_later(server, lambda: log.read_text(errors="replace").count("POST /v1/") >= 2, killed)
            benchmark(server.base_url, profile.bench, load_prompts("chat", 12))
        raise AssertionError(f"the {phase} crash was not detected")
    except Exception as exc:  # the exception that fails the arm
        detected = time.monotonic() - killed["at"]
        print(f"  {phase:5}: {type(exc).__name__} {detected:.2f} s after the kill")
        return detected
    finally:
        teardown(server)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--port", type=int, default=8011)
    args = ap.parse_args()
    profile = load_profile("demo", {"target.port": args.port}, ["drafter=ngram", "bench.max_tokens=64"])
    with tempfile.TemporaryDirectory() as tmp:
        times = {"start": [], "bench": []}
        for r in range(args.rounds):
            print(f"round {r + 1}")
            for phase in times:
                times[phase].append(one(profile, tmp, phase))
    print("\ncrash detection, seconds from the server's death to its arm failing (goal < 3 s):")
    for phase, ts in times.items():
        print(f"  crash {'at start' if phase == 'start' else 'mid-benchmark'}: max {max(ts):.2f} s, "
              f"mean {sum(ts) / len(ts):.2f} s over {len(ts)}")


if __name__ == "__main__":
    main()
