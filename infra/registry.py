"""Servers this tool launched on this machine, so a later cleanup can stop stale ones and only those."""
from __future__ import annotations

import json
import os
import time

from infra import secrets
from infra.embedded import cache_dir


def _dir():
    path = cache_dir() / "servers"
    path.mkdir(parents=True, exist_ok=True)
    return path


def remember(pid: int, pgid: int, arm: str, host: str, command: str, port: int | None = None) -> None:
    (_dir() / f"{host}-{pid}.json").write_text(json.dumps(
        {"pid": pid, "pgid": pgid, "arm": arm, "host": host, "command": secrets.redact(command), "started": time.time(),
         "owner_pid": os.getpid(), "port": port}))


def forget(pid: int, host: str = "local") -> None:
    (_dir() / f"{host}-{pid}.json").unlink(missing_ok=True)


def launched(host: str = "local") -> list[dict]:
    """This host's entries, by the host name recorded in each (the file name's prefix alone would give host "gpu"
    the entries of "gpu-box")."""
    out = []
    for f in sorted(_dir().glob(f"{host}-*.json")):
        try:
            entry = json.loads(f.read_text())
        except (json.JSONDecodeError, OSError):
            f.unlink(missing_ok=True)
            continue
        if entry.get("host") == host:
            out.append(entry)
    return out


def owner_alive(entry: dict) -> bool:
    """A server is stale once the specdiag process that launched it is gone (crashed, killed, Ctrl-C)."""
    try:
        os.kill(entry.get("owner_pid", -1), 0)
    except (ProcessLookupError, OverflowError):
        return False
    except PermissionError:
        return True
    return True
