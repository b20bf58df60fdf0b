"""The demo diagnosis on the real vLLM CPU engine, every default: baseline, smol-permuted candidate, smol-self control
(vocab_mismatch), on two server loads: smol-permuted has smol-self's shapes, so it is swapped into the control's running
server; then a follow-up with the under-trained smol-noisy (training_quality) on one server load."""
import os
import subprocess
import sys

import pytest

from tasks.compare import COLUMNS

pytestmark = pytest.mark.e2e

# the figures the verdict reads under their own names; housekeeping (where the time went) grouped under sys/
ARM_METRICS = {"output_tok_s", "ttft_ms_p50", "ttft_ms_p99", "tpot_ms_p50", "tpot_ms_p99", "speedup_vs_baseline",
               "sys/bench_s", "sys/arm_wall_s", "sys/overhead_s", "sys/host_lock_wait_s"}
SPEC_METRICS = {"acceptance_rate", "mean_acceptance_length", "num_drafts", "num_draft_tokens",
                "num_accepted_tokens", "acceptance_rate_pos_0", "acceptance_rate_pos_3", "sys/log_draft_tokens"}


def test_demo_diagnosis_records_every_arm(demo, demo_cli, demo_store, no_servers_left):
    done = demo  # the README's main job, `python flows/diagnose.py`, with every default (tests/conftest.py)
    assert done.returncode == 0, done.output[-3000:]
    assert "# Verdict: `vocab_mismatch`" in done.output and "MLflow:" in done.output
    client, parent, arms = done.client, done.parent, done.arms
    assert set(arms) == {"baseline", "smol-permuted", "smol-self"}
    assert client.get_experiment(parent.info.experiment_id).name == "demo"
    assert {a.path for a in client.list_artifacts(parent.info.run_id)} >= {
        "comparison.csv", "comparison.md", "static_checks.md", "verdict.md", "acceptance_per_position.png",
        "acceptance_per_request.png", "evidence.json", "prompts.jsonl",
        "throughput.png", "report.html"}
    # the permuted vocabulary is named as the cause: static embedding check + near-zero served acceptance
    assert parent.data.tags["specdiag.verdict"] == "vocab_mismatch"
    # the run page opens on the verdict and the comparison; the experiment opens as ordinary runs; arms by role
    note = parent.data.tags["mlflow.note.content"]
    assert note.startswith("# Verdict: `vocab_mismatch`") and "| smol-permuted | candidate | ok |" in note
    assert client.get_experiment(parent.info.experiment_id).tags["mlflow.experimentKind"] == "custom_model_development"
    laps = {k: parent.data.metrics[f"sys/{k}"] for k in ("startup_s", "setup_s", "offline_s", "arms_s", "finish_s")}
    assert sum(laps.values()) == pytest.approx(parent.data.metrics["sys/diagnosis_wall_s"], rel=1e-6), laps
    assert {r.info.run_name for r in arms.values()} == {"baseline", "candidate: smol-permuted", "control: smol-self"}
    assert [arms[a].data.tags["mlflow.runColor"] for a in ("baseline", "smol-permuted", "smol-self")] == [
        "#7f7f7f", "#d62728", "#2ca02c"]  # MLflow's charts: the baseline grey, candidate red, control green

    # two loads, not three: the control loads its server, the candidate's head is swapped into it (infra/swap.py)
    launches = [ln for ln in done.output.splitlines() if "] launched pid" in ln]
    assert len(launches) == 2, done.output[-3000:]
    assert [("[smol-self]" in ln, "--worker-extension-cls" in ln) for ln in launches] == [(True, True), (False, False)]
    served = {a: r.data.tags["specdiag.served"] for a, r in arms.items()}
    assert served == {"baseline": "fresh load", "smol-self": "fresh load",
                      "smol-permuted": f"swapped into {arms['smol-self'].info.run_id}"}, served
    assert "now, swapped into smol-self's server" in next(ln for ln in done.output.splitlines()
                                                           if ln.split()[:1] == ["smol-permuted"])
    assert 0 < arms["smol-permuted"].data.metrics["sys/swap_s"] < 30
    server_of = {"baseline": "baseline", "smol-self": "smol-self", "smol-permuted": "smol-self"}
    for name, run in arms.items():
        assert run.data.tags["mlflow.parentRunId"] == parent.info.run_id
        assert run.info.status == "FINISHED"
        # a swapped arm's server was loaded, and its host lock taken, by the arm it was swapped into
        loaded = {"sys/swap_s"} if name == "smol-permuted" else {"sys/server_ready_s", "sys/host_lock_wait_s"}
        assert ARM_METRICS - {"sys/host_lock_wait_s"} | loaded <= set(run.data.metrics), name
        assert not {"server_ready_s", "arm_wall_s", "host_lock_wait_s"} & set(run.data.metrics), name
        params = run.data.params
        assert params["engine_version"] == "0.32.0"
        assert params["server_cmd"].split()[-1] != "" and "vllm.entrypoints.openai.api_server" in params["server_cmd"]
        artifacts = {a.path for a in client.list_artifacts(run.info.run_id)}
        assert {f"{server_of[name]}.server.log", "requests.csv", "metrics_before.txt", "metrics_after.txt"} <= artifacts

    base, bad, good = arms["baseline"], arms["smol-permuted"], arms["smol-self"]
    assert base.data.tags["specdiag.drafter"] == "none" and base.data.params["spec_method"] == "none"
    assert "acceptance_rate" not in base.data.metrics
    assert "--speculative-config" not in base.data.params["server_cmd"]
    assert base.data.metrics["speedup_vs_baseline"] == 1.0
    for run in (bad, good):
        assert SPEC_METRICS <= set(run.data.metrics)
        assert run.data.params["spec_method"] == "draft_model" and run.data.params["num_speculative_tokens"] == "4"
        assert "--speculative-config" in run.data.params["server_cmd"]
        assert run.data.metrics["num_draft_tokens"] >= 40
    # read from the vLLM counters: the known-good control accepts nearly everything, the vocab fault nothing
    assert good.data.metrics["acceptance_rate"] > 0.9
    assert bad.data.metrics["acceptance_rate"] < 0.1
    assert good.data.metrics["mean_acceptance_length"] > 4.0
    assert good.data.params["drafter_path"] != bad.data.params["drafter_path"]
    # decisive by default: each drafter arm ended once its numbers settled what the verdict asks of it, before the cap
    # of 15 prompts. The control accepts everything: about 26 drafts put its interval under the 0.15 a control settles
    # to (a broken mid-window counter read would leave the control no way to stop; the tok/s rule does not apply to it)
    for run in (bad, good):
        assert run.data.metrics["sys/early_stopped"] == 1.0 and run.data.metrics["sys/requests_ok"] < 15, run.info
    assert "acceptance" in good.data.tags["specdiag.early_stop"] and good.data.metrics["sys/requests_ok"] < 8
    _baseline_ended_where_its_rule_first_held(done, base)
    # the engine's own log lines agree with the counters
    assert good.data.metrics["sys/log_acceptance_rate"] > 0.9 and bad.data.metrics["sys/log_acceptance_rate"] < 0.1
    # the default host.workdir: the servers' logs stay in the project's runs/<diagnosis id>/, as a user finds them
    from tests.conftest import ROOT
    assert (ROOT / "runs" / parent.info.run_id / "smol-self.server.log").exists()

    _report_through_mlflow_in_chromium(demo_store, done)
    # the verdict recomputed from the MLflow record alone (no server) is the one the flow printed, line for line
    again = subprocess.run([sys.executable, "flows/verdict.py", parent.info.run_id], cwd=ROOT, capture_output=True,
                           text=True, timeout=300, env={**os.environ, "MLFLOW_TRACKING_URI": demo_store})
    assert again.returncode == 0, again.stderr[-2000:]
    printed = done.artifact_text(parent, "verdict.md")
    assert printed in done.output and again.stdout.startswith(printed), (printed, again.stdout)
    assert "recorded `vocab_mismatch`, recomputed `vocab_mismatch`: the same" in again.stdout
    _follow_up_reuses_the_baseline_and_the_control(demo_cli, done)
    # the Prefect flow run points to its MLflow record, and carries the arms' table
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey

    with get_client(sync_client=True) as prefect:
        links = prefect.read_artifacts(artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=["specdiag-mlflow-run"])))
        tables = prefect.read_artifacts(artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=["specdiag-arms"])))
    link = next(a for a in links if parent.info.run_id in str(a.data))
    assert "workflowType=machine_learning" in str(link.data) and tables


def _baseline_ended_where_its_rule_first_held(done, base):
    """On this one host the baseline is measured last, asked the comparisons the verdict will make with it: the
    speedup of each arm whose speed it judges. The permuted candidate's acceptance lies clear below HEALTHY (its
    speed is not judged: its window ended on acceptance, tok/s not asked) and the control's speed is never judged, so
    the baseline has nothing to settle and ends at its first 3 requests. Recomputed here from the candidate's own
    record, and from the runs' start times (a baseline measured first would be asked for its own precision)."""
    from tasks.verdict import HEALTHY, acceptance_interval

    bad, good = done.arms["smol-permuted"], done.arms["smol-self"]
    assert base.info.start_time > max(bad.info.start_time, good.info.start_time)  # last
    assert acceptance_interval(bad.data.metrics)[1] < HEALTHY
    assert "tok/s not judged (acceptance below 0.6)" in bad.data.tags["specdiag.early_stop"]
    assert bad.data.tags["specdiag.asked"].endswith("tok/s to its own precision where its acceptance reaches 0.6")
    assert base.data.tags["specdiag.asked"] == "tok/s: no arm measured before it has its speed judged"
    why = base.data.tags.get("specdiag.early_stop", "to the cap")
    assert base.data.metrics["sys/requests_ok"] == 3 and why.startswith("tok/s not compared"), why


def _report_through_mlflow_in_chromium(mlflow_uri, done):
    """report.html as a user opens it: from a real `mlflow server`, in headless Chromium. The DOM holds the verdict,
    each arm's recorded figures to the digit (and the CLI's table the same), its cause, and the plots inline."""
    import re

    import tempfile
    from pathlib import Path

    from infra.browser import artifact_file, dom, mlflow_server

    with mlflow_server(mlflow_uri) as server, tempfile.TemporaryDirectory() as tmp:
        page = dom(artifact_file(server, done.parent.info.run_id, "report.html", Path(tmp)), timeout_s=180)
    assert re.search(r'id="verdict">vocab_mismatch<', page), page[:2000]
    assert len(re.findall(r'<img alt="[^"]+\.png" src="data:image/png;base64,', page)) >= 2
    for name, run in done.arms.items():
        row = re.search(rf'<tr data-arm="{re.escape(name)}">(.*?)</tr>', page, re.S)[1]
        cells = re.findall(r"<td[^>]*>(.*?)</td>", row, re.S)
        line = next(ln for ln in done.output.splitlines() if ln.split()[:1] == [name] and "ok" in ln.split())
        for column in ("acceptance_rate", "output_tok_s", "speedup_vs_baseline", "stream_tok_s", "ttft_ms_p50"):
            recorded = run.data.metrics.get(column)
            shown = cells[COLUMNS.index(column)]
            assert shown == ("-" if recorded is None else f"{recorded:.3f}"), (name, column, shown, recorded)
            assert recorded is None or f"{recorded:.3f}" in line.split(), (name, column, line)
        if name != "baseline":
            assert run.data.tags["specdiag.arm_verdict"] in row


def _follow_up_reuses_the_baseline_and_the_control(cli, first):
    """A new candidate against the same target, prompts, engine and control: one server load. The baseline and the
    control are the first diagnosis's arms (same fingerprint), linked to them, with their figures, and the verdict
    reads them like fresh ones; the printed table says which arms were measured now."""
    again = cli("--drafter", "smol-noisy")
    assert again.returncode == 0, again.output[-3000:]
    assert set(again.arms) == {"baseline", "smol-noisy", "smol-self"}
    reused = {a: r.data.tags.get("specdiag.reused_from") for a, r in again.arms.items()}
    assert reused == {"baseline": first.arms["baseline"].info.run_id, "smol-self": first.arms["smol-self"].info.run_id,
                      "smol-noisy": None}
    launches = [ln for ln in again.output.splitlines() if "] launched pid" in ln]
    assert len(launches) == 1 and "[smol-noisy] launched pid" in launches[0], launches  # one server load
    for name in ("baseline", "smol-self"):
        old, new = first.arms[name].data, again.arms[name].data
        assert new.metrics["output_tok_s"] == old.metrics["output_tok_s"] and new.params["server_cmd"] == \
            old.params["server_cmd"] and again.arms[name].info.status == "FINISHED"
        assert "requests.csv" in {a.path for a in again.client.list_artifacts(again.arms[name].info.run_id)}
        line = next(ln for ln in again.output.splitlines() if ln.split()[:1] == [name])
        assert "reused" in line, line
    assert "now" in next(ln for ln in again.output.splitlines() if ln.split()[:1] == ["smol-noisy"])
    assert "speedup_paired" in again.arms["smol-noisy"].data.metrics  # paired with the reused baseline's requests
    # reused arms go first (flows/diagnose._in_order): the candidate's window was compared as it ran with the reused
    # baseline's tok/s and the reused control's acceptance
    asked = again.arms["smol-noisy"].data.tags["specdiag.asked"]
    assert "tok/s against the baseline's 3 requests" in asked and "acceptance against the compared arm's [" in asked
    assert "smol-self: acceptance" in again.artifact_text(again.parent, "verdict.md")
    # an under-trained drafter against the known-good control, tuned to land clearly between the permuted fault (~0)
    # and the control (~1): training_quality
    assert 0.2 < again.arms["smol-noisy"].data.metrics["acceptance_rate"] < 0.8
    assert again.parent.data.tags["specdiag.verdict"] == "training_quality"
