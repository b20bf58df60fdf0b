"""The SSH executor (paramiko): LocalExecutor's calls, on a GPU host reached with `ssh user@host`.

- Host keys are checked against known_hosts, read as OpenSSH reads it and never written (infra/known_hosts.py);
  a host config that opts in accepts an unknown key for that connection only.
- Every command is one shlex-quoted string for the remote POSIX shell: paths with spaces or `;` stay one argument.
- Output is drained while waiting, so a chatty command cannot fill the window and hang `recv_exit_status`.
- Servers start detached (`setsid nohup ... < /dev/null &`): a dropped control connection does not stop them, and
  they lead their own process group, so teardown stops them and their workers with one signal.
- Dropped connections are reopened with exponential backoff; idempotent calls are retried.
- `base_url` forwards a local port to the server's port on the host's 127.0.0.1: nothing is exposed.
"""
from __future__ import annotations

import re
import select
import shlex
import socket
import subprocess
import threading
import time
from pathlib import Path, PurePosixPath

import paramiko

from infra import known_hosts
from infra.config import HostConfig, SpecdiagError
from infra.executor import Cancelled, Completed, Launched, escalate, shell_command

DROPS = (OSError, EOFError, paramiko.SSHException)
PGID_MARK = "specdiag-pgid="
SFTP_TIMEOUT_S = 120.0  # one SFTP request (a header, a log tail, a checkpoint put in 32 KiB blocks): a stalled host


def _without_mark(stderr: str) -> str:
    return stderr.split("\n", 1)[1] if stderr.startswith(PGID_MARK) else stderr


def _refusal(exc: Exception, cfg: HostConfig, known: Path) -> SpecdiagError | None:
    where = f"{cfg.user}@{cfg.address}:{cfg.port}"
    if isinstance(exc, paramiko.BadHostKeyException):
        return SpecdiagError(f"host key of {where} does not match {known}: the host changed or this is not the "
                             f"host you think; check it before removing the old key (ssh-keygen -R)")
    if isinstance(exc, paramiko.AuthenticationException):
        return SpecdiagError(f"SSH login to {where} refused: check hosts.{cfg.name}.user and key_file "
                             f"({cfg.key_file or 'default keys'})")
    if isinstance(exc, paramiko.SSHException) and "not found in known_hosts" in str(exc):
        return SpecdiagError(
            f"host key of {where} is unknown (not in {known}): verify it and add it "
            f"(ssh-keyscan -p {cfg.port} {cfg.address} >> {known}), or set hosts.{cfg.name}."
            f"accept_unknown_host_keys: true to trust it blindly")
    return None


class SshExecutor:
    def __init__(self, cfg: HostConfig, retries: int = 4, backoff_s: float = 0.5):
        if not cfg.address:
            raise SpecdiagError(f"host {cfg.name!r} has kind ssh but no address")
        self.cfg, self.host = cfg, cfg.name
        self.retries, self.backoff_s = retries, backoff_s
        self._client: paramiko.SSHClient | None = None
        self._jump: paramiko.SSHClient | None = None
        self._sftp: paramiko.SFTPClient | None = None
        self._lock = threading.RLock()
        self._forwards: dict[int, _Forward] = {}

    # -- connection ------------------------------------------------------------------------------------
    def _connect_one(self, address: str, port: int, user: str, key: str | None, sock=None) -> paramiko.SSHClient:
        hosts = known_hosts.read(self.cfg.known_hosts)  # read only: paramiko never holds the file's name
        known, client = hosts.path, paramiko.SSHClient()
        for name, keys in hosts.keys.items():
            for keytype, host_key in keys.items():
                client.get_host_keys().add(name, keytype, host_key)
        client.set_missing_host_key_policy(known_hosts.Policy(hosts, self.cfg.accept_unknown_host_keys))
        try:
            client.connect(address, port=port, username=user, key_filename=str(Path(key).expanduser()) if key else None,
                           timeout=self.cfg.connect_timeout_s, banner_timeout=self.cfg.connect_timeout_s,
                           auth_timeout=self.cfg.connect_timeout_s, sock=sock, allow_agent=False,
                           look_for_keys=key is None)
        except Exception as exc:
            client.close()
            refused = _refusal(exc, self.cfg, known)
            if refused:
                raise refused from None
            raise
        if hosts.is_revoked(client.get_transport().get_remote_server_key()):
            client.close()
            raise SpecdiagError(f"host key of {user}@{address}:{port} is marked @revoked in {known}: not connecting")
        client.get_transport().set_keepalive(10)
        return client

    def _connect(self) -> paramiko.SSHClient:
        sock = None
        if self.cfg.jump:
            j = self.cfg.jump
            self._jump = self._connect_one(j.address, j.port, j.user, j.key_file)
            sock = self._jump.get_transport().open_channel("direct-tcpip", (self.cfg.address, self.cfg.port),
                                                            ("127.0.0.1", 0), timeout=self.cfg.connect_timeout_s)
        return self._connect_one(self.cfg.address, self.cfg.port, self.cfg.user, self.cfg.key_file, sock)

    def _transport(self) -> paramiko.Transport:
        """The live transport, reconnecting with backoff when the connection dropped."""
        with self._lock:
            t = self._client.get_transport() if self._client else None
            if t is not None and t.is_active():
                return t
            self._drop()
            for attempt in range(self.retries + 1):
                try:
                    self._client = self._connect()
                    return self._client.get_transport()
                except SpecdiagError:
                    raise
                except DROPS as exc:
                    if attempt == self.retries:
                        raise SpecdiagError(f"cannot reach {self.cfg.user}@{self.cfg.address}:{self.cfg.port} "
                                            f"after {self.retries + 1} attempts: {exc}") from None
                    time.sleep(self.backoff_s * 2 ** attempt)

    def _drop(self) -> None:
        for c in (self._sftp, self._client, self._jump):
            try:
                c and c.close()
            except Exception:
                pass
        self._sftp = self._client = self._jump = None

    def _retrying(self, op, idempotent: bool = True):
        for attempt in range(self.retries + 1):
            transport = self._transport()
            try:
                return op(transport)
            except DROPS as exc:
                if not idempotent or attempt == self.retries or transport.is_active():
                    raise
                time.sleep(self.backoff_s * 2 ** attempt)

    def _sftp_client(self) -> paramiko.SFTPClient:
        with self._lock:
            transport = self._transport()
            if self._sftp is None or self._sftp.get_channel().get_transport() is not transport:
                self._sftp = paramiko.SFTPClient.from_transport(transport)
                # no SFTP read or write waits without end on a host that stopped answering
                self._sftp.get_channel().settimeout(SFTP_TIMEOUT_S)
            return self._sftp

    def close(self) -> None:
        for fwd in self._forwards.values():
            fwd.close()
        self._forwards.clear()
        with self._lock:
            self._drop()

    # -- commands --------------------------------------------------------------------------------------
    def _exec(self, command: str, timeout_s: float, idempotent: bool = True, cancel=None) -> Completed:
        """Run COMMAND in its own process group on the host (setsid), which reports its PGID first on stderr: a
        command that outlives timeout_s, or whose CANCEL (a threading.Event) is set, is stopped there, group and
        all, not left running."""
        wrapped = f"exec setsid -w sh -c {shlex.quote(f'echo {PGID_MARK}$$ >&2; {command}')}"

        def op(transport: paramiko.Transport) -> Completed:
            chan = transport.open_session(timeout=self.cfg.connect_timeout_s)
            out, err = bytearray(), bytearray()
            try:
                chan.exec_command(wrapped)
                deadline = time.monotonic() + timeout_s
                while True:  # drain both streams while waiting, or a full window blocks the remote command
                    select.select([chan], [], [], 0.2)
                    while chan.recv_ready():
                        out += chan.recv(1 << 16)
                    while chan.recv_stderr_ready():
                        err += chan.recv_stderr(1 << 16)
                    if chan.exit_status_ready() and not chan.recv_ready() and not chan.recv_stderr_ready():
                        break
                    if not transport.is_active():
                        raise EOFError("SSH connection dropped")
                    if cancel is not None and cancel.is_set():
                        self._stop_group_of(err, "was cancelled")
                        raise Cancelled(f"{command[-80:]} stopped on {self.host}: the diagnosis ended")
                    if time.monotonic() > deadline:
                        self._stop_group_of(err, "ran past its timeout")
                        raise subprocess.TimeoutExpired(command, timeout_s)
                return Completed(chan.recv_exit_status(), out.decode("utf-8", "replace"),
                                 _without_mark(err.decode("utf-8", "replace")))
            finally:
                chan.close()
        return self._retrying(op, idempotent)

    def _stop_group_of(self, err: bytearray, why: str) -> None:
        found = re.match(rf"{PGID_MARK}(\d+)", err.decode("utf-8", "replace"))
        if found:
            left = self.stop_group(int(found.group(1)), grace_s=3.0)
            print(f"{self.host}: a command {why}; its process group {found.group(1)} was stopped"
                  + (f" except {left}" if left else ""))

    def run(self, argv: list[str], timeout_s: float, cancel=None) -> Completed:
        return self._exec(shlex.join(argv), timeout_s, cancel=cancel)

    def _sh(self, script: str, timeout_s: float = 30.0) -> Completed:
        return self._exec(script, timeout_s)

    def which(self, program: str) -> str | None:
        done = self._sh(f"command -v {shlex.quote(program)}")
        return done.stdout.strip() or None

    def launch(self, argv: list[str], env: dict[str, str], log_path: str) -> Launched:
        envs = " ".join(shlex.quote(f"{k}={v}") for k, v in sorted(env.items()))
        log = shlex.quote(log_path)
        # setsid: the server leads its own session and process group; nohup + stdin from /dev/null: it outlives
        # this SSH session. In `sh -c` without job control `&` does not make a group leader, so setsid does not
        # fork and $! is the server's PID (= its PGID).
        command = f"setsid nohup env {envs} {shlex.join(argv)} > {log} 2>&1 < /dev/null"
        script = f"mkdir -p {shlex.quote(str(PurePosixPath(log_path).parent))} && {{ {command} & }} && echo $!"
        done = self._exec(script, 60.0, idempotent=False)
        if done.returncode != 0 or not done.stdout.strip().isdigit():
            raise SpecdiagError(f"launch on {self.host} failed: {done.stderr.strip() or done.stdout.strip()}")
        pid = int(done.stdout.strip())
        return Launched(pid, self.pgid_of(pid) or pid, log_path,
                        f"setsid nohup env {shell_command(argv, env)} > {log} 2>&1 < /dev/null")  # as recorded

    def is_alive(self, pid: int) -> bool:
        state = self._sh(f"ps -o stat= -p {int(pid)}").stdout.strip()
        return bool(state) and not state.startswith(("Z", "X"))

    def group_pids(self, pgid: int) -> list[int]:
        rows = self._sh("ps -eo pid=,pgid=,stat=").stdout.split()
        return sorted(int(p) for p, g, s in zip(rows[::3], rows[1::3], rows[2::3])
                      if int(g) == pgid and not s.startswith(("Z", "X")))

    def _kill(self, target: str):
        """`send` for escalate(): signal TARGET on the host; whether it is gone is checked separately."""
        def send(sig: str) -> bool:
            self._sh(f"kill -{sig} {target} 2>/dev/null; true")
            return False
        return send

    def stop_group(self, pgid: int, grace_s: float = 15.0) -> list[int]:
        # `kill -SIG -PGID`: dash, the `sh` commands run in, has no `kill --`
        gone = escalate(self._kill(f"-{int(pgid)}"), lambda: not self.group_pids(pgid), grace_s, 0.3)
        return [] if gone else self.group_pids(pgid)

    def stop_pid(self, pid: int, grace_s: float = 15.0) -> bool:
        return escalate(self._kill(str(int(pid))), lambda: not self.is_alive(pid), grace_s, 0.3)

    def pgid_of(self, pid: int) -> int | None:
        out = self._sh(f"ps -o pgid= -p {int(pid)}").stdout.strip()
        return int(out) if out.isdigit() else None

    # -- files -----------------------------------------------------------------------------------------
    def read_tail(self, path: str, max_bytes: int = 16_384) -> str:
        return self._sh(f"tail -c {int(max_bytes)} {shlex.quote(path)} 2>/dev/null; true").stdout

    def read_from(self, path: str, offset: int) -> tuple[str, int]:
        def op(_):
            try:
                with self._sftp_client().open(path, "rb") as f:
                    f.seek(offset)
                    data = f.read()
            except FileNotFoundError:
                return "", offset
            return data.decode("utf-8", "replace"), offset + len(data)
        return self._retrying(op)

    def size(self, path: str) -> int:
        def op(_):
            try:
                return self._sftp_client().stat(path).st_size or 0
            except FileNotFoundError:
                return 0
        return self._retrying(op)

    def fetch(self, path: str, dest: Path) -> Path:
        dest.parent.mkdir(parents=True, exist_ok=True)
        self._retrying(lambda _: self._sftp_client().get(path, str(dest)))
        return dest

    def read_bytes(self, path: str) -> bytes:
        with self.open(path) as f:
            return f.read()

    def glob(self, pattern: str) -> list[str]:
        folder, name = pattern.rsplit("/", 1) if "/" in pattern else (".", pattern)
        if not re.fullmatch(r"[\w.*?-]+", name):
            raise ValueError(f"unsupported glob {name!r}")
        done = self._sh(f"cd {_home(folder)} 2>/dev/null && ls -1d -- {name} 2>/dev/null; true")
        return [f"{folder}/{line}" for line in done.stdout.splitlines() if line]

    def open(self, path: str):
        """A binary SFTP file (seek/read); a leading ~/ is the login directory, where SFTP starts."""
        return self._sftp_client().open(path[2:] if path.startswith("~/") else path, "rb")

    def put(self, local: Path, path: str) -> str:
        self._sh(f"mkdir -p {shlex.quote(str(PurePosixPath(path).parent))}")
        self._retrying(lambda _: self._sftp_client().put(str(local), path))
        return path

    # -- network ---------------------------------------------------------------------------------------
    def port_free(self, port: int) -> bool:
        done = self._sh(f"ss -Htln 'sport = :{int(port)}' 2>/dev/null || echo no-ss")
        if "no-ss" not in done.stdout:
            return done.stdout.strip() == ""
        probe = f"import socket; s=socket.socket(); s.bind(('127.0.0.1', {int(port)}))"
        return self._sh(f"python3 -c {shlex.quote(probe)}").returncode == 0

    def base_url(self, port: int) -> str:
        """A local URL that reaches the server's 127.0.0.1:port on the host through this SSH connection."""
        with self._lock:
            if port not in self._forwards:
                self._forwards[port] = _Forward(self, port)
            return f"http://127.0.0.1:{self._forwards[port].local_port}"


def _home(path: str) -> str:
    """Quote a path for the remote shell, keeping a leading ~/ expandable."""
    return "~/" + shlex.quote(path[2:]) if path.startswith("~/") else shlex.quote(path)


class _Forward:
    """Local 127.0.0.1:<ephemeral> -> the host's 127.0.0.1:<port>, one direct-tcpip channel per connection.
    Each new connection takes the executor's live transport, so the forward survives a reconnect."""

    def __init__(self, executor: SshExecutor, port: int):
        self.executor, self.port = executor, port
        self.listener = socket.socket()
        self.listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(64)
        self.local_port = self.listener.getsockname()[1]
        self.closed = False
        threading.Thread(target=self._accept, daemon=True, name=f"ssh-forward-{port}").start()

    def _accept(self) -> None:
        while not self.closed:
            try:
                conn, peer = self.listener.accept()
            except OSError:
                return
            threading.Thread(target=self._pipe, args=(conn, peer), daemon=True).start()

    def _pipe(self, conn: socket.socket, peer) -> None:
        try:
            chan = self.executor._transport().open_channel("direct-tcpip", ("127.0.0.1", self.port), peer,
                                                           timeout=self.executor.cfg.connect_timeout_s)
        except Exception:
            conn.close()
            return
        try:
            while True:
                ready, _, _ = select.select([conn, chan], [], [], 1.0)
                if conn in ready:
                    data = conn.recv(1 << 16)
                    if not data:
                        break
                    chan.sendall(data)
                if chan in ready:
                    data = chan.recv(1 << 16)
                    if not data:
                        break
                    conn.sendall(data)
                if self.closed or chan.closed:
                    break
        except OSError:
            pass
        finally:
            chan.close()
            conn.close()

    def close(self) -> None:
        self.closed = True
        self.listener.close()
