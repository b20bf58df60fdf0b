"""SSH faults against a real OpenSSH sshd on 127.0.0.1: a command past its timeout, an unreachable host."""
import subprocess
import time

import pytest

from infra.ssh import SshExecutor


def _alive(pattern: str) -> str:
    return subprocess.run(["pgrep", "-f", pattern], capture_output=True, text=True).stdout.strip()


def test_a_command_past_its_timeout_is_stopped_on_the_host_with_its_children(host):
    """The remote command and what it started are gone when the timeout is raised, not left running there."""
    ex = SshExecutor(host)
    try:
        start = time.monotonic()
        with pytest.raises(subprocess.TimeoutExpired):
            ex.run(["sh", "-c", "sleep 41.5 & sleep 42.5; true"], 1.5)
        assert time.monotonic() - start < 10
        assert _alive("sleep 4[12].5") == ""
        done = ex.run(["sh", "-c", "echo out; echo err >&2; exit 4"], 10)  # the wrapper is invisible
        assert (done.returncode, done.stdout, done.stderr) == (4, "out\n", "err\n")
    finally:
        ex.close()
