"""The seed's central suspect, reproduced: a good EAGLE-3 head behind a faulty engine patch -> `integration`.

`smol-eagle3-badpatch` is the trained head behind a vLLM plugin the project injects: it feeds the head layers 0-2
while its config and vLLM's log say (2, 15, 27). The control is the same head on the unpatched engine: the demo's
credible control (about 0.5 at position 0 on the default chat prompts, served), on the default prompts.
"""
import shutil
from pathlib import Path

import pytest

from infra.embedded import eagle3_drafter
from tasks.verdict.evidence import NARROW, acceptance_interval
from tests.conftest import diagnose

pytestmark = pytest.mark.e2e


def test_faulty_engine_patch_is_named_integration(eagle3, eagle3_store, no_servers_left, tmp_path):
    """Run as a user would, with the CLI's defaults (local host, default host.workdir): the offline evaluation must
    run and its numbers must reach the verdict (it failed on every local run before: SameFileError). Then the good
    head itself, as a candidate against the same control, is not blamed: `healthy`, or `draft_overhead` where the
    host makes its drafting cost more than it saves (issue 18)."""
    done = eagle3  # the diagnosis on the EAGLE-3 store (tests/e2e/conftest.py), as a user runs it
    assert done.returncode == 0, done.output[-3000:]
    bad, good = done.arms["smol-eagle3-badpatch"].data, done.arms["smol-eagle3"].data
    assert done.parent.data.tags["specdiag.offline_eval"] == "ok"
    assert "offline evaluation FAILED" not in done.output

    # The trained head predicts when the engine feeds it right, and served stays near its offline reference forward:
    # vLLM serves target and head in bf16, the reference runs fp32, and served drafts start where the last one
    # failed, which samples harder positions than the reference's every slot (measured on these settings: 0.48
    # served vs 0.58 offline at position 0), far from the integration rule's 0.5x.
    assert good.metrics["acceptance_rate_pos_0"] >= 0.45
    assert good.metrics["acceptance_rate"] > 0.6 * good.metrics["offline_acceptance_rate"]
    # Same checkpoint, same offline numbers; served collapses only behind the faulty patch.
    assert bad.metrics["offline_acceptance_rate"] == good.metrics["offline_acceptance_rate"]
    assert bad.metrics["acceptance_rate"] < 0.5 * bad.metrics["offline_acceptance_rate"]
    assert "SPECDIAG_FAULT_AUX_LAYERS" in bad.params["engine_env"]

    assert done.parent.data.tags["specdiag.verdict"] == "integration"
    verdict = done.artifact_text(done.parent, "verdict.md")
    # An extra arm gets its own cause against the same control: the scrambled d2t, confirmed by the intervention
    # (the same head with the control's d2t, offline, accepts far more).
    scrambled = done.arms["smol-eagle3-scrambled"].data
    assert scrambled.tags["specdiag.arm_verdict"] == "vocab_mismatch"
    assert scrambled.metrics["offline_acceptance_rate_aux_control_mapping"] > 2 * scrambled.metrics["offline_acceptance_rate"]
    assert "smol-eagle3-scrambled on its own: `vocab_mismatch`" in verdict and "control's d2t" in verdict
    # the scrambled head has the control's shapes: swapped into its running server (three loads, not four); the
    # patched engine needs its plugin in place at start, so badpatch loads its own
    assert scrambled.tags["specdiag.served"] == f"swapped into {done.arms['smol-eagle3'].info.run_id}"
    assert done.arms["smol-eagle3-badpatch"].data.tags["specdiag.served"] == "fresh load"
    assert "smol-eagle3-badpatch: offline acceptance" in verdict and "# Verdict: `integration`" in done.output
    log = done.artifact_text(done.arms["smol-eagle3-badpatch"], "smol-eagle3-badpatch.server.log")
    assert "Using auxiliary layers from speculative config: (2, 15, 27)" in log  # what the engine claims
    assert "specdiag fault injection" in log  # what it does

    # The good head as a user's candidate (its folder copied, as a user passes a checkpoint path) against the same
    # control, with the default settings (chat prompts, 32 tokens, the profile's cap): two loads, the copy swapped into
    # the control's server. Both heads accept the same by construction: the verdict must say so, never `inconclusive`
    # (issue 38; with 15 chat prompts both intervals stayed wider than versus_control's NARROW). The copy's files are
    # new (fresh mtimes), so the candidate is measured anew rather than reused from the control's identical arm.
    head = shutil.copytree(eagle3_drafter(), tmp_path / "my-eagle3", copy_function=shutil.copy)
    again = diagnose(eagle3_store, "--drafter", str(head), "--control", "smol-eagle3")
    assert again.returncode == 0, again.output[-3000:]
    assert "prompts: at most 40 measured per arm ('chat' holds 64 distinct prompts)" in again.output
    assert "too few to settle" not in again.output
    served = {a: r.data.tags["specdiag.served"] for a, r in again.arms.items()}
    assert served["my-eagle3"] == f"swapped into {again.arms['smol-eagle3'].info.run_id}", served
    assert "candidate acceptance matches the control's" in again.output
    for arm in ("my-eagle3", "smol-eagle3"):  # both measured narrow, well before the cap
        lo, hi = acceptance_interval(again.arms[arm].data.metrics)
        assert hi - lo < NARROW and again.arms[arm].data.metrics["sys/requests_ok"] < 40
    # Its acceptance is the control's: `healthy`, or `draft_overhead` where drafting costs this host more than it
    # saves. Which one is the host's: on 2026-12-07's VM (server loads of 38-49 s) this head measured 0.79x
    # [0.73-0.86] at k=3 and 64 tokens, and then the verdict must show that speedup clear below 1.
    cause = again.parent.data.tags["specdiag.verdict"]
    assert cause in ("healthy", "draft_overhead"), again.output[-3000:]
    if cause == "draft_overhead":
        assert again.arms["my-eagle3"].data.metrics["speedup_paired_hi"] < 1, again.output[-3000:]
        assert "acceptance is fine, but the measured speedup" in again.output


def test_served_aux_layer_interventions_name_the_fault_without_offline_numbers(eagle3, eagle3_cli, no_servers_left):
    """The seed's other suspect, as on a 1T target with no hidden-state dumps (no offline evaluation at all): the
    head's config names layers (1, 8, 20) it was not trained on. The aux_layers probe feeds the same head the engine's
    default layers, its ids -1 and +1, swapped into its running server one window each: one server load for the four
    drafter arms (the baseline and the control reused from the diagnosis above), and the served probe names the
    cause and the layers."""
    done = eagle3_cli("--drafter", "smol-eagle3-wrongaux", "--control", "smol-eagle3", "--probe", "aux_layers",
                      "--set", "offline_eval=none")
    assert done.returncode == 0, done.output[-3000:]
    assert not any(k.startswith("offline_") for k in done.arms["smol-eagle3-wrongaux"].data.metrics)  # served only
    probes = {"smol-eagle3-wrongaux@aux=2,15,27", "smol-eagle3-wrongaux@aux=0,7,19", "smol-eagle3-wrongaux@aux=2,9,21"}
    assert set(done.arms) == {"baseline", "smol-eagle3", "smol-eagle3-wrongaux"} | probes
    served = {a: r.data.tags["specdiag.served"] for a, r in done.arms.items()}
    cand = done.arms["smol-eagle3-wrongaux"].info.run_id
    assert served["smol-eagle3-wrongaux"] == "fresh load" and all(
        served[p] == f"swapped into {cand}" for p in probes), served
    assert len([ln for ln in done.output.splitlines() if "] launched pid" in ln]) == 1
    trained = done.arms["smol-eagle3-wrongaux@aux=2,15,27"].data.metrics["acceptance_rate"]
    assert trained > 2 * done.arms["smol-eagle3-wrongaux"].data.metrics["acceptance_rate"]
    assert done.parent.data.tags["specdiag.verdict"] == "aux_layers", done.output[-3000:]
    assert "smol-eagle3-wrongaux@aux=2,15,27" in done.artifact_text(done.parent, "verdict.md")


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
    assert "d2t_scrambled" in {f.code for f in scrambled if f.severity == "error"}
    dropped = inspect_drafter.fn(embedded.resolve("embedded:smol-eagle3-nod2t"), "eagle3", target)
    assert "d2t_missing" in {f.code for f in dropped if f.severity == "error"}
    script = str(Path(__file__).resolve().parents[2] / "flows" / "inspect_drafter.py")
    cli = subprocess.run([sys.executable, script, "embedded:smol-eagle3-wrongaux", "--target",
                          "embedded:smollm2", "--control", "embedded:smol-eagle3"], capture_output=True, text=True)
    assert "aux_layers_differ" in cli.stdout, cli.stdout + cli.stderr
