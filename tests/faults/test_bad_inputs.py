"""Bad stores, as a user meets them on the command line: one line naming the fix, exit 2, no traceback, and no
Prefect or server started."""
import json
import os
import subprocess
import sys

import pytest

from infra import tracking
from infra.config import SpecdiagError
from tests.conftest import ROOT


def _cli(uri: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "MLFLOW_TRACKING_URI": uri}
    return subprocess.run([sys.executable, "flows/diagnose.py", "--drafter", "ngram", "--no-control"], cwd=ROOT,
                          env=env, text=True, capture_output=True, timeout=300)


def _one_line(done: subprocess.CompletedProcess, starts: str) -> None:
    assert done.returncode == 2, done.stderr[-2000:]
    lines = [ln for ln in done.stderr.splitlines() if ln.startswith("specdiag:")]
    assert len(lines) == 1 and lines[0].startswith(starts), done.stderr[-2000:]
    assert "Traceback" not in done.stderr and "MLFLOW_TRACKING_URI" in lines[0]
    assert "Beginning flow run" not in done.stdout + done.stderr  # refused before Prefect starts


def test_a_store_that_cannot_be_created_is_one_line(tmp_path):
    (tmp_path / "file").write_text("not a directory")
    _one_line(_cli(f"sqlite:///{tmp_path}/file/mlflow.db"), "specdiag: error: MLflow store sqlite:///")


def test_artifacts_that_cannot_be_written_are_one_line(tmp_path):
    (tmp_path / "mlruns").write_text("where the artifacts should go")
    _one_line(_cli(f"sqlite:///{tmp_path}/mlflow.db"), "specdiag: error: MLflow artifacts cannot be written")


def test_a_store_without_room_for_a_diagnosis_is_refused(tmp_path, monkeypatch):
    monkeypatch.setattr(tracking, "MIN_FREE_MB", 2**40)  # more than any disk here has free
    with pytest.raises(SpecdiagError, match=r"disk is full: \d+ MB free .*MLFLOW_TRACKING_URI"):
        tracking.check_store(f"sqlite:///{tmp_path}/mlflow.db")
    monkeypatch.setattr(tracking, "MIN_FREE_MB", 1)
    tracking.check_store(f"sqlite:///{tmp_path}/mlflow.db")


def test_extra_settings_the_engine_would_refuse_are_one_line_before_any_server(tmp_path):
    """A typo in a drafter's extra speculative settings and a value out of range, judged by the installed engine's
    own SpeculativeConfig rules (vLLM forbids unknown keys, but only once the server starts)."""
    env = {**os.environ, "MLFLOW_TRACKING_URI": f"sqlite:///{tmp_path}/mlflow.db"}
    done = subprocess.run([sys.executable, "flows/diagnose.py", "--drafter", "ngram", "--no-control", "--arms",
                           "ngram-never", "--set", "drafters.ngram.extra.prompt_lookup_mn=2",
                           "--set", "drafters.ngram-never.extra.prompt_lookup_min=0"],
                          cwd=ROOT, env=env, text=True, capture_output=True, timeout=300)
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr[-2000:]
    lines = [ln for ln in done.stderr.splitlines() if ln.startswith("specdiag:")]
    assert len(lines) == 1, done.stderr[-2000:]
    assert "drafter 'ngram': unknown key 'prompt_lookup_mn' (did you mean prompt_lookup_min" in lines[0]
    assert "drafter 'ngram-never': prompt_lookup_min=0: Input should be greater than or equal to 1" in lines[0]
    assert "--set drafters.NAME.extra.KEY=VALUE" in lines[0]
    assert "Beginning flow run" not in done.stdout + done.stderr  # refused before Prefect or a server starts


def test_the_engines_answer_on_extra_settings_is_kept_on_its_host_per_question(tmp_path, monkeypatch):
    """Importing vLLM's config takes seconds on 2 cores, on every diagnosis with extra settings: the host keeps the
    answer, keyed by the engine and the question (a planted answer comes back; another question is asked anew)."""
    from infra import embedded, vllm
    from infra.executor import LocalExecutor

    python, typo = embedded.engine_python(), {"ngram": {"prompt_lookup_mn": 2}}
    monkeypatch.setenv("HOME", str(tmp_path))  # the engine's Python runs as a child: its ~ is here
    assert "unknown key 'prompt_lookup_mn'" in vllm.check_extra_settings(LocalExecutor(), python, typo)["ngram"][0]
    kept = list((tmp_path / ".cache/specdiag/extra-checks").glob("*.json"))
    assert len(kept) == 1
    kept[0].write_text(json.dumps({"ngram": ["planted"]}))
    assert vllm.check_extra_settings(LocalExecutor(), python, typo) == {"ngram": ["planted"]}
    assert vllm.check_extra_settings(LocalExecutor(), python, {"ngram": {"prompt_lookup_min": 2}}) == {}
