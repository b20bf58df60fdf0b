"""One server per host resource at a time, across all flow runs: Prefect global concurrency limits, strict.

What a server holds, and must not share, is its GPUs and its port. Each is a limit of one slot:
`specdiag-host-<host>-gpu-<i>` per GPU, `specdiag-host-<host>-port-<port>`, all taken in one atomic call, so GPU
sets that overlap exclude each other and sets that do not run side by side (given different ports). A server on
all of a host's GPUs (host.gpus unset) takes every slot of `specdiag-host-<host>-gpus`, which a GPU set takes one
slot of: whole-host and GPU-set servers exclude each other too. A busy host means waiting, with progress printed.
Slots are leases, renewed while held. A holder that dies (SIGKILL, OOM) stops renewing: a Prefect server that runs
its repossessor frees them within LEASE_S; a waiter on the same machine does not wait for that (the temporary server
of a bare `python flows/diagnose.py` expires nothing): it sees the holder's record and gives the slots back.
"""
from __future__ import annotations

import json
import os
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from uuid import UUID

from prefect.client.orchestration import get_client
from prefect.client.schemas.actions import GlobalConcurrencyLimitCreate
from prefect.client.schemas.responses import ConcurrencyLimitWithLeaseResponse
from prefect.exceptions import ObjectAlreadyExists, ObjectNotFound, PrefectHTTPStatusError
from prefect.settings import PREFECT_API_URL

from infra import registry
from infra.config import HostConfig, SpecdiagError
from infra.embedded import cache_dir
from infra.prefect_boot import TEMPORARY

HOST_SHARES = 64  # slots of a host's GPU-share limit: a whole-host server takes them all, a GPU set one
LEASE_S = 60.0  # renewed while held; what a dead holder blocks for on a Prefect server that expires leases
POLL_S = 1.0  # how often a waiter asks again
RENEW_S = LEASE_S / 4  # how often a holder renews


def lock_names(host: HostConfig, port: int) -> tuple[str, list[str]]:
    """(the host's GPU-share limit, the exclusive ones: this server's GPUs and port)."""
    base = f"specdiag-host-{host.name}"
    gpus = [f"{base}-gpu-{i}" for i in sorted(set(host.gpus))] if host.gpus else []
    return f"{base}-gpus", gpus + [f"{base}-port-{port}"]


def _ensure_limit(name: str, limit: int = 1) -> None:
    with get_client(sync_client=True) as client:
        try:
            client.read_global_concurrency_limit_by_name(name)
        except ObjectNotFound:
            try:
                client.create_global_concurrency_limit(GlobalConcurrencyLimitCreate(name=name, limit=limit))
            except ObjectAlreadyExists:  # another diagnosis created it first
                pass


def _api() -> str:
    """Which Prefect server a lease lives on: a configured one, or this process's own temporary one (Prefect's, or
    the one flows/diagnose.py starts early, infra/prefect_boot.py). Temporary servers share one database and expire
    no leases: a dead holder's slots there are given back by the next process (reclaim_dead)."""
    url = PREFECT_API_URL.value()
    return f"ephemeral:{os.getpid()}" if not url or url == os.environ.get(TEMPORARY) else url


def _acquire(client, names: list[str], occupy: int, what: str, progress_s: float, max_wait_s: float):
    """Poll for the slots (all at once, or none) until they are ours, max_wait_s at most; print what it waits for at
    once and every progress_s after, and give back the slots of holders that died."""
    start = time.monotonic()
    next_print = start
    while True:
        try:
            resp = client.increment_concurrency_slots_with_lease(names, occupy, "concurrency", LEASE_S)
            granted = ConcurrencyLimitWithLeaseResponse.model_validate(resp.json())
            if len(granted.limits) != len(names):  # strict: never run on a limit that was silently skipped
                client.release_concurrency_slots_with_lease(granted.lease_id)
                raise RuntimeError(f"host lock limits missing on the Prefect server: {names}")
            return granted.lease_id
        except PrefectHTTPStatusError as exc:
            if exc.response.status_code != 423:  # 423 Locked: held by another
                raise
        reclaim_dead(client, names)
        if time.monotonic() - start > max_wait_s:
            raise SpecdiagError(f"gave up after {max_wait_s:.0f} s waiting for {what} ({', '.join(names)}), held by "
                                f"{holders(names)}: stop that diagnosis, or raise lock_wait_s of the host")
        if time.monotonic() >= next_print:
            next_print += progress_s
            print(f"waiting {time.monotonic() - start:.0f} s for {what}, held by another diagnosis "
                  f"({', '.join(names)}); this one queues until that server stops")
        time.sleep(POLL_S)


class Lapse:
    """A held lock's leases, watched: lapsed once one of them can no longer be renewed (the Prefect server dropped it,
    or renewals failed for so long that it may have expired). A lapsed lock protects nothing: another diagnosis may
    take the host. The arm then stops its server (on_lapse) rather than run unprotected, and fails naming why."""

    def __init__(self):
        self.event, self.why, self._calls, self._lock = threading.Event(), "", [], threading.Lock()

    def on_lapse(self, call) -> None:
        """Call CALL() when the lease lapses (at once if it already has)."""
        with self._lock:
            self._calls.append(call)
            now = self.event.is_set()
        if now:
            call()

    def lapse(self, why: str) -> None:
        with self._lock:
            if self.event.is_set():
                return
            self.why = why
            self.event.set()
            calls = list(self._calls)
        print(f"host lock lost: {why}")
        for call in calls:
            try:
                call()
            except Exception as exc:  # the next call still runs; the arm's end stops what is left
                print(f"after the host lock was lost: {exc}")

    def check(self) -> None:
        """Raise LeaseLapsed if the lease has lapsed (before a step that starts or changes a server)."""
        if self.event.is_set():
            raise LeaseLapsed(self.why)


class LeaseLapsed(SpecdiagError):
    pass


@contextmanager
def _slots(names: list[str], occupy: int, what: str, progress_s: float, max_wait_s: float, lapse: Lapse):
    """Hold the slots under a lease renewed while held, with a record of the holder on this machine: a waiter that
    finds the holder dead (SIGKILL, OOM) gives the slots back. A lease that cannot be renewed lapses (Lapse)."""
    with get_client(sync_client=True) as client:
        lease = _acquire(client, names, occupy, what, progress_s, max_wait_s)
    record, held = _holders() / f"{lease}.json", threading.Event()
    registry.write_atomic(record, json.dumps({**registry.owner(), "names": names, "occupy": occupy,
                                              "lease": str(lease), "api": _api(), "since": time.time()}))

    def renew():
        renewed = time.monotonic()
        while not held.wait(RENEW_S):
            try:
                with get_client(sync_client=True) as client:
                    client.renew_concurrency_lease(lease, LEASE_S)
                renewed = time.monotonic()
            except PrefectHTTPStatusError as exc:
                if exc.response.status_code in (404, 410):  # the server holds no such lease: expired, or revoked
                    return lapse.lapse(f"the Prefect server no longer holds the lease on {', '.join(names)} (it "
                                       f"expired or was revoked): another diagnosis may take the host")
                print(f"could not renew the host lock's lease: {exc}")
            except Exception as exc:  # a blip; the next renewal may pass
                print(f"could not renew the host lock's lease: {exc}")
            if time.monotonic() - renewed > LEASE_S - RENEW_S:  # it may expire before the next try
                return lapse.lapse(f"the lease on {', '.join(names)} was not renewed for "
                                   f"{time.monotonic() - renewed:.0f} s (Prefect server unreachable): it may have expired")
    threading.Thread(target=renew, daemon=True).start()
    try:
        yield
    finally:
        held.set()
        with get_client(sync_client=True) as client:
            client.release_concurrency_slots_with_lease(lease)
        record.unlink(missing_ok=True)


def _holders() -> Path:
    path = cache_dir() / "locks"
    path.mkdir(parents=True, exist_ok=True)
    return path


def holders(names: list[str]) -> str:
    """Who holds these slots, as this machine's records say."""
    found = []
    for record in _holders().glob("*.json"):
        try:
            entry = json.loads(record.read_text())
            if set(entry["names"]) & set(names):
                found.append(f"pid {entry['owner_pid']} on {entry['machine']} since "
                             f"{time.strftime('%H:%M:%S', time.localtime(entry['since']))}")
        except (OSError, ValueError, KeyError, TypeError):
            continue
    return ", ".join(found) or "a diagnosis of another machine (no record here)"


def reclaim_dead(client, names: list[str]) -> None:
    """Give back the slots on NAMES of holders on this machine whose process is gone. A lease on the Prefect server
    we share is released by its id (so a server that expires leases does not give it back twice); one that lived on
    the dead process's own temporary server (whose database the temporary servers share) is gone with it, and its
    slots are decremented directly. A record from some other server is only dropped."""
    ours = _api()
    for record in _holders().glob("*.json"):
        try:
            entry = json.loads(record.read_text())
            if not set(entry["names"]) & set(names) or registry.owner_alive(entry):  # another machine's: alive
                continue
            if entry["api"] == ours:
                client.release_concurrency_slots_with_lease(UUID(entry["lease"]))
            elif entry["api"].startswith("ephemeral:") and ours.startswith("ephemeral:"):
                client.release_concurrency_slots(entry["names"], entry["occupy"], max(1.0, time.time() - entry["since"]))
            else:
                entry = None  # another server's lease: not ours to give back
        except (OSError, ValueError, KeyError, TypeError):  # unreadable or from an older specdiag: not evidence
            entry = None
        record.unlink(missing_ok=True)
        if entry:
            print(f"gave back {', '.join(entry['names'])}: diagnosis pid {entry['owner_pid']} died holding them")


@dataclass
class Held:
    """A host lock held: how long it was waited for, and its Lapse."""

    wait_s: float
    lapse: Lapse


@contextmanager
def host_lock(host: HostConfig, port: int, progress_s: float = 15.0):
    """Hold this server's GPUs and port on the host; yields a Held (the seconds spent waiting, the leases' Lapse)."""
    share, exclusive = lock_names(host, port)
    _ensure_limit(share, HOST_SHARES)
    for name in exclusive:
        _ensure_limit(name)
    start, lapse = time.monotonic(), Lapse()
    gpus = f"GPUs {','.join(map(str, sorted(set(host.gpus))))}" if host.gpus else "all GPUs"
    cap = host.lock_wait_s
    with _slots([share], 1 if host.gpus else HOST_SHARES, f"{gpus} of host {host.name}", progress_s, cap, lapse), \
            _slots(exclusive, 1, f"{gpus} and port {port} of host {host.name}", progress_s, cap, lapse):
        yield Held(time.monotonic() - start, lapse)
