"""Swap the next arm's drafter into the running server, and check that the engine holds it before measuring."""
from __future__ import annotations

import time

import httpx
from prefect import task
from prefect.cache_policies import NO_CACHE

from infra import swap as engine
from infra.arms import Arm
from tasks.health import ServerDied, log_tail
from tasks.launch import Server


def _dies(server: Server, within_s: float = 3.0) -> bool:
    """Whether the server exits within a few seconds: a worker that crashed in the swap takes the API server down
    after the reply (a reset connection), and its log then holds the engine's reason."""
    end = time.monotonic() + within_s
    while server.executor.is_alive(server.process.pid):
        if time.monotonic() > end:
            return False
        time.sleep(0.2)
    return True


class SwapFailed(RuntimeError):
    """The engine refused the swap, or holds something else than the checkpoint afterwards."""


@task(name="swap-drafter", cache_policy=NO_CACHE)
def swap_drafter(server: Server, arm: Arm, timeout_s: float) -> float:
    """Seconds the swap took. A swap that fails, or leaves another d2t or other aux layers in place, fails the arm;
    the caller stops the server (its drafter is then in an unknown state) and loads the next arm afresh."""
    start, path = time.monotonic(), arm.spec.model
    want_d2t = engine.expected(server.executor, path)
    try:
        state = engine.swap(server.base_url, path, arm.swap_aux, timeout_s)
    except (httpx.HTTPError, engine.SwapRefused) as exc:
        if _dies(server):
            raise ServerDied(f"[{arm.name}] the server died during the swap after {time.monotonic() - start:.0f} s; "
                             f"log tail:\n{log_tail(server)}") from exc
        raise SwapFailed(f"the engine did not take {arm.name}'s drafter ({path}): {type(exc).__name__}: {exc}; "
                         f"its log ends:\n{log_tail(server, 20)}") from exc
    wrong = []
    if state.get("d2t_sum") != want_d2t:
        wrong.append(f"d2t checksum {state.get('d2t_sum')} where the checkpoint's is {want_d2t}")
    if arm.swap_aux and list(state.get("aux_layers") or []) != list(arm.swap_aux):
        wrong.append(f"aux layers {state.get('aux_layers')} fed where {list(arm.swap_aux)} were asked")
    if wrong:
        raise SwapFailed(f"after the swap the engine does not hold {arm.name}'s drafter: {'; '.join(wrong)}")
    seconds = time.monotonic() - start
    print(f"[{arm.name}] swapped into the running server in {seconds:.2f} s ({state.get('tensors')} tensors"
          + (f", aux layers {state.get('aux_layers')}" if arm.swap_aux else "") + ")")
    return seconds
