"""A server that dies at start, on the real vLLM CPU engine: every arm fails fast with the engine's own reason in
its run, the diagnosis still ends with a verdict, and nothing is left running."""
import pytest

pytestmark = pytest.mark.e2e


def test_a_server_that_dies_at_start_fails_its_arm_with_the_engines_reason(cli, no_servers_left):
    # a context longer than SmolLM2's 8192 positions: vLLM refuses it while it starts, after the load began
    done = cli("--drafter", "ngram", "--no-control", "--prompts", "2", "--max-tokens", "8",
               "--set", 'target.args=["--max-model-len", "65536", "--enforce-eager", "--max-num-seqs", "8"]')
    assert done.returncode == 1, done.output[-3000:]
    assert {a: r.info.status for a, r in done.arms.items()} == {"baseline": "FAILED", "ngram": "FAILED"}
    for name, run in done.arms.items():
        error = run.data.tags["specdiag.error"]
        assert error.startswith("ServerDied"), error
        assert "max_model_len" in done.artifact_text(run, "error.txt")  # the engine's reason, from its log
        assert {f"{name}.server.log", "error.txt"} <= {a.path for a in done.client.list_artifacts(run.info.run_id)}
        assert run.data.metrics["sys/arm_wall_s"] < 120
        assert f"arm {name} FAILED: ServerDied" in done.output
    assert done.parent.info.status == "FINISHED"
    assert done.parent.data.tags["specdiag.verdict"] == "inconclusive"
