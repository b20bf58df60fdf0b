"""The SSH executor against a real OpenSSH sshd on 127.0.0.1."""
import os
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from infra.config import JumpHost, SpecdiagError
from infra.executor import LocalExecutor
from infra.ssh import SshExecutor
from tests.ssh.conftest import kill_ssh_sessions


@pytest.fixture
def ex(host):
    e = SshExecutor(host)
    yield e
    e.close()


def test_run_returns_status_and_drains_large_output(ex):
    done = ex.run(["sh", "-c", "head -c 3000000 /dev/zero | od -v | head -c 2500000; echo err >&2; exit 3"], 60)
    assert done.returncode == 3 and len(done.stdout) == 2_500_000 and done.stderr.strip() == "err"


def test_unknown_host_key_is_refused_with_the_fix(host, tmp_path):
    empty = tmp_path / "known_hosts"
    empty.write_text("")
    with pytest.raises(SpecdiagError, match=r"host key of root@127.0.0.1:\d+ is unknown.*ssh-keyscan.*accept_unknown"):
        SshExecutor(host.model_copy(update={"known_hosts": str(empty)})).run(["true"], 10)
    empty.write_text("# ours, kept as written\n")
    opted_in = SshExecutor(host.model_copy(update={"known_hosts": str(empty), "accept_unknown_host_keys": True}))
    assert opted_in.run(["echo", "ok"], 10).stdout.strip() == "ok"
    opted_in.close()
    # trusted for that connection only: known_hosts is never written (OpenSSH would trust the key from then on)
    assert empty.read_text() == "# ours, kept as written\n"


def _connects(host, known_hosts: Path, text: str) -> str:
    """'ok', or the one-line refusal, with known_hosts holding `text`; the file is read, never written."""
    known_hosts.write_text(text)
    try:
        ex = SshExecutor(host.model_copy(update={"known_hosts": str(known_hosts)}))
        try:
            return ex.run(["echo", "ok"], 10).stdout.strip()
        finally:
            ex.close()
    except SpecdiagError as exc:
        assert "\n" not in str(exc), exc
        return str(exc)
    finally:
        assert known_hosts.read_text() == text


def test_every_known_hosts_form_openssh_reads_is_read_or_refused_in_one_line(host, sshd, tmp_path):
    name, keytype, key = Path(sshd["known_hosts"]).read_text().split()[:3]  # [127.0.0.1]:PORT ssh-... KEY
    port = name.rsplit(":", 1)[1]
    other = tmp_path / "other"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(other)], check=True)
    o_type, o_key = other.with_suffix(".pub").read_text().split()[:2]
    known = tmp_path / "known_hosts"
    ca = f"@cert-authority *.example.com {o_type} {o_key}\n"
    assert _connects(host, known, f"# comment\n{ca}\n{name} {keytype} {key} root@box\n") == "ok"  # beside a CA line
    hashed = tmp_path / "hashed"
    hashed.write_text(f"{name} {keytype} {key}\n")
    subprocess.run(["ssh-keygen", "-q", "-H", "-f", str(hashed)], check=True, capture_output=True)
    assert hashed.read_text().startswith("|1|")
    assert _connects(host, known, hashed.read_text()) == "ok"
    assert _connects(host, known, f"[127.0.0.?]:{port},other.example {keytype} {key}\n") == "ok"  # a pattern
    assert "is unknown" in _connects(host, known, f"[127.0.0.*]:{port},![127.0.0.1]:{port} {keytype} {key}\n")
    assert "does not match" in _connects(host, known, f"[127.0.0.*]:{port} {o_type} {o_key}\n")  # another key
    assert "@revoked" in _connects(host, known, f"{name} {keytype} {key}\n@revoked * {keytype} {key}\n")
    assert "@cert-authority" in _connects(host, known, f"@cert-authority [127.0.0.1]:* {o_type} {o_key}\n")
    assert ":2 is not a known_hosts line" in _connects(host, known, f"{name} {keytype} {key}\n@markme x y z\n")
    assert ":1: the key is not base64" in _connects(host, known, f"{name} {keytype} not*base64\n")


def test_wrong_key_is_a_clear_error(host, tmp_path):
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(tmp_path / "other")], check=True)
    with pytest.raises(SpecdiagError, match="login to root@127.0.0.1.* refused"):
        SshExecutor(host.model_copy(update={"key_file": str(tmp_path / "other")})).run(["true"], 10)


def test_hostile_paths_stay_one_argument(ex, tmp_path):
    canary = Path.home() / "specdiag-pwned"  # where an injected `touch` would land (the login directory)
    hostile = tmp_path / "drafter dir; touch specdiag-pwned; echo $(id) `id` & 'q\"'"
    hostile.mkdir()
    (hostile / "config.json").write_text("{}")
    done = ex.run(["ls", str(hostile)], 10)
    assert done.returncode == 0 and done.stdout.strip() == "config.json"
    proc = ex.launch(["cat", str(hostile / "config.json")], {"ODD": "a b;c"}, str(hostile / "out 'x'.log"))
    deadline = time.monotonic() + 10
    while ex.is_alive(proc.pid) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert (hostile / "out 'x'.log").read_text() == "{}"
    assert not canary.exists()


def test_detached_server_survives_a_dropped_connection_and_is_still_stopped(ex, sshd, tmp_path):
    proc = ex.launch([sys.executable, "-c", "import time; time.sleep(300)"], {}, str(tmp_path / "srv.log"))
    assert proc.pgid == proc.pid and ex.is_alive(proc.pid)
    assert kill_ssh_sessions(sshd) >= 1  # the control connection drops
    time.sleep(1)
    os.kill(proc.pid, 0)  # the server still runs on the host
    assert ex.is_alive(proc.pid)  # the executor reconnected
    assert ex.stop_group(proc.pgid) == []
    assert not LocalExecutor().is_alive(proc.pid)  # gone (at most a zombie of this container's init)


def test_port_forward_reaches_a_server_bound_to_the_hosts_loopback(ex, tmp_path):
    with open(tmp_path / "hello.txt", "w") as f:
        f.write("hello through ssh")
    port = 18000 + os.getpid() % 1000
    assert ex.port_free(port)
    proc = ex.launch([sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1", "--directory",
                      str(tmp_path)], {}, str(tmp_path / "http.log"))
    try:
        url = ex.base_url(port)
        assert url != f"http://127.0.0.1:{port}"  # a local port of ours, forwarded
        deadline = time.monotonic() + 15
        while True:
            try:
                assert httpx.get(f"{url}/hello.txt", timeout=5).text == "hello through ssh"
                break
            except httpx.TransportError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.3)
        assert not ex.port_free(port)
    finally:
        ex.stop_group(proc.pgid)


def test_logs_are_read_incrementally_and_fetched_over_sftp(ex, tmp_path):
    log = tmp_path / "remote.log"
    log.write_text("line one\n")
    text, offset = ex.read_from(str(log), 0)
    assert text == "line one\n"
    with open(log, "a") as f:
        f.write("line two\n")
    assert ex.read_from(str(log), offset) == ("line two\n", offset + 9)
    assert ex.read_tail(str(log), 9) == "line two\n"
    assert ex.read_tail(str(tmp_path / "missing.log")) == ""
    got = ex.fetch(str(log), tmp_path / "local" / "copy.log")
    assert got.read_text() == "line one\nline two\n"


def test_through_a_jump_host(host):
    via = SshExecutor(host.model_copy(update={"jump": JumpHost(address="127.0.0.1", port=host.port,
                                                               key_file=host.key_file)}))
    assert via.run(["echo", "hop"], 10).stdout.strip() == "hop"
    via.close()


def test_static_checks_read_a_remote_eagle3_head_over_sftp(host, tmp_path):
    """A ModelOpt head for a Kimi-K2.5-shaped target, both on the GPU host, checked without copying them: config,
    headers, d2t and sampled lm_head / target rows read over SFTP."""
    from tasks.inspect import inspect_drafter
    from tests.fixtures import formats as F

    target = F.write_target(tmp_path / "kimi target", F.KIMI_K25, prefix="language_model.model.", sharded=True)
    good = F.modelopt_kimi(tmp_path / "good head", F.KIMI_K25)
    bad = F.modelopt_kimi(tmp_path / "bad head", F.KIMI_K25, fault="scrambled")
    ex = SshExecutor(host)
    try:
        ok = inspect_drafter.fn(str(good), None, str(target), fs=ex)
        assert not [f for f in ok if f.severity == "error"] and {"d2t", "mapping_agreement"} <= {f.code for f in ok}
        flagged = inspect_drafter.fn(str(bad), None, str(target), str(good), fs=ex)
        assert "d2t_scrambled" in {f.code for f in flagged if f.severity == "error"}
        assert any(f.code == "mapping_overlap" for f in flagged)
        assert ex.glob(f"{good}/*.safetensors") == [f"{good}/model.safetensors"]
    finally:
        ex.close()


def test_a_logs_size_is_read_without_reading_the_log(ex, tmp_path):
    """A scrape marks where the server log stands by its size (SFTP stat), not by downloading it (tasks/scrape.py):
    a 1T target's log grows to megabytes over a diagnosis, read at every scrape before."""
    log = tmp_path / "server.log"
    log.write_bytes(b"x" * 3_000_000)
    assert ex.size(str(log)) == 3_000_000 == LocalExecutor().size(str(log))
    assert ex.size(str(tmp_path / "missing.log")) == 0 == LocalExecutor().size(str(tmp_path / "missing.log"))
