"""End-to-end fixtures: real vLLM CPU servers, and proof that none is left behind."""
import subprocess

import pytest

from tests.conftest import diagnose


@pytest.fixture
def no_servers_left():
    """After the test: no server this tool launched is alive, and none is left in its registry."""
    yield
    from infra import registry

    leftover = subprocess.run(["pgrep", "-f", "vllm.entrypoints.openai.api_server"], capture_output=True, text=True)
    assert leftover.stdout.strip() == "", f"vLLM server processes left behind: {leftover.stdout}"
    assert registry.launched() == []


# The EAGLE-3 diagnoses' settings: the default chat prompts, decisive by default, with answers of 64 tokens: the control
# settles narrow enough within the 15 prompts that a candidate as good as it is called so, while the faulty heads stop
# after a few requests. Every diagnosis on the EAGLE-3 store uses them, so each reuses what an earlier one measured (the
# baseline, the heads).
EAGLE3_BENCH = ("--max-tokens", "64")


@pytest.fixture(scope="session")
def eagle3_store(tmp_path_factory) -> str:
    """One MLflow store for the diagnoses of the demo's EAGLE-3 heads (test_eagle3_integration, test_weak_control)."""
    return f"sqlite:///{tmp_path_factory.mktemp('eagle3-store')}/mlflow.db"


@pytest.fixture
def eagle3_cli(prefect_server, eagle3_store):
    """`python flows/diagnose.py ARGS --max-tokens 64` on the EAGLE-3 store: an arm measured there before with
    the same head is reused."""
    return lambda *args, **kw: diagnose(eagle3_store, *args, *EAGLE3_BENCH, **kw)


@pytest.fixture(scope="session")
def eagle3(prefect_server, eagle3_store):
    """The seed's central suspect, run once per test session: the trained head behind a faulty engine patch, against
    the same head on the unpatched engine, with the scrambled-d2t head as an extra arm (four server loads)."""
    return diagnose(eagle3_store, "--drafter", "smol-eagle3-badpatch", "--control", "smol-eagle3", "--arms",
                    "smol-eagle3-scrambled", *EAGLE3_BENCH)
