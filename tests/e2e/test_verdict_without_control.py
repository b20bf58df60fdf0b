"""Short diagnoses without a control: a config that silently does nothing, a drafter that costs more than it saves,
a checkpoint stopped before its load."""
import re

import pytest

from tests.conftest import diagnose

pytestmark = pytest.mark.e2e


def _prefect_servers() -> list[str]:
    import subprocess

    found = subprocess.run(["pgrep", "-f", "prefect.server.api.server:create_app"], capture_output=True, text=True)
    return found.stdout.split()


@pytest.fixture(scope="module")
def defaults_store(demo, demo_store) -> str:
    """The diagnoses below keep the benchmark's defaults: on the demo's store, each reuses the baseline the session's
    demo diagnosis measured (one server load fewer each), as a user's next diagnosis does."""
    return demo_store


def test_drafter_that_never_drafts_is_named_spec_disabled(prefect_server, defaults_store, no_servers_left):
    before = _prefect_servers()
    # as on a fresh machine: no Prefect server configured, the program boots Prefect's temporary server as its first
    # act (beside its imports and input checks) and stops it at the end
    done = diagnose(defaults_store, "--drafter", "ngram-never", "--no-control", prefect_api=False)
    assert done.returncode == 0, done.output[-3000:]
    assert _prefect_servers() == before and "sys/startup_s" in done.parent.data.metrics
    cand = done.arms["ngram-never"].data
    assert "specdiag.reused_from" in done.arms["baseline"].data.tags  # the demo's, not loaded again
    assert cand.metrics["num_drafts"] == 0 and cand.metrics["sys/output_tokens"] > 0
    assert done.parent.data.tags["specdiag.verdict"] == "spec_disabled"


def test_self_drafting_is_draft_overhead_and_a_short_context_drafter_is_context_limit(cli, no_servers_left, tmp_path):
    """One diagnosis, three servers, on a user's JSONL alternating chat questions (~40 tokens) and long reading
    prompts (300-500 tokens):
    - smol-self, the candidate: every draft accepted, yet no faster than no speculation (0.97x on one CPU, 1.08x
      predicted on another): it costs about a baseline step per draft token. Acceptance is not the user's question.
    - smol-self-short, an extra arm: the same model declaring 128 positions. Its drafts are accepted before position
      128 and rejected after it: context_limit, from the static check and acceptance by position in the sequence."""
    from tests.conftest import ROOT

    chat, long = (ROOT / "infra/prompts/chat.jsonl").read_text().splitlines(), \
        (ROOT / "infra/prompts/long.jsonl").read_text().splitlines()
    (tmp_path / "mixed.jsonl").write_text("\n".join(x for pair in zip(chat[:5], long[:5]) for x in pair) + "\n")
    done = cli("--drafter", "smol-self", "--no-control", "--arms", "smol-self-short", "--prompt-set",
               str(tmp_path / "mixed.jsonl"), "--prompts", "8", "--max-tokens", "64", "--confirm")
    assert done.returncode == 0, done.output[-3000:]
    m = done.arms["smol-self"].data.metrics
    assert m["acceptance_rate"] > 0.9 and m["tokens_per_step"] > 4.5
    assert m["draft_cost"] > 0.3 and {f"predicted_speedup_k{k}" for k in (1, 2, 3, 4)} <= set(m)
    # each request's own counts (--per-request-spec-decode-metrics) add up to the server's counters
    assert m["spec_requests"] == m["sys/requests_ok"] >= 3
    assert m["acceptance_rate_req"] == pytest.approx(m["acceptance_rate"], abs=0.02)
    assert done.parent.data.tags["specdiag.verdict"] == "draft_overhead"
    verdict = done.artifact_text(done.parent, "verdict.md")  # written again by --confirm
    assert "tokens per step at k=4" in verdict and "the measured speedup is" in verdict
    # what to do next hangs on the host: a smaller k predicted to gain 1.1x or more, k=4 already the best k (the
    # drafter's cost holds it back), or none pays off; never in contradiction with the speed model's line
    advice = verdict.split("Next:")[1]
    paying = re.search(r"serve it with k=([123]) \(predicted (\d+\.\d+)x\)", advice)
    served = re.search(r"k=4 as served is already the best k \(predicted (\d+\.\d+)x\)", advice)
    assert "no k pays off" in advice or (paying and float(paying[2]) >= 1.1) or (served and float(served[1]) >= 1.1), \
        advice
    speed = next(ln for ln in verdict.splitlines() if ln.startswith("- smol-self: ") and "tokens per step" in ln)
    best = re.search(r"best k (\d) \((\d+\.\d+)x\)", speed)
    assert not (best and float(best[2]) >= 1.1 and "none predicted" in advice), (speed, advice)
    # --confirm serves the recommended k as one more arm and judges its paired speedup against the candidate's
    confirmed = done.parent.data.tags["specdiag.confirmed"]
    if paying:
        fix = done.arms[f"smol-self@fix-k={paying[1]}"]
        assert fix.data.tags["specdiag.role"] == "confirm" and fix.data.params["num_speculative_tokens"] == paying[1]
        assert confirmed in ("confirmed", "not confirmed") and f"--confirm: `{confirmed}`: smol-self@fix-k=" in verdict
    else:
        assert confirmed == "not run" and "--confirm: no fix that one more arm can apply" in verdict
    short = done.arms["smol-self-short"].data
    assert short.tags["specdiag.arm_verdict"] == "context_limit"
    before = short.metrics["seqpos_0_accepted"] / short.metrics["seqpos_0_drafted"]
    after = short.metrics["seqpos_256_accepted"] / short.metrics["seqpos_256_drafted"]
    assert before > 0.9 and after < 0.1, (before, after)
    assert "position_limit" in done.artifact_text(done.parent, "static_checks.md")
    # its window ended early only once acceptance before and past position 128 were settled (here: 6 of 8 requests,
    # [0.91-1] against [0-0.02], apart), never on its acceptance as a whole alone
    stopped = short.tags.get("specdiag.early_stop")
    assert ("past it [" in stopped) if stopped else short.metrics["sys/requests_ok"] == 8, stopped


def test_a_checkpoint_the_engine_cannot_map_is_stopped_before_its_load(prefect_server, defaults_store,
                                                                      no_servers_left):
    """The demo head with its d2t dropped (draft vocab 4096 < 49152): the engine would read draft id i as target id
    i. The static check gates the arm: no server is started for it, the diagnosis goes on with its other arms, the
    verdict cites it. With the benchmark's defaults on the demo's store, its baseline is the one measured there."""
    done = diagnose(defaults_store, "--drafter", "smol-eagle3-nod2t", "--no-control")
    assert done.returncode == 1  # an arm failed
    assert "[smol-eagle3-nod2t] launched pid" not in done.output
    cand, base = done.arms["smol-eagle3-nod2t"], done.arms["baseline"]
    assert base.info.status == "FINISHED" and cand.info.status == "FAILED"
    assert cand.data.tags["specdiag.error"].startswith("StaticCheckFailed: d2t_missing")
    assert cand.data.params["server_cmd"] == "not launched" and "sys/server_ready_s" not in cand.data.metrics
    assert done.parent.data.tags["specdiag.verdict"] == "vocab_mismatch"
    assert "d2t_missing" in done.artifact_text(done.parent, "verdict.md")
    # --rerun repeats it exactly: the recorded profile and prompt texts, every arm measured again (none reused, the
    # baseline served anew), the candidate stopped before its load again
    again = diagnose(defaults_store, "--rerun", done.parent.info.run_id)
    assert again.returncode == 1 and again.parent.info.run_id != done.parent.info.run_id, again.output[-3000:]
    assert again.artifact_text(again.parent, "prompts.jsonl") == done.artifact_text(done.parent, "prompts.jsonl")
    launches = [ln for ln in again.output.splitlines() if "] launched pid" in ln]
    assert len(launches) == 1 and "[baseline] launched pid" in launches[0], launches
    for name in ("baseline", "smol-eagle3-nod2t"):
        new, old = again.arms[name].data, done.arms[name].data
        assert new.params["server_cmd"] == old.params["server_cmd"] and "specdiag.reused_from" not in new.tags
        assert new.params.get("bench_endpoint") == old.params.get("bench_endpoint")
    assert again.parent.data.tags["specdiag.verdict"] == "vocab_mismatch"
