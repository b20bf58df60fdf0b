import inspect
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("args, message", [
    (["--drafter", "nope"], "unknown drafter 'nope'"),
    (["--profile", "nope"], "unknown profile 'nope'"),
    (["--drafter", "/no/such/ckpt"], "does not exist"),
    (["--set", "bench.max_tokens=-1"], "bench.max_tokens"),
    (["--profile", str(ROOT / "tests/fixtures/profile_list.yaml")], "holds a list, not a mapping of sections"),
    (["--profile", str(ROOT / "tests/fixtures/profile_scalar.yaml")], "holds a str, not a mapping of sections"),
])
def test_bad_input_is_one_clear_line_not_a_traceback(args, message, tmp_path):
    """On a new user's first run, too: a store MLflow has yet to create says nothing before the error."""
    env = {**os.environ, "MLFLOW_TRACKING_URI": f"sqlite:///{tmp_path}/mlflow.db"}
    proc = subprocess.run([sys.executable, "flows/diagnose.py", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=120, env=env)
    assert proc.returncode == 2
    assert message in proc.stderr and "Traceback" not in proc.stderr + proc.stdout
    assert proc.stderr.startswith("specdiag: error:")


def test_help_documents_the_flags():
    out = subprocess.run([sys.executable, "flows/diagnose.py", "--help"], cwd=ROOT, capture_output=True,
                         text=True, timeout=120).stdout
    for flag in ("--profile", "--drafter", "--control", "--arms", "--prompts", "--max-tokens", "--set"):
        assert flag in out


def test_prefect_deployments_point_at_the_diagnose_and_arm_flows():
    from prefect.flows import load_flow_from_entrypoint

    from infra.config import SpreadConfig

    spec = yaml.safe_load((ROOT / "prefect.yaml").read_text())
    found = {d["name"]: d for d in spec["deployments"]}
    flow = load_flow_from_entrypoint(str(ROOT / found["diagnose"]["entrypoint"]))
    assert flow.name == "diagnose"
    assert set(found["diagnose"]["parameters"]) <= set(inspect.signature(flow.fn).parameters)
    arm = load_flow_from_entrypoint(str(ROOT / found["spread"]["entrypoint"]))  # what spread.hosts runs on workers
    assert f"{arm.name}/spread" == SpreadConfig().deployment
    assert found["spread"]["work_pool"]["name"] == SpreadConfig().pool


@pytest.mark.parametrize("at_deploy", [True, False], ids=["set-at-deploy", "set-on-worker"])
def test_prefect_yaml_finds_the_checkout_whether_specdiag_home_is_set_at_deploy_time_or_on_the_worker(
        at_deploy, tmp_path, monkeypatch):
    """prefect.yaml's pull step as Prefect treats it: `prefect deploy` substitutes the environment it runs in and
    keeps what is unset (remove_notset=False); the worker's run of the pull steps substitutes its own."""
    import asyncio

    from prefect.deployments.steps.core import run_steps
    from prefect.utilities.templating import apply_values

    spec = yaml.safe_load((ROOT / "prefect.yaml").read_text())
    checkout = tmp_path / "checkout"
    checkout.mkdir()
    def environment(has_home: bool) -> None:
        if has_home:
            monkeypatch.setenv("SPECDIAG_HOME", str(checkout))
        else:
            monkeypatch.delenv("SPECDIAG_HOME", raising=False)

    environment(at_deploy)  # the shell that runs `prefect deploy`
    pull = apply_values(spec, os.environ, remove_notset=False)["pull"]  # what prefect deploy stores
    assert ("{{ $SPECDIAG_HOME }}" in str(pull)) is not at_deploy
    environment(not at_deploy)  # the worker's
    monkeypatch.chdir(tmp_path)
    out = asyncio.run(run_steps(pull))
    assert Path.cwd() == checkout and out is not None


def test_probe_host_prompt_set_and_budget_flags_reach_the_profile():
    from flows.diagnose import prepare
    from infra.cli import overrides, parser

    args = parser().parse_args(["--drafter", "smol-eagle3", "--probe", "raw_prompts", "--probe", "k_sweep",
                                "--prompt-set", "math", "--budget-tokens", "500", "--budget-s", "30"])
    cfg, arms, prompts = prepare("demo", overrides(args), [])
    assert cfg.probes == ["raw_prompts", "k_sweep"] and cfg.bench.prompts == "math" and cfg.bench.early_stop
    assert (cfg.bench.max_output_tokens, cfg.bench.max_bench_s) == (500, 30.0)
    fixed, _, _ = prepare("demo", overrides(parser().parse_args(["--fixed"])), [])
    assert not fixed.bench.early_stop and fixed.bench.num_prompts == cfg.bench.num_prompts
    assert "smol-eagle3@raw" in [a.name for a in arms]


def test_the_deployment_form_offers_choices_and_the_server_refuses_a_bad_drafter(prefect_server):
    """The parameters as the Prefect UI's form submits them, through a real Prefect server that enforces the
    deployment's schema: choices with help, `sets` documented, a checkpoint path accepted, a typo refused."""
    from prefect.client.orchestration import get_client

    from flows.diagnose import diagnose

    deployment_id = diagnose.to_deployment("form").apply()
    with get_client(sync_client=True) as client:
        form = client.read_deployment(deployment_id).parameter_openapi_schema["properties"]
        assert "demo" in form["profile"]["anyOf"][0]["enum"] and "smol-permuted" in form["drafter"]["anyOf"][0]["enum"]
        assert "KEY=VALUE" in form["sets"]["description"] and "checkpoint" in form["drafter"]["description"]
        for ok in ({"drafter": "smol-permuted", "control": "", "sets": ["bench.max_tokens=16"]},
                   {"profile": "kimi-k25", "drafter": "/models/my-eagle3-head"}):
            assert client.create_flow_run_from_deployment(deployment_id, parameters=ok).id
        with pytest.raises(Exception) as refused:
            client.create_flow_run_from_deployment(deployment_id, parameters={"drafter": "smol-permutd"})
    # refused before any run exists; the form offers the list (the enum above), the server names the field
    assert "409" in str(refused.value) and "Validation failed for field 'drafter'" in str(refused.value)
