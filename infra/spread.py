"""One diagnosis's arms spread over several hosts, through Prefect's own machinery.

The arm flow (flows/arm.py:run_arm) is a deployment, `arm/spread` in prefect.yaml, in a work pool with one work
queue per host, `host-<name>`. Each queue is polled by one worker started with `--limit 1` (on the host itself, or
anywhere that reaches it over SSH), so a host serves one arm at a time. The diagnosis hands each next arm to
whichever host is free (run_deployment into that host's queue): a slow arm on one host does not hold the others
back. Every worker writes to the MLflow tracking server the diagnosis passes it, and the arm is read back from
there. The per-host lock (infra/hostlock.py) still holds: it lives on the same Prefect server.
"""
from __future__ import annotations

import contextvars
import queue
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timezone
from typing import Callable, TypeVar

import httpx
from prefect.client.orchestration import get_client
from prefect.client.schemas.objects import FlowRun, StateType
from prefect.deployments import run_deployment
from prefect.exceptions import ObjectNotFound
from prefect.settings import PREFECT_API_URL
from prefect.states import Cancelling, Crashed

from infra.config import PROJECT_ROOT, Profile, SpecdiagError, load_profile

POLL_S = 1.0  # how often a dispatched arm's flow run is read back
WORKER_SILENT_S = 90.0  # a queue polled longer ago than this has no live worker
LOST_S = 300.0  # a taken run whose worker is this silent is lost with it (a worker killed alone lets its run finish)
CHECK_S = 10.0  # how often a waiting diagnosis asks whether the worker is still there
T, R = TypeVar("T"), TypeVar("R")


def queue_name(host: str) -> str:
    return f"host-{host}"


def worker_command(pool: str, host: str) -> str:
    """The queue (a worker does not create it) and its worker, as a user starts them."""
    return (f"prefect work-queue create {queue_name(host)} --pool {pool}; SPECDIAG_HOME={PROJECT_ROOT} "
            f"prefect worker start --pool {pool} --work-queue {queue_name(host)} --limit 1")


def check(cfg: Profile, tracking_uri: str) -> None:
    """Before any arm: a Prefect server and an MLflow server that every worker reaches, the arm deployment, and a
    live worker on each host's queue. Each refusal names the command that fixes it."""
    if not PREFECT_API_URL.value():
        raise SpecdiagError("spreading arms over hosts needs a Prefect server its workers reach: start one "
                            "(`prefect server start`) and set PREFECT_API_URL, here and on each worker")
    if not tracking_uri.startswith(("http://", "https://")):
        raise SpecdiagError(f"spreading arms over hosts needs an MLflow tracking server every worker writes to, not "
                            f"{tracking_uri}: start one (`mlflow server --backend-store-uri sqlite:///mlflow.db "
                            "--artifacts-destination ./mlartifacts --host 0.0.0.0`) and set MLFLOW_TRACKING_URI")
    spread = cfg.spread
    if not spread.insecure_services:
        refuse_open(PREFECT_API_URL.value(), tracking_uri)
    with get_client(sync_client=True) as client:
        try:
            client.read_deployment_by_name(spread.deployment)
        except ObjectNotFound:
            raise SpecdiagError(f"no Prefect deployment {spread.deployment}: run `prefect --no-prompt deploy "
                                f"--name {spread.deployment.split('/')[-1]}` in {PROJECT_ROOT}") from None
    silent = unpolled(spread.pool, spread.hosts)
    if silent:
        raise SpecdiagError(f"no worker serves host {silent[0]}: work queue {queue_name(silent[0])} of pool "
                            f"{spread.pool} is not polled. Start one: {worker_command(spread.pool, silent[0])}")


def refuse_open(api_url: str, tracking_uri: str) -> None:
    """A Prefect or MLflow server that answers a request without credentials lets anyone who reaches it start arms,
    and so run code on the workers and the hosts: refused, naming the fix."""
    probes = {"Prefect server": (f"{api_url.rstrip('/')}/admin/version", "PREFECT_SERVER_API_AUTH_STRING on the "
                                 "server, PREFECT_API_AUTH_STRING here and on each worker"),
              "MLflow server": (f"{tracking_uri.rstrip('/')}/api/2.0/mlflow/experiments/search?max_results=1",
                                "`mlflow server --app-name basic-auth`, MLFLOW_TRACKING_USERNAME and "
                                "MLFLOW_TRACKING_PASSWORD here and on each worker")}
    for name, (url, fix) in probes.items():
        try:
            status = httpx.get(url, timeout=10).status_code  # no credentials, on purpose
        except httpx.HTTPError as exc:
            raise SpecdiagError(f"the {name} at {url} does not answer: {exc}") from None
        if status < 400:
            raise SpecdiagError(f"the {name} at {url} answers without credentials: anyone who reaches it can run "
                                f"code on the workers and hosts. Turn on its authentication ({fix}; "
                                "docs/services.md), or pass --insecure-services on a network you trust")


def vet(cfg: Profile, arms: list) -> None:
    """On a worker: a run's parameters may not choose code. What does (the engine's Python and env, the hosts and their
    settings, the target's model and server args such as --trust-remote-code, a drafter's engine_env) must be what
    the worker's own copy of the profile says; anyone who can start a flow run could otherwise run code here and,
    through this worker's SSH keys, on the hosts."""
    if not cfg.source or not (PROJECT_ROOT / cfg.source).exists():
        raise SpecdiagError(f"this worker has no profile {cfg.source!r} (under {PROJECT_ROOT}): a spread arm runs only "
                            "from a profile on the worker's own disk; copy it there")
    disk = load_profile(str(PROJECT_ROOT / cfg.source))
    host = disk.hosts.get(cfg.host.name)
    drafters = {a.name: (a.spec.engine_env if a.spec else {}) for a in arms}
    expected = {a.name: disk.drafters[a.drafter].engine_env if a.drafter in disk.drafters else {} for a in arms}
    checks = {"engine": (cfg.engine, disk.engine), "hosts": (cfg.hosts, disk.hosts), "host": (cfg.host, host),
              "target.model": (cfg.target.model, disk.target.model), "target.args": (cfg.target.args, disk.target.args),
              "drafters' engine_env": (drafters, expected)}
    differ = [name for name, (asked, own) in checks.items() if _plain(asked) != _plain(own)]
    if differ:
        raise SpecdiagError(f"refused: this run's {', '.join(differ)} differ from the worker's profile {cfg.source}; "
                            "settings that choose code come only from the profile on the worker's disk")


def _plain(value):
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return value.model_dump() if hasattr(value, "model_dump") else value


def unpolled(pool: str, hosts: list[str]) -> list[str]:
    """The hosts whose queue no worker polled in the last WORKER_SILENT_S (or that have none)."""
    return [h for h in hosts if silent_for(pool, h) > WORKER_SILENT_S]


def silent_for(pool: str, host: str) -> float:
    """Seconds since a worker last polled HOST's queue; infinite where none ever did (or there is no such queue)."""
    with get_client(sync_client=True) as client:
        try:
            polled = client.read_work_queue_by_name(queue_name(host), work_pool_name=pool).last_polled
        except ObjectNotFound:
            polled = None
    return float("inf") if polled is None else (datetime.now(timezone.utc) - polled).total_seconds()


def dispatch(hosts: list[str], items: list[T], run: Callable[[T, str], R]) -> list[R]:
    """run(item, host) for every item, in order, each on whichever host is free first; results in items' order."""
    free: queue.Queue[str] = queue.Queue()
    for host in hosts:
        free.put(host)

    def one(item: T) -> R:
        host = free.get()
        try:
            return run(item, host)
        finally:
            free.put(host)

    pool = ThreadPoolExecutor(len(hosts), thread_name_prefix="spread")
    try:  # each thread in a copy of this flow's context: its flow runs are this flow run's subflows
        futures = [pool.submit(contextvars.copy_context().run, one, item) for item in items]
        return [f.result() for f in futures]
    finally:
        pool.shutdown(wait=False, cancel_futures=True)


class RemoteRuns:
    """Flow runs of the arm deployment started by this diagnosis: waited for, and cancelled if it is interrupted."""

    def __init__(self, deployment: str, pool: str):
        self.deployment, self.pool, self.live, self._lock = deployment, pool, set(), threading.Lock()

    def run(self, host: str, parameters: dict, name: str) -> FlowRun:
        """The arm's flow run on HOST's queue, once it ended (the worker runs it; this only waits)."""
        flow_run = run_deployment(self.deployment, parameters=parameters, work_queue_name=queue_name(host),
                                  timeout=0, tags=[f"host:{host}"], flow_run_name=f"arm-{name}@{host}")
        with self._lock:
            self.live.add(flow_run.id)
        try:
            with get_client(sync_client=True) as client:
                checked = time.monotonic()
                while not (flow_run := client.read_flow_run(flow_run.id)).state.is_final():
                    time.sleep(POLL_S)
                    if time.monotonic() - checked > CHECK_S:
                        checked, lost = time.monotonic(), self.lost(host, flow_run)
                        if lost:  # ended here, so that the arm fails saying why (flows/arm._read_back)
                            client.set_flow_run_state(flow_run.id, Crashed(message=lost), force=True)
            return flow_run
        except BaseException:  # Ctrl-C while this thread waits (a --confirm arm): its worker stops it too
            self.cancel({flow_run.id})
            raise
        finally:
            with self._lock:
                self.live.discard(flow_run.id)

    def lost(self, host: str, flow_run: FlowRun) -> str | None:
        """Why the flow run will never end, if its worker is gone: no worker polled HOST's queue in WORKER_SILENT_S,
        and the run was never taken (or, taken, its worker has been silent for LOST_S: a host or container gone)."""
        silent = silent_for(self.pool, host)
        taken = flow_run.state.type not in (StateType.SCHEDULED, StateType.PENDING)
        if silent <= (LOST_S if taken else WORKER_SILENT_S):
            return None
        return (f"no worker polled queue {queue_name(host)} of pool {self.pool} for {silent:.0f} s: the worker of host "
                f"{host} is gone{' while it ran the arm' if taken else ''}. Start one: {worker_command(self.pool, host)}")

    def cancel(self, which: set | None = None) -> None:
        """Every arm still running (or those of `which`): its worker stops the flow run, whose teardown stops its
        server."""
        with self._lock, get_client(sync_client=True) as client:
            for run_id in self.live if which is None else self.live & which:
                client.set_flow_run_state(run_id, Cancelling(message="the diagnosis was interrupted"), force=True)
