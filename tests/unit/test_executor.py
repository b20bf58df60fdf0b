import os
import socket
import time

from infra.executor import LocalExecutor, shell_command


def test_launch_records_command_and_stop_group_kills_children(tmp_path):
    ex = LocalExecutor()
    log = tmp_path / "x.log"
    # a parent that forks a child which ignores SIGTERM: both must be gone after stop_group
    script = "trap '' TERM; (trap '' TERM; sleep 300) & echo started; sleep 300"
    proc = ex.launch(["bash", "-c", script], {"A": "b c"}, str(log))
    assert proc.command.startswith("A='b c' bash -c ")
    for _ in range(50):
        if len(ex.group_pids(proc.pgid)) >= 2:
            break
        time.sleep(0.1)
    assert ex.is_alive(proc.pid) and len(ex.group_pids(proc.pgid)) >= 2
    assert ex.stop_group(proc.pgid, grace_s=0.5) == []
    assert ex.group_pids(proc.pgid) == [] and not ex.is_alive(proc.pid)
    assert "started" in ex.read_tail(str(log))


def test_read_from_offsets(tmp_path):
    f = tmp_path / "log"
    f.write_text("one\n")
    ex = LocalExecutor()
    text, off = ex.read_from(str(f), 0)
    with open(f, "a") as fh:
        fh.write("two\n")
    assert text == "one\n" and ex.read_from(str(f), off) == ("two\n", 8)
    assert ex.read_from(str(tmp_path / "missing"), 0) == ("", 0)


def test_port_free():
    ex = LocalExecutor()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        assert not ex.port_free(s.getsockname()[1])


def test_shell_command_quotes():
    assert shell_command(["echo", "a b;c"], {}) == "echo 'a b;c'"
    assert os.path.basename(shell_command(["x"], {"K": "v"})) == "K=v x"


def test_local_fetch_and_put_onto_the_same_path_are_no_ops(tmp_path):
    """With the default host.workdir the host's run folder is this machine's copy: the report is read where it is."""
    ex = LocalExecutor()
    report = tmp_path / "runs" / "abc" / "offline_eval.json"
    report.parent.mkdir(parents=True)
    report.write_text('{"arms": {}}')
    assert ex.fetch(str(report), tmp_path / "runs" / "abc" / ".." / "abc" / "offline_eval.json").read_text() \
        == '{"arms": {}}'
    assert ex.put(report, str(report)) == str(report) and report.read_text() == '{"arms": {}}'
    copy = ex.fetch(str(report), tmp_path / "elsewhere" / "r.json")  # a real copy still copies
    assert copy.read_text() == '{"arms": {}}' and copy != report
