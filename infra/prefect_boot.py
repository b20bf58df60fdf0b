"""Prefect's temporary server, started off the critical path. When no Prefect server is configured, a flow starts
Prefect's temporary server itself (SubprocessASGIServer), after every import and input check, and waits for it. Run
as a program, flows/diagnose.py starts the same server (the same uvicorn command and environment, less automations)
as its first act instead, before importing anything heavy, so that it boots on another core while the program
imports and checks its inputs; it is then the process's Prefect API (PREFECT_API_URL) to the end, Prefect's exit
hooks included, and stopped after them. A server configured in Prefect's profile wins: the early one is stopped
unused. Bad input stops it at once. It runs no automations (Prefect's triggers and actions services, 0.6 s of its
start on 2 cores and 0.15 s of its first request): a server that lives for one diagnosis has none to run; a user's
automations run on their own Prefect server, which the program then uses instead."""
from __future__ import annotations

import atexit
import importlib.util
import os
import socket
import subprocess
import sys
from pathlib import Path


TEMPORARY = "SPECDIAG_TEMPORARY_PREFECT_API"  # the API URL of this process's own temporary server (infra/hostlock.py)


def _die_with(parent: int):
    """For the child, before it runs: SIGTERM when PARENT dies, however it dies (Linux's PR_SET_PDEATHSIG). The
    server is started from the main thread, before any other: the death signal follows that thread, i.e. the process."""
    def arm() -> None:
        import ctypes
        ctypes.CDLL(None, use_errno=True).prctl(1, 15)  # PR_SET_PDEATHSIG, SIGTERM
        if os.getppid() != parent:  # the parent died before the line above
            os._exit(0)
    return arm


class EarlyServer:
    def __init__(self):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        app_dir = Path(importlib.util.find_spec("prefect").origin).parents[1]  # as SubprocessASGIServer runs it
        env = {**os.environ, "PREFECT_UI_ENABLED": "0", "PREFECT__SERVER_EPHEMERAL": "1", "PREFECT__SERVER_FINAL": "1",
               "PREFECT_SERVER_SERVICES_TRIGGERS_ENABLED": "false"}  # automations: see the module's docstring
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "uvicorn", "--app-dir", str(app_dir), "--factory",
             "prefect.server.api.server:create_app", "--host", "127.0.0.1", "--port", str(self.port),
             "--log-level", "error", "--lifespan", "on"], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            start_new_session=True,  # not stopped by the terminal's Ctrl-C: the flow's teardown still reports to it
            preexec_fn=_die_with(os.getpid()))  # nor left running by a SIGKILL of this process
        atexit.register(self.stop)  # registered before Prefect's own hooks, so it runs after them

    @property
    def api_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/api"

    def serve(self, timeout_s: float = 120) -> dict:
        """This server as the Prefect API for the rest of the process (Prefect's exit hooks included), unless
        Prefect's profile configures one: then that one, and this one stopped. Returns the settings the diagnosis's
        flow runs under: on this server, no flow-run heartbeat. A heartbeat is for a server that outlives the process
        (it marks a run that went silent crashed); this one does not, and the flow's end waits up to 1 s for the
        heartbeat thread's sleep."""
        from prefect.context import refresh_global_settings_context
        from prefect.settings import PREFECT_API_URL, PREFECT_FLOWS_HEARTBEAT_FREQUENCY

        from infra.browser import wait_http

        if PREFECT_API_URL.value():
            self.stop()
            return {}
        try:
            wait_http(f"{self.api_url}/health", self.proc, timeout_s, "Prefect's temporary server", every_s=0.1)
        except RuntimeError:  # Prefect's own start says why
            self.stop()
            return {}
        os.environ["PREFECT_API_URL"] = os.environ[TEMPORARY] = self.api_url
        refresh_global_settings_context()  # Prefect reads its settings at import: this makes it read them again
        return {PREFECT_FLOWS_HEARTBEAT_FREQUENCY: None}

    def stop(self) -> None:
        from infra.browser import stop  # imported here: this module is imported before anything heavy

        if self.proc.poll() is None:
            stop(self.proc, 10)


def early_server() -> EarlyServer | None:
    """The server booting from now, unless the environment names one (PREFECT_API_URL) or turns it off."""
    if os.environ.get("PREFECT_API_URL") or os.environ.get("PREFECT_SERVER_EPHEMERAL_ENABLED", "").lower() == "false":
        return None
    return EarlyServer()


OWNED = "specdiag-owned"  # a flow run tagged so also carries its process's tag, registry.owner_tag()


def owner_tags() -> tuple[str, ...]:
    """Tags for every flow run this process starts (`with prefect.tags(*owner_tags())`): its owner, so that the next
    diagnosis can end them if this process dies without ending them (SIGKILL, out of memory)."""
    from infra import registry
    return OWNED, registry.owner_tag(registry.owner())


def end_orphan_flow_runs() -> int:
    """Flow runs left RUNNING or PENDING by a specdiag process of this machine that is gone: ended CRASHED, saying
    why. A SIGKILLed diagnosis leaves them so in the database its temporary server shares with the next one's."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import (FlowRunFilter, FlowRunFilterState, FlowRunFilterStateType,
                                                FlowRunFilterTags)
    from prefect.client.schemas.objects import StateType
    from prefect.states import Crashed

    from infra import registry

    live = FlowRunFilterState(type=FlowRunFilterStateType(any_=[StateType.RUNNING, StateType.PENDING]))
    ended = 0
    with get_client(sync_client=True) as client:
        for run in client.read_flow_runs(flow_run_filter=FlowRunFilter(tags=FlowRunFilterTags(all_=[OWNED]),
                                                                       state=live)):
            owner = next(filter(None, map(registry.owner_of, run.tags)), None)
            if owner is None or registry.owner_alive(owner):
                continue
            client.set_flow_run_state(run.id, Crashed(message=f"its process (pid {owner['owner_pid']} on "
                                                      f"{owner['machine']}) died without ending it"), force=True)
            ended += 1
    if ended:
        print(f"ended {ended} flow run(s) left running by a diagnosis that died: CRASHED")
    return ended
