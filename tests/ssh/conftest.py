"""A real OpenSSH sshd on 127.0.0.1 with generated keys: the "remote" GPU host is this machine."""
import os
import socket
import subprocess
import time
from pathlib import Path

import pytest

from infra.config import HostConfig

SSHD = "/usr/sbin/sshd"


def _free_port() -> int:
    with socket.socket() as s:  # sshd refuses port 0: pick one first
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _keygen(path: Path) -> str:
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(path)], check=True)
    return path.with_suffix(".pub").read_text().strip()


@pytest.fixture(scope="session")
def sshd(tmp_path_factory):
    if not Path(SSHD).exists() or os.geteuid() != 0:
        pytest.skip("needs root and OpenSSH sshd (apt-get install openssh-server; .ci/run installs it)")
    d = tmp_path_factory.mktemp("sshd")
    host_pub = _keygen(d / "host_key")
    (d / "authorized_keys").write_text(_keygen(d / "client_key") + "\n")
    port = _free_port()
    Path("/run/sshd").mkdir(exist_ok=True)  # sshd's privilege-separation directory
    proc = subprocess.Popen(
        [SSHD, "-D", "-e", "-f", "/dev/null", "-o", f"Port={port}", "-o", "ListenAddress=127.0.0.1",
         "-o", f"HostKey={d / 'host_key'}", "-o", f"AuthorizedKeysFile={d / 'authorized_keys'}",
         "-o", "StrictModes=no", "-o", "PermitRootLogin=yes", "-o", "PidFile=none", "-o", "UsePAM=no",
         "-o", "Subsystem=sftp internal-sftp", "-o", "MaxSessions=64", "-o", "MaxStartups=64"],
        stderr=open(d / "sshd.log", "w"))
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            break
        except OSError:
            time.sleep(0.1)
    else:
        proc.kill()
        pytest.fail(f"sshd did not start: {(d / 'sshd.log').read_text()}")
    known = d / "known_hosts"
    known.write_text(f"[127.0.0.1]:{port} {host_pub}\n")
    yield {"port": port, "dir": d, "known_hosts": str(known), "key": str(d / "client_key"), "proc": proc}
    proc.terminate()
    proc.wait(10)


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
