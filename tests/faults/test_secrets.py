"""Nothing secret recorded (issue 39, item 2): a diagnosis whose profile carries credentials in its engine environment
leaves no byte of them in anything it wrote: the MLflow store and its artifacts (params, server_cmd, the profile,
fingerprint.json, report.html, the server log), Prefect's database (flow-run parameters, logs), the server registry
and the run folder, nor in what it printed. The fingerprint keeps a hash, so the same token still matches."""
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from infra import secrets
from infra.embedded import cache_dir
from tests.conftest import ROOT

pytestmark = pytest.mark.e2e

CANARIES = {  # a credential by its name, an unknown variable, and a harmless-looking one the profile marks secret
    "HF_TOKEN": "hf_canaryTOKENq7Zx0pLm",
    "MY_COMPANY_PROXY": "canaryPROXYv93kd",
    "VLLM_MARKED_SETTING": "canaryMARKED55wq",
}


def _leaks(paths: list[Path]) -> list[str]:
    found = []
    for root in paths:
        for f in [root] if root.is_file() else root.rglob("*") if root.exists() else []:
            if f.is_file():
                data = f.read_bytes()
                found += [f"{f}: {k}" for k, v in CANARIES.items() if v.encode() in data]
    return found


def test_no_secret_value_reaches_any_record(cli, mlflow_uri, tmp_path, no_servers_left):
    from prefect.settings import PREFECT_SERVER_DATABASE_CONNECTION_URL

    sets = [f"engine.env.{k}={v}" for k, v in CANARIES.items()] + ['secrets=["VLLM_MARKED_SETTING"]']
    done = cli("--drafter", "ngram", "--no-control", "--prompts", "2", "--max-tokens", "8",
               *[a for s in sets for a in ("--set", s)])
    assert done.returncode == 0, done.output[-3000:]
    # the server did get them: its command, as recorded, names each with its marker
    cmd = done.arms["ngram"].data.params["server_cmd"]
    for key, value in CANARIES.items():
        assert f"{key}={shlex.quote(secrets.marker(value))}" in cmd, cmd
    assert "VLLM_CPU_KVCACHE_SPACE=1" in cmd  # an engine tunable stays readable
    prefect_db = Path(PREFECT_SERVER_DATABASE_CONNECTION_URL.value().split("///", 1)[1])
    written = [Path(mlflow_uri.removeprefix("sqlite:///")).parent, prefect_db.parent, cache_dir() / "servers",
               ROOT / "runs" / done.parent.info.run_id]
    assert prefect_db.exists() and (ROOT / "runs" / done.parent.info.run_id).exists()
    assert not _leaks(written), _leaks(written)
    assert not [k for k, v in CANARIES.items() if v in done.output]

    # --rerun reads the recorded profile: a secret comes from this environment, or the user is told to export it
    env = {k: v for k, v in os.environ.items() if k not in CANARIES}
    again = subprocess.run([sys.executable, "flows/diagnose.py", "--rerun", done.parent.info.run_id, "--dry-run"],
                           cwd=ROOT, env={**env, "MLFLOW_TRACKING_URI": mlflow_uri}, text=True, capture_output=True,
                           timeout=300)
    assert again.returncode == 2 and "Traceback" not in again.stderr, again.stderr[-2000:]
    assert "HF_TOKEN was recorded redacted" in again.stderr and "export HF_TOKEN" in again.stderr
    again = subprocess.run([sys.executable, "flows/diagnose.py", "--rerun", done.parent.info.run_id, "--dry-run"],
                           cwd=ROOT, env={**env, **CANARIES, "MLFLOW_TRACKING_URI": mlflow_uri}, text=True,
                           capture_output=True, timeout=300)
    assert again.returncode == 0, again.stderr[-2000:]
