"""SSH faults against a real OpenSSH sshd on 127.0.0.1: a command past its timeout, an unreachable host, a missing
remote checkpoint and a busy remote port (the last three found before Prefect or any server starts)."""
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from infra.config import SpecdiagError
from infra.ssh import SshExecutor
from tests.conftest import ROOT
from tests.ssh.test_ssh_diagnosis import ssh_profile


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


def _cli(profile: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "flows/diagnose.py", "--profile", profile, "--host", "sshbox",
                           "--drafter", "ngram", "--no-control", *args], cwd=ROOT, text=True, capture_output=True,
                          timeout=300, env={**os.environ, "MLFLOW_TRACKING_URI": f"sqlite:///{Path(profile).parent}/m.db"})


def test_an_unreachable_host_is_one_line_before_prefect_starts(sshd, tmp_path):
    profile = yaml.safe_load(Path(ssh_profile(sshd, tmp_path)).read_text())
    with socket.socket() as s:  # a port nothing listens on: the host does not answer there
        s.bind(("127.0.0.1", 0))
        profile["hosts"]["sshbox"]["port"] = s.getsockname()[1]
    (tmp_path / "down.yaml").write_text(yaml.safe_dump(profile))
    done = _cli(str(tmp_path / "down.yaml"))
    assert done.returncode == 2, done.stderr[-2000:]
    assert done.stderr.strip().splitlines()[-1].startswith("specdiag: error: cannot reach root@127.0.0.1:")
    assert "Traceback" not in done.stderr and "Beginning flow run" not in done.stdout + done.stderr


def test_a_missing_remote_checkpoint_or_a_busy_remote_port_is_found_before_any_server(sshd, tmp_path):
    from flows.diagnose import prepare

    profile = ssh_profile(sshd, tmp_path)
    gone = ["host=sshbox", f"drafters.x={{method: eagle3, model: {tmp_path}/no-such-head}}", "drafter=x"]
    with pytest.raises(SpecdiagError, match=r"drafter 'x' path .*no-such-head does not exist on host sshbox"):
        prepare(profile, {"control": None}, gone)
    with socket.socket() as s:  # something that is not ours holds the port on the host
        s.bind(("127.0.0.1", 0))
        s.listen()
        busy = ["host=sshbox", "drafter=ngram", "control=null", f"target.port={s.getsockname()[1]}"]
        with pytest.raises(SpecdiagError, match=r"port \d+ is already in use on host sshbox by a program"):
            prepare(profile, None, busy)
