"""One server per host (or GPU set) at a time, across all flow runs: a Prefect global concurrency limit, strict.

Two diagnoses aimed at the same host queue on it; diagnoses on different hosts run in parallel.
"""
from __future__ import annotations

import time
from contextlib import contextmanager

from prefect.client.orchestration import get_client
from prefect.client.schemas.actions import GlobalConcurrencyLimitCreate
from prefect.concurrency.sync import concurrency
from prefect.exceptions import ObjectAlreadyExists, ObjectNotFound

from infra.config import HostConfig


def lock_name(host: HostConfig) -> str:
    gpus = "-gpus-" + "-".join(map(str, sorted(host.gpus))) if host.gpus else ""
    return f"specdiag-host-{host.name}{gpus}"


def _ensure_limit(name: str) -> None:
    with get_client(sync_client=True) as client:
        try:
            client.read_global_concurrency_limit_by_name(name)
        except ObjectNotFound:
            try:
                client.create_global_concurrency_limit(GlobalConcurrencyLimitCreate(name=name, limit=1))
            except ObjectAlreadyExists:  # another diagnosis created it first
                pass


@contextmanager
def host_lock(host: HostConfig, timeout_s: float | None = None):
    """Hold the host's slot; yields the seconds spent waiting for it."""
    name = lock_name(host)
    _ensure_limit(name)
    start = time.monotonic()
    # strict: a limit that cannot be found raises instead of being silently skipped
    with concurrency(name, occupy=1, strict=True, timeout_seconds=timeout_s):
        yield time.monotonic() - start
