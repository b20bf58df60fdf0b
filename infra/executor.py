"""Where commands run. One small protocol; LocalExecutor now, an SSH executor behind the same calls later."""
from __future__ import annotations

import glob as globmod
import os
import shlex
import shutil
import signal
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from infra import secrets


@dataclass(frozen=True)
class Completed:
    returncode: int
    stdout: str
    stderr: str


class Cancelled(RuntimeError):
    """A command stopped, its process group and all, because its caller ended (Ctrl-C, a cancellation)."""


@dataclass(frozen=True)
class Launched:
    pid: int
    pgid: int
    log_path: str
    command: str  # the exact command, env prefix included, as a shell would take it


class Executor(Protocol):
    host: str

    def run(self, argv: list[str], timeout_s: float, cancel=None) -> Completed: ...  # cancel: a threading.Event
    def which(self, program: str) -> str | None: ...
    def launch(self, argv: list[str], env: dict[str, str], log_path: str) -> Launched: ...
    def is_alive(self, pid: int) -> bool: ...
    def group_pids(self, pgid: int) -> list[int]: ...
    def stop_group(self, pgid: int, grace_s: float = 15.0) -> list[int]:
        """SIGTERM the group, SIGKILL what is left after grace_s; return the PIDs still alive (none)."""
        def send(sig: str) -> bool:
            try:
                os.killpg(pgid, getattr(signal, f"SIG{sig}"))
            except ProcessLookupError:
                pass
            return False

        def gone() -> bool:
            self.is_alive(pgid)  # reaps the leader when it is our child
            return not self.group_pids(pgid)
        return [] if escalate(send, gone, grace_s, 0.2) else self.group_pids(pgid)

    def stop_pid(self, pid: int, grace_s: float = 15.0) -> bool:
        """Stop one process that is not ours to stop as a group; True once it is gone."""
        def send(sig: str) -> bool:
            try:
                os.kill(pid, getattr(signal, f"SIG{sig}"))
            except ProcessLookupError:
                return True
            return False
        return escalate(send, lambda: not self.is_alive(pid), grace_s, 0.2)

    def pgid_of(self, pid: int) -> int | None: ...
    def read_tail(self, path: str, max_bytes: int = 16_384) -> str: ...
    def read_from(self, path: str, offset: int) -> tuple[str, int]: ...
    def size(self, path: str) -> int: ...  # bytes; 0 where the file is missing
    def fetch(self, path: str, dest: Path) -> Path: ...
    def put(self, local: Path, path: str) -> str: ...
    def read_bytes(self, path: str) -> bytes: ...
    def glob(self, pattern: str) -> list[str]: ...  # wildcards in the last component only
    def open(self, path: str): ...  # a binary file object (seek/read)
    def port_free(self, port: int) -> bool: ...
    def base_url(self, port: int) -> str: ...
    def close(self) -> None: ...


def escalate(send, gone, grace_s: float, poll_s: float) -> bool:
    """send("TERM"), wait up to grace_s for gone(); then send("KILL"), wait 5 s. send returning True means gone."""
    for sig, wait_s in (("TERM", grace_s), ("KILL", 5.0)):
        if send(sig):
            return True
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            if gone():
                return True
            time.sleep(poll_s)
    return gone()


def shell_command(argv: list[str], env: dict[str, str]) -> str:
    """The command as recorded and shown: secret env values as markers (infra/secrets.py)."""
    prefix = " ".join(f"{k}={shlex.quote(v)}" for k, v in sorted(secrets.env(env).items()))
    return (prefix + " " if prefix else "") + shlex.join(argv)


class LocalExecutor:
    host = "local"

    def run(self, argv: list[str], timeout_s: float, cancel=None) -> Completed:
        """ARGV's result; with CANCEL (a threading.Event), in its own process group, stopped group and all (raising
        Cancelled) within a second of CANCEL being set."""
        if cancel is None:
            proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s)
            return Completed(proc.returncode, proc.stdout, proc.stderr)
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                out, err = proc.communicate(timeout=0.5)
                return Completed(proc.returncode, out, err)
            except subprocess.TimeoutExpired:
                if cancel.is_set() or time.monotonic() > deadline:
                    self.stop_group(proc.pid, grace_s=3.0)
                    proc.communicate()
                    if cancel.is_set():
                        raise Cancelled(f"{argv[-1] if argv else 'command'} stopped: the diagnosis ended") from None
                    raise subprocess.TimeoutExpired(argv, timeout_s) from None  # its own timeout, not the poll's

    def which(self, program: str) -> str | None:
        return shutil.which(program)

    def launch(self, argv: list[str], env: dict[str, str], log_path: str) -> Launched:
        Path(log_path).parent.mkdir(parents=True, exist_ok=True)
        with open(log_path, "ab") as log:
            # A new session makes the server the leader of its own process group, so teardown can
            # stop it and every worker it forked in one signal, and Ctrl-C on us does not reach it.
            proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                    env={**os.environ, **env}, start_new_session=True)
        return Launched(proc.pid, proc.pid, log_path, shell_command(argv, env))

    def is_alive(self, pid: int) -> bool:
        try:
            # Reap it if it is our exited child, so a zombie does not count as alive.
            os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            pass
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (FileNotFoundError, ProcessLookupError, IndexError):
            return False
        return state not in ("Z", "X")

    def group_pids(self, pgid: int) -> list[int]:
        pids = []
        for stat in Path("/proc").glob("[0-9]*/stat"):
            try:
                fields = stat.read_text().rsplit(")", 1)[1].split()
            except (FileNotFoundError, ProcessLookupError, IndexError):
                continue
            if int(fields[2]) == pgid and fields[0] not in ("Z", "X"):
                pids.append(int(stat.parent.name))
        return sorted(pids)

    def stop_group(self, pgid: int, grace_s: float = 15.0) -> list[int]:
        """SIGTERM the group, SIGKILL what is left after grace_s; return the PIDs still alive (none)."""
        for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 5.0)):
            try:
                os.killpg(pgid, sig)
            except ProcessLookupError:
                pass
            deadline = time.monotonic() + wait_s
            while time.monotonic() < deadline:
                self.is_alive(pgid)  # reaps the leader when it is our child
                if not self.group_pids(pgid):
                    return []
                time.sleep(0.2)
        return self.group_pids(pgid)

    def stop_pid(self, pid: int, grace_s: float = 15.0) -> bool:
        """Stop one process that is not ours to stop as a group; True once it is gone."""
        for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 5.0)):
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                return True
            deadline = time.monotonic() + wait_s
            while time.monotonic() < deadline:
                if not self.is_alive(pid):
                    return True
                time.sleep(0.2)
        return not self.is_alive(pid)

    def pgid_of(self, pid: int) -> int | None:
        try:
            return os.getpgid(pid)
        except ProcessLookupError:
            return None

    def read_tail(self, path: str, max_bytes: int = 16_384) -> str:
        try:
            with open(path, "rb") as f:
                f.seek(0, os.SEEK_END)
                f.seek(max(0, f.tell() - max_bytes))
                return f.read().decode("utf-8", "replace")
        except FileNotFoundError:
            return ""

    def size(self, path: str) -> int:
        try:
            return os.path.getsize(path)
        except FileNotFoundError:
            return 0

    def read_from(self, path: str, offset: int) -> tuple[str, int]:
        try:
            with open(path, "rb") as f:
                f.seek(offset)
                data = f.read()
        except FileNotFoundError:
            return "", offset
        return data.decode("utf-8", "replace"), offset + len(data)

    def fetch(self, path: str, dest: Path) -> Path:
        _copy(Path(path), Path(dest))
        return dest

    def put(self, local: Path, path: str) -> str:
        _copy(Path(local), Path(path))
        return path

    def close(self) -> None:
        pass

    def read_bytes(self, path: str) -> bytes:
        return Path(path).expanduser().read_bytes()

    def glob(self, pattern: str) -> list[str]:
        return sorted(globmod.glob(os.path.expanduser(pattern)))

    def open(self, path: str):
        return open(os.path.expanduser(path), "rb")

    def port_free(self, port: int) -> bool:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                return False
        return True

    def base_url(self, port: int) -> str:
        return f"http://127.0.0.1:{port}"


def _copy(src: Path, dest: Path) -> None:
    """A local copy; onto itself it is a no-op (the host's run folder and this machine's copy can be one folder)."""
    if dest.exists() and dest.resolve() == src.resolve():
        return
    dest.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(src, dest)


def executor_for(host) -> Executor:
    """The executor for a HostConfig: this machine, or the host over SSH."""
    if host.kind == "local":
        return LocalExecutor()
    from infra.ssh import SshExecutor

    return SshExecutor(host)
