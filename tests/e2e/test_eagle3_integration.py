"""The seed's central suspect, reproduced: a good EAGLE-3 head behind a faulty engine patch -> `integration`.

Arms: baseline, `smol-eagle3-badpatch` (the trained head; a vLLM plugin the project injects feeds it layers 0-2
while its config and vLLM's log say (2, 15, 27)) and `smol-eagle3` (the same head, unpatched engine).
"""
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from flows.diagnose import diagnose

pytestmark = pytest.mark.e2e


def test_faulty_engine_patch_is_named_integration(prefect_server, mlflow_uri, tmp_path, no_servers_left):
    results = diagnose("demo", "smol-eagle3-badpatch", None, ["smol-eagle3"],
                       sets=[f"host.workdir={tmp_path / 'runs'}", "control=null",
                             "bench.num_prompts=8", "bench.max_tokens=48",  # enough drafts to separate the two
                             "bench.prompts=topics"])  # traffic like the drafter's training data, held out of it
    assert all(r.ok for r in results), [r.error for r in results]
    bad = next(r.metrics for r in results if r.arm == "smol-eagle3-badpatch")
    good = next(r.metrics for r in results if r.arm == "smol-eagle3")

    # The trained head predicts when the engine feeds it right, and served matches its offline reference forward.
    assert good["acceptance_rate_pos_0"] >= 0.3
    assert abs(good["acceptance_rate"] - good["offline_acceptance_rate"]) < 0.1
    # Same checkpoint, same offline numbers; served collapses only behind the faulty patch.
    assert bad["offline_acceptance_rate"] == good["offline_acceptance_rate"]
    assert bad["acceptance_rate"] < 0.5 * bad["offline_acceptance_rate"]

    client = MlflowClient(mlflow_uri)
    bad_run = client.get_run(next(r.run_id for r in results if r.arm == "smol-eagle3-badpatch"))
    assert "SPECDIAG_FAULT_AUX_LAYERS" in bad_run.data.params["engine_env"]
    parent = client.get_run(bad_run.data.tags["mlflow.parentRunId"])
    assert parent.data.tags["specdiag.verdict"] == "integration"
    log = (tmp_path / "runs").glob("*/smol-eagle3-badpatch.server.log")
    text = next(log).read_text()
    assert "Using auxiliary layers from speculative config: (2, 15, 27)" in text  # what the engine claims
    assert "specdiag fault injection" in text  # what it does


def test_eagle3_checkpoint_faults_are_caught_statically_in_seconds():
    """Before any server: the trained head passes, its scrambled-d2t and dropped-d2t variants do not."""
    import subprocess
    import sys
    import time

    from infra import embedded
    from tasks.inspect import inspect_drafter

    target = embedded.resolve("embedded:smollm2")
    good = inspect_drafter.fn(embedded.resolve("embedded:smol-eagle3"), "eagle3", target)
    assert not [f for f in good if f.severity == "error"], good
    start = time.monotonic()
    scrambled = inspect_drafter.fn(embedded.resolve("embedded:smol-eagle3-scrambled"), "eagle3", target)
    assert time.monotonic() - start < 5
    assert "d2t_order" in {f.code for f in scrambled if f.severity == "error"}
    dropped = inspect_drafter.fn(embedded.resolve("embedded:smol-eagle3-nod2t"), "eagle3", target)
    assert "d2t_missing" in {f.code for f in dropped if f.severity == "error"}
    script = str(Path(__file__).resolve().parents[2] / "flows" / "inspect_drafter.py")
    cli = subprocess.run([sys.executable, script, "embedded:smol-eagle3-wrongaux", "--target",
                          "embedded:smollm2", "--control", "embedded:smol-eagle3"], capture_output=True, text=True)
    assert "aux_layers_differ" in cli.stdout, cli.stdout + cli.stderr
