"""End-to-end fixtures: real vLLM CPU servers, and proof that none is left behind."""
import subprocess

import pytest


@pytest.fixture
def no_servers_left():
    """After the test: no server this tool launched is alive, and none is left in its registry."""
    yield
    from infra import registry

    leftover = subprocess.run(["pgrep", "-f", "vllm.entrypoints.openai.api_server"], capture_output=True, text=True)
    assert leftover.stdout.strip() == "", f"vLLM server processes left behind: {leftover.stdout}"
    assert registry.launched() == []
