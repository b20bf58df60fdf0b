"""One diagnosis on one host, its follow-up with arms reused, and the same diagnosis spread over two hosts, side by
side in one run, on the services the README starts: a Prefect server, one process worker per host, an MLflow
tracking server. The hosts are `local` and a loopback sshd, each server pinned to its own core (2 cores here), so
"one host" is one core and "two hosts" are two. One host runs the diagnosis twice: in the diagnosis's own process
(as without --hosts) and through its worker (--hosts local), the same machinery as two hosts. Last, without any of
specdiag's machinery, the control's server is loaded alone on the first host's core, then on both cores at once: what
two "hosts" sharing this machine's memory cost each other, apart from the hand-off.

    python benchmarks/spread_hosts.py [--drafter smol-permuted] [--then smol-noisy] [--control smol-self]
Goals: the follow-up loads one server; two hosts take 0.6 or less of one host's wall time.
"""
import argparse
import os
import subprocess
import sys
import tempfile
from secrets import token_urlsafe
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path

import yaml
from mlflow.tracking import MlflowClient

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from infra import embedded  # noqa: E402
from infra.arms import plan_arms, plan_server, resolved_drafters  # noqa: E402
from infra.browser import mlflow_server  # noqa: E402
from infra.config import PROFILES_DIR, load_profile  # noqa: E402
from infra.executor import LocalExecutor  # noqa: E402
from infra.stack import loopback_sshd, prefect_server, workers  # noqa: E402
from tasks.health import wait_healthy  # noqa: E402
from tasks.launch import launch_server  # noqa: E402
from tasks.teardown import teardown  # noqa: E402


def two_host_profile(sshd: dict, path: Path) -> str:
    profile = yaml.safe_load((PROFILES_DIR / "demo.yaml").read_text())
    profile["host"] = "local"  # pinned as below, also without --hosts
    profile["hosts"] = {
        "local": {"cpus": [0]},
        "loop": {"kind": "ssh", "address": "127.0.0.1", "port": sshd["port"], "user": "root", "key_file": sshd["key"],
                 "known_hosts": sshd["known_hosts"], "python": embedded.engine_python(), "server_port": 8012,
                 "cpus": [1]}}
    path.write_text(yaml.safe_dump(profile))
    return str(path)


def diagnosis(env: dict, tracking: str, *args: str) -> tuple[float, int, str, str]:
    """(wall s of the command, servers loaded, verdict, where its time went) of `python flows/diagnose.py ARGS`."""
    start = time.monotonic()
    done = subprocess.run([sys.executable, "flows/diagnose.py", *args], cwd=ROOT, env=env, text=True,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    wall = time.monotonic() - start
    if done.returncode != 0:
        sys.exit(f"diagnose {' '.join(args)} failed:\n{done.stdout[-3000:]}")
    client = MlflowClient(tracking)
    runs = [r for e in client.search_experiments() for r in client.search_runs([e.experiment_id])]
    parent = max((r for r in runs if r.data.tags.get("specdiag.kind") == "diagnosis"), key=lambda r: r.info.start_time)
    arms = [r for r in runs if r.data.tags.get("mlflow.parentRunId") == parent.info.run_id]
    laps = next((line for line in done.stdout.splitlines() if line.startswith("wall time")), "")
    measured = [r for r in arms if "specdiag.reused_from" not in r.data.tags]
    stops = "; ".join(f"{r.data.tags['specdiag.arm']} {r.data.tags.get('specdiag.early_stop', 'to the cap')}"
                      for r in measured)  # what ended each window
    return wall, len(measured), parent.data.tags["specdiag.verdict"], f"{laps}\n  early stops: {stops}"


def load_times(profile: str, control: str, hosts: list[str], logs: Path) -> list[float]:
    """Seconds to healthy of CONTROL's server started at once on each host's cores and port, all on this machine."""
    cfg, ex = load_profile(profile, {"control": control}), LocalExecutor()
    arm = next(a for a in resolved_drafters(plan_arms(cfg)) if a.name == control)
    servers = []
    try:  # launched and stopped as an arm's own server is (port check, registry, /dev/shm leftovers)
        for h in hosts:
            servers.append(launch_server.fn(replace(plan_server(cfg.on_host(h), arm, str(logs / h)),
                                                    arm=f"{control}@{h}"), ex))
        with ThreadPoolExecutor(len(servers)) as pool:
            return list(pool.map(lambda srv: wait_healthy.fn(srv, 300), servers))
    finally:
        for srv in servers:
            teardown.fn(srv)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--drafter", default="smol-permuted")
    ap.add_argument("--then", default="smol-noisy")
    ap.add_argument("--control", default="smol-self")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        prefect_auth, mlflow_auth = f"specdiag:{token_urlsafe(16)}", ("specdiag", token_urlsafe(16))
        creds = {"PREFECT_API_AUTH_STRING": prefect_auth, "MLFLOW_TRACKING_USERNAME": mlflow_auth[0],
                 "MLFLOW_TRACKING_PASSWORD": mlflow_auth[1]}  # the services as docs/services.md runs them
        os.environ.update(creds)  # this script's own MLflow reads
        with loopback_sshd(tmp / "sshd") as sshd, prefect_server(tmp / "prefect", auth=prefect_auth) as api, \
                mlflow_server(f"sqlite:///{tmp}/mlflow.db", artifacts=tmp / "artifacts", auth=mlflow_auth) as tracking, \
                workers(api, "specdiag", ["local", "loop"], tmp / "workers", env=creds):
            env = {**os.environ, "PREFECT_API_URL": api, "MLFLOW_TRACKING_URI": tracking, "PYTHONUNBUFFERED": "1"}
            profile = two_host_profile(sshd, tmp / "twohosts.yaml")
            common = ["--profile", profile, "--control", args.control]
            fresh = [*common, "--drafter", args.drafter, "--fresh"]
            rows = [("one host", args.drafter, *diagnosis(env, tracking, *fresh)),
                    ("follow-up", args.then, *diagnosis(env, tracking, *common, "--drafter", args.then)),
                    ("1 worker", args.drafter, *diagnosis(env, tracking, *fresh, "--hosts", "local")),
                    ("2 workers", args.drafter, *diagnosis(env, tracking, *fresh, "--hosts", "local", "loop"))]
        alone, together = load_times(profile, args.control, ["local"], tmp / "alone"), \
            load_times(profile, args.control, ["local", "loop"], tmp / "together")
    full = rows[0][2]
    print(f"\n{'run':10} {'candidate':15} {'server loads':>12} {'wall s':>8} {'vs one host':>11}  verdict")
    for label, drafter, wall, loads, cause, _ in rows:
        print(f"{label:10} {drafter:15} {loads:12d} {wall:8.1f} {wall / full:10.2f}x  {cause}")
    for label, *_, laps in rows:  # where each run's time went, as the diagnosis printed it
        print(f"{label}: {laps}")
    (_, _, _, loads0, cause0, _), (_, _, wall1, loads1, _, _), (_, _, one, _, _, _), (_, _, two, _, cause2, _) = rows
    print(f"follow-up / one host: {loads1}/{loads0} server loads, wall {wall1 / full:.2f}x")
    print(f"two hosts / one host, both through Prefect workers: wall {two / one:.2f}x (goal 0.6 or less); "
          f"two hosts / one host in this process: {two / full:.2f}x; the same verdict: {cause2 == cause0}")
    print(f"{args.control}'s server without specdiag: healthy after {alone[0]:.1f} s alone, "
          f"{' and '.join(f'{t:.1f}' for t in together)} s when both hosts load one at once (this machine's memory "
          f"and cores are both hosts')")


if __name__ == "__main__":
    main()
