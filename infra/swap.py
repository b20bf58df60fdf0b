"""Swapping drafters into a running engine, vLLM's side of it: which arms can share one loaded server (decided before
any server starts, from each checkpoint's normalised description), how such a server is launched, and the swap.

A swap is vLLM's own machinery for changing a running engine's weights (RL frameworks use it): a worker extension
(`--worker-extension-cls`, infra/engine_side/specdiag_swap.py) reached through `POST /collective_rpc`, which exists
only with `VLLM_SERVER_DEV_MODE=1`. That endpoint calls any worker method: the server stays bound to its host's
127.0.0.1 (infra/vllm.server_argv), reached through the SSH tunnel on a remote host, never from the network.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

import httpx

from infra import checkpoints

EXTENSION = "specdiag_swap.SpecdiagSwap"
SOURCE = Path(__file__).parent / "engine_side" / "specdiag_swap.py"
# Methods whose drafter is a model the engine loads from the checkpoint, swappable in place. Others (ngram, suffix)
# have no weights; medusa/mlp heads are untested here.
WEIGHTED = ("eagle3", "eagle", "draft_model")
# Config fields that do not change what the engine builds: the aux ids are set on the running target instead.
NOT_BUILT = {"eagle_aux_hidden_state_layer_ids", "_name_or_path", "name_or_path", "transformers_version"}


@dataclass(frozen=True)
class Shape:
    """What one drafter arm's server is built from, as far as another drafter could be swapped into it."""

    key: str | None  # equal keys: one server serves both, by swapping; None: this arm needs its own load
    why: str = ""  # where key is None: why
    aux_ids: tuple[int, ...] | None = None  # the target layers the engine feeds this head (EAGLE-3)


def _config(cfg: dict) -> dict:
    out = {k: v for k, v in cfg.items() if k not in NOT_BUILT}
    if isinstance(out.get("eagle_config"), dict):
        out["eagle_config"] = {k: v for k, v in out["eagle_config"].items() if k not in NOT_BUILT}
    return out


def shape(fs, arm, profile, target_layers: int | None) -> Shape:
    """Method, k, every tensor's name, shape and dtype, the config the engine builds the head from, and the server's
    arguments and environment: two arms with equal keys differ only in weights (and, on an eager server, in the aux
    layers fed). Aux ids are part of the key where the server captures graphs: they baked the old ids in."""
    spec = arm.spec
    if not spec or not spec.model:
        return Shape(None, "no drafter weights to swap" if spec else "no drafter")
    if spec.method not in WEIGHTED:
        return Shape(None, f"method {spec.method} is not swapped (only {', '.join(WEIGHTED)})")
    try:
        head = checkpoints.read_drafter(fs, spec.model, spec.method)
        tensors = {k: (v.dtype, list(v.shape)) for k, v in checkpoints.tensor_index(fs, spec.model).items()}
    except Exception as exc:  # an unreadable checkpoint: its arm fails or loads on its own, never on a guess
        return Shape(None, f"its checkpoint could not be described ({type(exc).__name__}: {exc})")
    if spec.method == "eagle3" and not target_layers:  # its aux ids could not be set on the running target
        return Shape(None, "the target's layer count could not be read, so the layers to feed the head are unknown")
    args = arm.server_args(profile)
    eager = "--enforce-eager" in args
    aux = tuple(head.engine_aux_ids(target_layers)) if spec.method == "eagle3" else None
    built = {"method": spec.method, "k": spec.num_speculative_tokens, "extra": spec.extra,
             "engine_env": spec.engine_env, "args": args, "architecture": head.architecture,
             "config": _config(head.config), "tensors": tensors, "aux": None if eager else aux}
    return Shape(hashlib.sha256(json.dumps(built, sort_keys=True, default=str).encode()).hexdigest()[:16], "", aux)


def shapes(profile, arms, target: str) -> dict[str, Shape]:
    """Each drafter arm's Shape, read on the host that serves it (headers and configs only: seconds, no weights)."""
    from infra.executor import executor_for

    fs = executor_for(profile.host)
    try:
        try:
            layers = checkpoints.read_target(fs, target).num_layers
        except Exception:  # then no EAGLE-3 head is swapped (shape says why); draft models still are
            layers = None
        return {a.name: shape(fs, a, profile, layers) for a in arms if a.spec}
    finally:
        fs.close()


def plan_lines(groups: list, found: dict[str, Shape], enabled: bool, blocked: set[str] = frozenset()) -> list[str]:
    """One line per arm: how it will be served and, for each load, why no earlier server could take it."""
    from infra.arms import same_server
    lines, loaded = [], []
    for group in groups:
        head = group[0]
        if head.name in blocked:
            why = "stopped by a static check before any load"
        elif not head.spec:
            why = "no speculative decoding"
        elif not enabled:
            why = "swapping is off (swap.enabled=false)"
        elif found.get(head.name, Shape(None, "not described")).key is None:
            why = found.get(head.name, Shape(None, "not described")).why
        else:
            others = [f"not {h.name}'s: {differs(found[h.name], found[head.name])}" for h in loaded]
            why = "; ".join(others) or "the first drafter of its shapes"
        lines.append(f"{head.name}: {'no load' if head.name in blocked else 'fresh load'} ({why})")
        if head.spec and head.name not in blocked and found.get(head.name, Shape(None)).key:
            loaded.append(head)
        for i, arm in enumerate(group[1:], 1):
            twin = next((a for a in group[:i] if same_server(a, arm)), None)
            lines.append(f"{arm.name}: " + (f"on {twin.name}'s server (only the requests differ)" if twin
                                             else f"swapped into {head.name}'s server"))
    return lines


def differs(a: Shape, b: Shape) -> str:
    """Why arm b cannot be swapped into arm a's server, in a few words ("" when it can)."""
    if a.key is None or b.key is None:
        return (b.why or a.why) if b.key is None else "the server's own drafter is not swappable"
    return "" if a.key == b.key else "other shapes, method, k, config or server arguments"


def launch_args(workdir: str) -> tuple[list[str], dict[str, str]]:
    """What a server that takes swaps is launched with: the extension, importable from the run's folder on the host
    (nothing is written into the engine's own environment), and the dev-mode endpoints."""
    return ["--worker-extension-cls", EXTENSION], {"VLLM_SERVER_DEV_MODE": "1", "PYTHONPATH": module_dir(workdir)}


def module_dir(workdir: str) -> str:
    return str(PurePosixPath(workdir) / "engine_side")


def install(executor, workdir: str) -> None:
    """The extension's module into the run's folder on the host (an SFTP upload on a remote one)."""
    executor.put(SOURCE, str(PurePosixPath(module_dir(workdir)) / SOURCE.name))


def expected(fs, path: str) -> int | None:
    """The d2t checksum the engine must hold once PATH is swapped in (specdiag_swap._d2t_sum's), None without d2t."""
    import torch

    ref = checkpoints.tensor_index(fs, path, lambda k: k == "d2t").get("d2t")
    if ref is None:
        return None
    d2t = checkpoints.read_tensor(fs, ref).to(torch.int64)
    return int((d2t * (1 + torch.arange(len(d2t)))).sum().item())


class SwapRefused(RuntimeError):
    """The engine answered a swap step with an error."""


def _post(client: httpx.Client, base_url: str, path: str, **kw) -> dict:
    reply = client.post(base_url + path, **kw)
    if reply.status_code != 200:
        raise SwapRefused(f"POST {path} answered {reply.status_code}: {reply.text.strip()[-600:]}")
    return reply.json() if reply.content else {}


def swap(base_url: str, path: str, aux_ids: tuple[int, ...] | None, timeout_s: float) -> dict:
    """PATH's weights (and aux ids) into the running drafter, with no request in flight, then a fresh prefix cache
    (the draft KV cached for earlier requests came from the old head). Returns what the engine holds now."""
    with httpx.Client(timeout=httpx.Timeout(timeout_s, connect=10.0)) as client:
        _post(client, base_url, "/pause", params={"mode": "wait"})
        try:
            done = _post(client, base_url, "/collective_rpc", json={
                "method": "specdiag_swap_drafter", "args": [path, json.dumps(list(aux_ids)) if aux_ids else ""]})
        finally:
            _post(client, base_url, "/resume")
        _post(client, base_url, "/reset_prefix_cache")
    results = done.get("results") or []
    if not results or not isinstance(results[0], dict):
        raise SwapRefused(f"the engine's workers answered the swap with {done!r}")
    return results[0]
