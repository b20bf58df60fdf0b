"""Regenerate the README's screenshots (headless Chromium, 1600 px wide) from the newest diagnosis in a store:
its report.html and its parent run's page through a real `mlflow server`, and the deployment's run form in a
real Prefect server's UI.

    python docs/screenshots.py [--store sqlite:///mlflow.db] [--out docs]
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from mlflow.tracking import MlflowClient

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from infra.browser import artifact_file, free_port, mlflow_server, screenshot, wait_http  # noqa: E402
from infra.config import PROJECT_ROOT  # noqa: E402
from infra.tracking import run_path  # noqa: E402


def newest_diagnosis(store: str):
    client = MlflowClient(store)
    runs = [r for e in client.search_experiments() for r in client.search_runs(
        [e.experiment_id], "tags.`specdiag.kind` = 'diagnosis' and attributes.status = 'FINISHED'",
        order_by=["attributes.start_time DESC"], max_results=1)]
    if not runs:
        sys.exit(f"no finished diagnosis in {store}: run `python flows/diagnose.py` first")
    return max(runs, key=lambda r: r.info.start_time)


def mlflow_shots(store: str, out: Path) -> list[Path]:
    run = newest_diagnosis(store)
    page = f"{run_path(run.info.experiment_id, run.info.run_id)}"
    with mlflow_server(store) as server, tempfile.TemporaryDirectory() as tmp:
        report = artifact_file(server, run.info.run_id, "report.html", Path(tmp))
        return [screenshot(report, out / "report.png", height=2000),
                screenshot(f"{server}/{page}", out / "mlflow_parent_run.png", wait_ms=15000),
                screenshot(f"{server}/{page.replace('?', '/artifacts/report.html?')}", out / "mlflow_report.png",
                           wait_ms=40000)]  # the viewer fetches the artifact, then renders it in a sandboxed frame


def prefect_form_shot(out: Path) -> Path:
    """A throwaway Prefect server (its own PREFECT_HOME), the deployment registered on it, its run form."""
    port = free_port()
    with tempfile.TemporaryDirectory() as home:
        env = {**os.environ, "PREFECT_HOME": home, "PREFECT_API_URL": f"http://127.0.0.1:{port}/api",
               "PREFECT_SERVER_ANALYTICS_ENABLED": "false"}
        server = subprocess.Popen([sys.executable, "-m", "prefect", "server", "start", "--host", "127.0.0.1",
                                   "--port", str(port)], env=env, stdout=subprocess.DEVNULL,
                                  stderr=subprocess.STDOUT, start_new_session=True)
        try:
            wait_http(f"http://127.0.0.1:{port}/api/health", server, 180, "the Prefect server")
            deployment = subprocess.run(
                [sys.executable, "-c", "from flows.diagnose import diagnose; print(diagnose.to_deployment("
                 "'diagnose').apply())"], env=env, cwd=PROJECT_ROOT, capture_output=True, text=True, check=True)
            deployment_id = deployment.stdout.strip().splitlines()[-1]
            return screenshot(f"http://127.0.0.1:{port}/deployments/deployment/{deployment_id}/run",
                              out / "prefect_run_form.png", wait_ms=15000)
        finally:
            server.terminate()
            server.wait(30)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--store", default=f"sqlite:///{PROJECT_ROOT / 'mlflow.db'}")
    ap.add_argument("--out", type=Path, default=PROJECT_ROOT / "docs")
    args = ap.parse_args()
    for path in mlflow_shots(args.store, args.out) + [prefect_form_shot(args.out)]:
        print(f"wrote {path}")


if __name__ == "__main__":
    main()
