"""A real `mlflow server` over a store, and headless Chromium (Debian's package) reading pages through it: what the
tests assert on and what docs/screenshots.py captures."""
from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path
from secrets import token_hex

import httpx

from infra.config import SpecdiagError


def chromium() -> str:
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if not found:
        raise SpecdiagError("headless Chromium is needed: apt-get install chromium")
    return found


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_http(url: str, proc: subprocess.Popen, timeout_s: float, what: str, every_s: float = 0.5) -> None:
    """Until URL answers 200; the process ending or the time running out first is an error naming WHAT."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            if httpx.get(url, timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"{what} did not start in {timeout_s:.0f} s")
        time.sleep(every_s)


def stop(proc: subprocess.Popen, grace_s: float = 30) -> None:
    proc.terminate()
    try:
        proc.wait(grace_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(10)


@contextmanager
def service(argv: list[str], log: Path, env: dict | None = None, cwd: Path | None = None):
    """A long-running program in its own session, its output in LOG; stopped (TERM, then KILL) when the block ends."""
    with open(log, "w") as out:
        proc = subprocess.Popen(argv, env=env, cwd=cwd, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            yield proc
        finally:
            stop(proc)


@contextmanager
def mlflow_server(store_uri: str, timeout_s: float = 120, artifacts: Path | None = None,
                  auth: tuple[str, str] | None = None):
    """`mlflow server` on the store, on a free local port; yields its URL. Artifacts where its experiments say, and
    those of experiments its clients create in ARTIFACTS (it serves them: clients elsewhere write through it).
    auth: (user, password): MLflow's basic-auth app, that user its admin; clients pass MLFLOW_TRACKING_USERNAME and
    MLFLOW_TRACKING_PASSWORD."""
    port = free_port()
    log = Path(store_uri.removeprefix("sqlite:///")).with_suffix(".server.log")
    served = ["--artifacts-destination", str(artifacts)] if artifacts else []
    env, app = dict(os.environ), []
    if auth:
        ini = log.with_name("basic_auth.ini")
        ini.write_text(f"[mlflow]\ndefault_permission = NO_PERMISSIONS\n"
                       f"database_uri = sqlite:///{log.with_name('basic_auth.db')}\nadmin_username = {auth[0]}\n"
                       "authorization_function = mlflow.server.auth:authenticate_request_basic_auth\n")
        env.update(MLFLOW_AUTH_CONFIG_PATH=str(ini), MLFLOW_AUTH_ADMIN_PASSWORD=auth[1],
                   MLFLOW_FLASK_SERVER_SECRET_KEY=token_hex(32))  # CSRF protection of the auth app's forms
        app = ["--app-name", "basic-auth"]
    with service([sys.executable, "-m", "mlflow", "server", "--backend-store-uri", store_uri, *served, *app,
                  "--host", "127.0.0.1", "--port", str(port), "--workers", "1"], log, env) as proc:
        url = f"http://127.0.0.1:{port}"
        wait_http(f"{url}/health", proc, timeout_s, f"mlflow server (see {log})")
        yield url


def _run(args: list[str], timeout_s: float) -> subprocess.CompletedProcess:
    with tempfile.TemporaryDirectory() as profile:  # a fresh profile: no lock left by another Chromium
        return subprocess.run([chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                               "--disable-dev-shm-usage", "--no-first-run", f"--user-data-dir={profile}", *args],
                              capture_output=True, text=True, timeout=timeout_s)


def dom(url: str, wait_ms: int = 0, timeout_s: float = 120) -> str:
    """The page's DOM after load (and wait_ms of virtual time, for pages that render with scripts)."""
    extra = [f"--virtual-time-budget={wait_ms}"] if wait_ms else []
    return _run([*extra, "--dump-dom", url], timeout_s).stdout


def screenshot(url: str, out: Path, width: int = 1600, height: int = 1400, wait_ms: int = 0) -> Path:
    extra = [f"--virtual-time-budget={wait_ms}"] if wait_ms else []
    _run([*extra, f"--window-size={width},{height}", f"--screenshot={out}", url], 180)
    if not out.exists():
        raise RuntimeError(f"Chromium wrote no screenshot of {url}")
    return out


def artifact_url(server: str, run_id: str, path: str) -> str:
    """The server's download address. MLflow sends artifacts as attachments (a browser downloads them, and
    headless Chromium waits forever), so open them with `artifact_file`, as MLflow's own viewer fetches them."""
    return f"{server}/get-artifact?path={path}&run_uuid={run_id}"


def artifact_file(server: str, run_id: str, path: str, into: Path) -> str:
    """The artifact fetched from the server into the folder INTO; its file:// URL, for `dom` or `screenshot`."""
    reply = httpx.get(artifact_url(server, run_id, path), timeout=60)
    reply.raise_for_status()
    (into / Path(path).name).write_bytes(reply.content)
    return (into / Path(path).name).resolve().as_uri()
