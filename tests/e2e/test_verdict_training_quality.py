"""An under-trained drafter (smol-noisy) against the known-good control (smol-self) -> training_quality, measured
with early stop on: each arm ends once the real counters, read mid-window, say enough."""
import pytest

pytestmark = pytest.mark.e2e


def test_noisy_drafter_is_named_training_quality(cli, no_servers_left):
    done = cli("--drafter", "smol-noisy", "--control", "smol-self", "--early-stop", "--prompts", "9")
    assert done.returncode == 0, done.output[-3000:]
    noisy, control = done.arms["smol-noisy"].data, done.arms["smol-self"].data
    # tuned to land clearly between the permuted fault (~0) and the control (~1)
    assert 0.2 < noisy.metrics["acceptance_rate"] < 0.8
    assert control.metrics["acceptance_rate"] > 0.9
    assert done.parent.data.tags["specdiag.verdict"] == "training_quality"
    # the control accepts everything: 30 drafts put its interval clear of the verdict's thresholds, well before
    # the 8-request cap (a broken mid-window counter read would leave only the tok/s rule, without "acceptance")
    assert control.metrics["sys/requests_ok"] < 8 and control.metrics["sys/early_stopped"] == 1.0
    assert "acceptance" in control.tags["specdiag.early_stop"]
