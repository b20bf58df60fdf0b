"""Wait until the server answers /health; fail within seconds when it dies or logs a fatal error."""
from __future__ import annotations

import time

import httpx
from prefect import task
from prefect.cache_policies import NO_CACHE

from infra import vllm
from tasks.launch import Server


class ServerDied(RuntimeError):
    pass


def log_tail(server: Server, lines: int = 30) -> str:
    return "\n".join(server.executor.read_tail(server.process.log_path).splitlines()[-lines:])


@task(name="wait-healthy", cache_policy=NO_CACHE)
def wait_healthy(server: Server, timeout_s: float, poll_s: float = 0.5, progress_s: float = 15.0) -> float:
    """Return seconds from launch to healthy."""
    start = time.monotonic()
    next_progress = start + progress_s
    with httpx.Client(timeout=httpx.Timeout(5.0)) as client:
        while True:
            elapsed = time.monotonic() - start
            if not server.executor.is_alive(server.process.pid):
                raise ServerDied(f"[{server.arm}] server exited after {elapsed:.0f} s; log tail:\n{log_tail(server)}")
            fatal = vllm.fatal_line(server.executor.read_tail(server.process.log_path, 65_536))
            if fatal:
                raise ServerDied(f"[{server.arm}] server logged a fatal error after {elapsed:.0f} s: "
                                 f"{fatal}\nlog tail:\n{log_tail(server)}")
            try:
                if client.get(f"{server.base_url}/health").status_code == 200:
                    print(f"[{server.arm}] healthy after {elapsed:.1f} s")
                    return elapsed
            except httpx.TransportError:
                pass
            if elapsed > timeout_s:
                raise TimeoutError(f"[{server.arm}] not healthy after {timeout_s:.0f} s "
                                   f"(raise health_timeout_s for slow loads); log tail:\n{log_tail(server)}")
            if time.monotonic() >= next_progress:
                last = log_tail(server, 1).strip()[-160:]
                print(f"[{server.arm}] waiting for server: {elapsed:.0f} s / {timeout_s:.0f} s; log: {last}")
                next_progress += progress_s
            time.sleep(poll_s)
