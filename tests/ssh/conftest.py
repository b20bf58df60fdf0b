"""A real OpenSSH sshd on 127.0.0.1 with generated keys: the "remote" GPU host is this machine."""
import os
import subprocess
from pathlib import Path

import pytest

from infra.config import HostConfig
from infra.stack import SSHD, loopback_sshd


@pytest.fixture(scope="session")
def sshd(tmp_path_factory):
    if not Path(SSHD).exists() or os.geteuid() != 0:
        pytest.skip("needs root and OpenSSH sshd (apt-get install openssh-server; .ci/run installs it)")
    with loopback_sshd(tmp_path_factory.mktemp("sshd")) as found:
        yield found


@pytest.fixture
def host(sshd) -> HostConfig:
    return HostConfig(name="sshbox", kind="ssh", address="127.0.0.1", port=sshd["port"], user="root",
                      key_file=sshd["key"], known_hosts=sshd["known_hosts"], connect_timeout_s=10)


def kill_ssh_sessions(sshd) -> int:
    """Drop every SSH connection to the test sshd (its per-connection children), as a network failure would."""
    out = subprocess.run(["pgrep", "-P", str(sshd["proc"].pid)], capture_output=True, text=True).stdout.split()
    for pid in out:
        try:
            os.kill(int(pid), 9)
        except ProcessLookupError:
            pass
    return len(out)
