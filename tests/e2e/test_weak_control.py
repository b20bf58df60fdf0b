"""A control counts as known-good only on evidence (issue 18): the earlier, CPU-trained demo head is a weak control
(about 0.3 at position 0 on the chat prompts, offline and served alike). Beside it, a candidate with a wrong but
self-consistent mapping is not `integration`, and the good head (an extra arm, judged against the same control) is
not `integration` either.

On the EAGLE-3 store with its settings (tests/e2e/conftest.py): the candidate and the baseline were measured by the
EAGLE-3 diagnosis (test_eagle3_integration) and are reused, as a user's next hypothesis reuses them. The weak control
and the good head are measured: the good head was that diagnosis's control, which settles only its acceptance, where
an extra arm's early stop also settles its speed (infra/fingerprint.py tells the two apart)."""
import pytest

pytestmark = pytest.mark.e2e


def test_a_weak_control_never_turns_a_low_candidate_into_integration(eagle3, eagle3_cli, no_servers_left):
    done = eagle3_cli("--drafter", "smol-eagle3-scrambled", "--control", "smol-eagle3-weak", "--arms", "smol-eagle3")
    assert done.returncode == 0, done.output[-3000:]
    reused = {a: r.data.tags.get("specdiag.reused_from") for a, r in done.arms.items()}
    measured_here = {"smol-eagle3-weak", "smol-eagle3"}
    assert reused == {a: None if a in measured_here else eagle3.arms[a].info.run_id for a in reused}, reused
    weak = done.arms["smol-eagle3-weak"].data
    assert weak.metrics["acceptance_rate"] < 0.3 and "offline_acceptance_rate" in weak.metrics  # weak, measured
    assert done.parent.data.tags["specdiag.verdict"] == "vocab_mismatch"
    good = done.arms["smol-eagle3"].data
    assert good.tags["specdiag.arm_verdict"] != "integration"  # healthy, or inconclusive over few drafts
    assert good.metrics["offline_acceptance_rate"] > weak.metrics["offline_acceptance_rate"]
