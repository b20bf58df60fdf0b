"""Servers this tool launched on this machine, so a later cleanup can stop stale ones and only those."""
from __future__ import annotations

import json
import os
import socket
import tempfile
import time
from pathlib import Path

from infra import secrets
from infra.embedded import cache_dir


def _dir():
    path = cache_dir() / "servers"
    path.mkdir(parents=True, exist_ok=True)
    return path


def write_atomic(path: Path, text: str) -> None:
    """A record appears whole or not at all (temp file in the same folder, then rename): a reader never meets half."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _boot_id() -> str:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return ""


def _started(pid: int) -> str:
    """The process's start time since boot, in clock ticks (/proc/PID/stat field 22): a PID reused later differs."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return ""


def owner() -> dict:
    """Who holds a record: this process, by PID, machine, boot and start time (ownership by a bare PID is fooled by a
    reboot, a container restart or a shared home directory)."""
    return {"owner_pid": os.getpid(), "machine": socket.gethostname(), "boot_id": _boot_id(),
            "owner_started": _started(os.getpid())}


def owner_tag(owner: dict) -> str:
    """An owner() as one string (a run's tag, in MLflow and in Prefect); owner_of reads it back."""
    return f"specdiag-owner:{owner['machine']}:{owner['boot_id']}:{owner['owner_pid']}:{owner['owner_started']}"


def owner_of(tag: str | None) -> dict | None:
    """The owner() that owner_tag wrote; None for anything else."""
    parts = (tag or "").split(":")
    if len(parts) != 5 or parts[0] != "specdiag-owner" or not parts[3].isdigit():
        return None
    return {"machine": parts[1], "boot_id": parts[2], "owner_pid": int(parts[3]), "owner_started": parts[4]}


def remember(pid: int, pgid: int, arm: str, host: str, command: str, port: int | None = None,
             shm_before: list[str] | None = None) -> None:
    """shm_before: the host's /dev/shm names before the server started: a cleanup after its owner died removes only
    what appeared since (tasks/cleanup.py), never another program's."""
    write_atomic(_dir() / f"{host}-{pid}.json", json.dumps(
        {"pid": pid, "pgid": pgid, "arm": arm, "host": host, "command": secrets.redact(command),
         "started": time.time(), "port": port, "shm_before": shm_before, **owner()}))


def forget(pid: int, host: str = "local") -> None:
    (_dir() / f"{host}-{pid}.json").unlink(missing_ok=True)


def launched(host: str = "local") -> list[dict]:
    """This host's entries, by the host name recorded in each (the file name's prefix alone would give host "gpu"
    the entries of "gpu-box"). A record that cannot be read is skipped and kept (it may name a live server)."""
    out = []
    for f in sorted(_dir().glob(f"{host}-*.json")):
        try:
            entry = json.loads(f.read_text())
        except (json.JSONDecodeError, OSError) as exc:
            print(f"skipping unreadable server record {f}: {exc}")
            continue
        if entry.get("host") == host:
            out.append(entry)
    return out


def owner_alive(entry: dict) -> bool:
    """Whether the specdiag process that wrote a record still runs. A record of another machine (a shared home
    directory) is not ours to judge: taken as alive. After a reboot it is dead; a live PID with another start time
    is another process that reused it. Records written before these fields were kept are judged by PID alone."""
    if entry.get("machine", socket.gethostname()) != socket.gethostname():
        return True
    if entry.get("boot_id") and entry["boot_id"] != _boot_id():
        return False
    pid = entry.get("owner_pid", -1)
    try:
        os.kill(pid, 0)
    except (ProcessLookupError, OverflowError, TypeError):
        return False
    except PermissionError:
        pass
    return not entry.get("owner_started") or entry["owner_started"] == _started(pid)
