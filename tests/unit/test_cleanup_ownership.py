"""Cleanup stops a dead run's server only while its process group is still that server: a PID the system has
given to another program since is left alone (real processes, real /proc and ps)."""
import json
import os
import sys
import time
from pathlib import Path

from infra import registry
from infra.config import HostConfig
from infra.executor import LocalExecutor
from tasks.cleanup import cleanup, still_ours


def _entry(proc, started, arm="a", shm_before=None):
    return {"pid": proc.pid, "pgid": proc.pgid, "arm": arm, "host": "local", "command": proc.command,
            "started": started, "owner_pid": 2 ** 22 + 7, "shm_before": shm_before}  # an owner that is gone


def test_a_recycled_process_group_is_left_alone_and_the_server_still_ours_is_stopped(tmp_path, monkeypatch):
    from infra import shm

    monkeypatch.setattr(registry, "_dir", lambda: tmp_path)
    ex = LocalExecutor()
    # another program's semaphore, unmapped for now, older than the dead server: not its to remove
    older, newer = (Path("/dev/shm") / f"sem.mp-specdiag-{w}-{os.getpid()}" for w in ("older", "newer"))
    older.touch()
    before = sorted(shm.listing(ex))
    newer.touch()  # what the dead server left
    other = ex.launch(["sleep", "300"], {}, str(tmp_path / "other.log"))  # someone else's program, started now
    server = ex.launch([sys.executable, "-c", "import time; time.sleep(300)", "vllm.entrypoints.openai.api_server"],
                       {}, str(tmp_path / "server.log"))
    try:
        time.sleep(0.5)
        recycled = _entry(other, time.time() - 3600, "old-arm")  # the record is an hour old, the process is not
        assert not still_ours(ex, recycled)
        assert still_ours(ex, _entry(server, time.time()))
        for e in (recycled, _entry(server, time.time(), "b", before)):  # as remember() writes them, by a run now dead
            (tmp_path / f"local-{e['pid']}.json").write_text(json.dumps(e))
        out = cleanup.fn(ex, HostConfig())
        assert out["stale_servers_stopped"] == 1
        assert older.exists() and not newer.exists() and out["shm_files_removed"] >= 1
        assert ex.is_alive(other.pid) and not ex.group_pids(server.pgid)
        assert registry.launched() == []
    finally:
        for p in (other, server):
            ex.stop_group(p.pgid, grace_s=1)
        older.unlink(missing_ok=True)
        newer.unlink(missing_ok=True)


def test_shm_leftovers_stay_while_another_server_runs_on_the_machine(tmp_path):
    """Two servers on one machine (two hosts that are one box, disjoint GPU sets): a teardown must not remove the
    other server's fresh semaphore, which nothing maps or opens until its engine process unpickles it."""
    import subprocess

    from infra import shm

    ex, name = LocalExecutor(), f"sem.mp-specdiag-test-{os.getpid()}"
    path = Path("/dev/shm") / name
    try:
        path.touch()
        other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)",
                                  "vllm.entrypoints.openai.api_server"])  # what the check looks for
        try:
            time.sleep(0.3)
            assert shm.remove_unused(ex, {name}) == [] and path.exists()
        finally:
            other.kill()
            other.wait()
        assert shm.remove_unused(ex, {name}) == [name] and not path.exists()  # alone: removed as before
    finally:
        path.unlink(missing_ok=True)
