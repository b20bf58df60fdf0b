"""The services a diagnosis spread over hosts runs on, started as the README starts them: a Prefect server, the
process work pool with the arm flow's deployment (prefect.yaml), one worker per host, each on its host's queue with
--limit 1 (infra/spread.py), and an MLflow tracking server (infra/browser.mlflow_server). The two-host test and
benchmarks/spread_hosts.py run on them."""
from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from contextlib import ExitStack, contextmanager
from pathlib import Path

from prefect.settings import PREFECT_API_AUTH_STRING, PREFECT_API_URL, temporary_settings

from infra.browser import free_port, service, stop, wait_http
from infra.config import PROJECT_ROOT, SpecdiagError
from infra.spread import queue_name, unpolled


def _prefect(env: dict, *args: str) -> None:
    done = subprocess.run([sys.executable, "-m", "prefect", *args], env=env, cwd=PROJECT_ROOT, text=True,
                          capture_output=True, timeout=300)
    if done.returncode != 0 and "already exists" not in done.stdout + done.stderr:
        raise RuntimeError(f"prefect {' '.join(args)} failed: {(done.stdout + done.stderr)[-2000:]}")


@contextmanager
def prefect_server(home: Path, timeout_s: float = 180, auth: str | None = None):
    """`prefect server start` with its own PREFECT_HOME (database), on a free local port; yields its API URL.
    auth: "user:password": the server's API auth (clients and workers pass PREFECT_API_AUTH_STRING)."""
    port = free_port()
    env = {**os.environ, "PREFECT_HOME": str(home), "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
           **({"PREFECT_SERVER_API_AUTH_STRING": auth} if auth else {})}
    env.pop("PREFECT_API_URL", None)
    home.mkdir(parents=True, exist_ok=True)
    argv = [sys.executable, "-m", "prefect", "server", "start", "--host", "127.0.0.1", "--port", str(port)]
    with service(argv, home / "server.log", env, PROJECT_ROOT) as proc:
        url = f"http://127.0.0.1:{port}/api"
        wait_http(f"{url}/health", proc, timeout_s, f"prefect server (see {home / 'server.log'})")
        yield url


@contextmanager
def workers(api_url: str, pool: str, hosts: list[str], logs: Path, timeout_s: float = 120, env: dict | None = None):
    """The pool, the arm deployment, and one worker per host polling its queue; yields once every queue is polled:
    host -> its worker's process.
    env: more of the workers' environment (the services' credentials: PREFECT_API_AUTH_STRING, MLflow's)."""
    env = {**os.environ, "PREFECT_API_URL": api_url, "SPECDIAG_HOME": str(PROJECT_ROOT), "PYTHONUNBUFFERED": "1",
           "PREFECT_WORKER_QUERY_SECONDS": "1", "PREFECT_SERVER_ANALYTICS_ENABLED": "false", **(env or {})}
    _prefect(env, "work-pool", "create", pool, "--type", "process", "--overwrite")
    _prefect(env, "--no-prompt", "deploy", "--name", "spread")
    logs.mkdir(parents=True, exist_ok=True)
    with ExitStack() as stack:
        procs = {}
        for host in hosts:
            _prefect(env, "work-queue", "create", queue_name(host), "--pool", pool)  # a worker does not create it
            procs[host] = stack.enter_context(service(
                [sys.executable, "-m", "prefect", "worker", "start", "--pool", pool, "--work-queue", queue_name(host),
                 "--limit", "1", "--name", f"specdiag-{host}"], logs / f"worker-{host}.log", env, PROJECT_ROOT))
        deadline = time.monotonic() + timeout_s
        auth = {PREFECT_API_AUTH_STRING: env["PREFECT_API_AUTH_STRING"]} if env.get("PREFECT_API_AUTH_STRING") else {}
        with temporary_settings({PREFECT_API_URL: api_url, **auth}):
            while unpolled(pool, hosts):  # as spread.check asks before a diagnosis
                if time.monotonic() > deadline:
                    raise RuntimeError(f"workers did not poll their queues in {timeout_s:.0f} s (see {logs})")
                time.sleep(1)
        yield procs


SSHD = "/usr/sbin/sshd"


def _keygen(path: Path) -> str:
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(path)], check=True)
    return path.with_suffix(".pub").read_text().strip()


@contextmanager
def loopback_sshd(d: Path, timeout_s: float = 15):
    """A real OpenSSH sshd on 127.0.0.1 with keys generated in D: a "remote" host that is this machine. Yields its
    port, known_hosts file, client key and process."""
    if not Path(SSHD).exists() or os.geteuid() != 0:
        raise SpecdiagError("needs root and OpenSSH sshd (apt-get install openssh-server; .ci/run installs it)")
    d.mkdir(parents=True, exist_ok=True)
    host_pub = _keygen(d / "host_key")
    (d / "authorized_keys").write_text(_keygen(d / "client_key") + "\n")
    port = free_port()  # sshd refuses port 0: pick one first
    Path("/run/sshd").mkdir(exist_ok=True)  # sshd's privilege-separation directory
    argv = [SSHD, "-D", "-e", "-f", "/dev/null", "-o", f"Port={port}", "-o", "ListenAddress=127.0.0.1",
            "-o", f"HostKey={d / 'host_key'}", "-o", f"AuthorizedKeysFile={d / 'authorized_keys'}",
            "-o", "StrictModes=no", "-o", "PermitRootLogin=yes", "-o", "PidFile=none", "-o", "UsePAM=no",
            "-o", "Subsystem=sftp internal-sftp", "-o", "MaxSessions=64", "-o", "MaxStartups=64"]
    with open(d / "sshd.log", "w") as log:
        proc = subprocess.Popen(argv, stderr=log)
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise RuntimeError(f"sshd did not start: {(d / 'sshd.log').read_text()}") from None
                time.sleep(0.1)
        known = d / "known_hosts"
        known.write_text(f"[127.0.0.1]:{port} {host_pub}\n")
        yield {"port": port, "dir": d, "known_hosts": str(known), "key": str(d / "client_key"), "proc": proc}
    finally:
        stop(proc, 10)
