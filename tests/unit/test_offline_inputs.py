"""Where the offline evaluation's target states come from: the target (small), the user's dumps, or nowhere (too
large, no dumps: skipped with one line saying how to supply them). Never a 1T-parameter load."""
import sys

import pytest

from infra.arms import Arm
from infra.cli import overrides, parser
from infra.config import DrafterConfig, HostConfig, load_profile
from infra.tracking import Tracker
from tasks.offline import offline_eval
from tests.fixtures import formats as F


@pytest.fixture(scope="module")
def kimi(tmp_path_factory):
    return F.kimi_k2_full_size(tmp_path_factory.mktemp("kimi"))  # a 2 TB target (index total_size), sparse


def _run(tmp_path, kimi, *flags):
    head, target = kimi
    cfg = load_profile("kimi-k25", overrides(parser().parse_args(list(flags))))
    cfg = cfg.model_copy(update={"host": HostConfig()})
    arm = Arm("custom", "candidate", "custom", DrafterConfig(method="eagle3", model=str(head)))
    tracker = Tracker(f"sqlite:///{tmp_path}/mlflow.db")
    parent = tracker.start(tracker.experiment("t"), "diagnosis", {})
    result = offline_eval.fn(cfg, [arm], str(target), ["hi"], str(tmp_path), tracker, parent, timeout_s=120)
    return result, tracker.client.get_run(parent).data.tags["specdiag.offline_eval"]


def test_a_target_too_large_to_load_is_skipped_with_how_to_supply_dumps(tmp_path, kimi):
    result, tag = _run(tmp_path, kimi)
    assert result.status == tag == "skipped" and not result.metrics
    assert "2000 GB" in result.line() and "--hidden-states" in result.line()


def test_dumps_given_on_the_cli_are_read_instead_of_the_target(tmp_path, kimi):
    """--hidden-states reaches the engine-side script, which looks for the dumps where they are (here: missing)."""
    result, tag = _run(tmp_path, kimi, "--hidden-states", str(tmp_path / "nowhere"),
                       "--set", f"offline.python={sys.executable}")
    assert result.status == tag == "failed"
    assert "offline.hidden_states" in result.note and "no such folder" in result.note
