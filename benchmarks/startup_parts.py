"""Where a diagnosis's startup goes (issue 19): Prefect's temporary server against the program's imports.

    python benchmarks/startup_parts.py [--rounds 3]

Each round is a fresh process per measurement: (1) the server alone, from its start to its /health answering; (2) as
flows/diagnose.py runs it, the server started first and the diagnosis's modules imported beside it: how long the
imports took and how long the program then waited for the server. Printed per round; a wait well above 0 means the
server, not the imports, bounds the startup.
"""
import argparse
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PRELUDE = ("import time, sys; t0 = time.monotonic(); sys.path.insert(0, %r)\n"
           "from infra.prefect_boot import early_server\nfrom infra.browser import wait_http\ns = early_server()\n")
ALONE = PRELUDE + ("wait_http(f'{s.api_url}/health', s.proc, 120, 'Prefect', every_s=0.05)\n"
                   "print(f'{time.monotonic() - t0:.2f}'); s.stop()\n")
BESIDE = PRELUDE + ("import flows.diagnose\nt1 = time.monotonic()\n"
                    "wait_http(f'{s.api_url}/health', s.proc, 120, 'Prefect', every_s=0.05)\n"
                    "print(f'{t1 - t0:.2f} {time.monotonic() - t1:.2f}'); s.stop()\n")


def run(code: str) -> list[float]:
    env = {k: v for k, v in os.environ.items() if k != "PREFECT_API_URL"}
    env["PREFECT_SERVER_ANALYTICS_ENABLED"] = "false"
    out = subprocess.run([sys.executable, "-c", code % str(ROOT)], capture_output=True, text=True, timeout=300, env=env)
    if out.returncode:
        raise SystemExit(out.stderr[-2000:])
    return [float(x) for x in out.stdout.split()[-2:] if x.replace(".", "").isdigit()]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    for i in range(ap.parse_args().rounds):
        alone, (imports, wait) = run(ALONE)[-1], run(BESIDE)
        print(f"round {i + 1}: server alone healthy after {alone:.2f} s; beside it, imports {imports:.2f} s, then "
              f"{wait:.2f} s waiting for the server (startup's floor here: {imports + wait:.2f} s)")


if __name__ == "__main__":
    main()
