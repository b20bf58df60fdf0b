"""Arms of a diagnosis: baseline, candidate, control, extras; each resolved to the exact server to launch.

All resolution happens before any server starts, so bad input fails in seconds, not after a 25-minute load.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass, field, replace
from pathlib import Path, PurePosixPath
from typing import Callable, Literal

from infra import embedded, registry, secrets, swap, vllm
from infra.eagle3 import with_aux_ids, with_mapping
from infra.executor import LocalExecutor, executor_for
from infra.config import PROJECT_ROOT, BenchConfig, DrafterConfig, Profile, SpecdiagError

Role = Literal["baseline", "candidate", "control", "extra", "probe", "confirm"]


@dataclass(frozen=True)
class Arm:
    name: str
    role: Role
    drafter: str | None  # registry name, a checkpoint path, or None for the baseline
    spec: DrafterConfig | None
    probe: str = ""  # the probe that derived this arm from the candidate
    bench: tuple[tuple[str, object], ...] = ()  # benchmark settings of this arm only (raw_prompts, temperature...)
    target_args: tuple[str, ...] | None = None  # server arguments for this arm only (graphs probe)
    mapping_from: str | None = None  # take d2t/t2d from this checkpoint (control_mapping probe)
    position_limit: int = 0  # the positions its drafter declares, where served past them (static check position_limit)
    aux_ids: tuple[int, ...] | None = None  # feed its head these target layers instead (aux_layers probe)
    swap_aux: tuple[int, ...] | None = None  # the target layers to feed its head once swapped in (infra/swap.Shape)

    def server_args(self, profile: Profile) -> list[str]:
        """The target's server arguments as this arm serves it."""
        return list(self.target_args if self.target_args is not None else profile.target.args)

    def bench_config(self, profile: Profile) -> BenchConfig:
        """The profile's benchmark with this arm's own settings."""
        return profile.bench.model_copy(update=dict(self.bench))


@dataclass(frozen=True)
class ServerPlan:
    arm: str
    argv: list[str]
    env: dict[str, str]
    port: int
    log_path: str
    params: dict[str, str] = field(default_factory=dict)  # what the arm's MLflow run records


def infer_method(path: Path) -> str:
    """The speculative method vLLM serves a checkpoint folder with, from its config (infra/checkpoints.FORMATS)."""
    from infra.checkpoints import detect_format, read_json
    from infra.executor import LocalExecutor

    if not (path / "config.json").exists():
        raise SpecdiagError(f"{path} has no config.json: pass a drafter checkpoint folder or a registry name")
    return detect_format(read_json(LocalExecutor(), str(path / "config.json")))[1]


def _looks_like_path(ref: str) -> bool:
    return ref.startswith(("/", "./", "../", "~")) or Path(ref).exists()


def resolve_arm(profile: Profile, ref: str, role: Role) -> Arm:
    if ref in profile.drafters:
        return Arm(ref, role, ref, profile.drafters[ref])
    if _looks_like_path(ref):
        path = Path(ref).expanduser()
        if not path.exists():
            raise SpecdiagError(f"drafter path {path} does not exist")
        spec = DrafterConfig(method=infer_method(path), model=str(path.resolve()),
                             num_speculative_tokens=_default_k(profile))
        return Arm(path.name, role, str(path.resolve()), spec)
    raise SpecdiagError(f"unknown drafter {ref!r}; known drafters in profile {profile.name!r}: "
                        f"{', '.join(sorted(profile.drafters))} (or pass a checkpoint folder path)")


def _default_k(profile: Profile) -> int:
    ks = [d.num_speculative_tokens for d in profile.drafters.values()]
    return max(set(ks), key=ks.count) if ks else 4


def plan_arms(profile: Profile) -> list[Arm]:
    if not profile.drafter:
        raise SpecdiagError(f"no candidate drafter: pass --drafter NAME (known: {', '.join(sorted(profile.drafters))})")
    arms = [Arm("baseline", "baseline", None, None), resolve_arm(profile, profile.drafter, "candidate")]
    if profile.control:
        arms.append(resolve_arm(profile, profile.control, "control"))
    arms += [resolve_arm(profile, ref, "extra") for ref in profile.arms]
    arms += probe_arms(profile, arms[1], arms[2] if profile.control else None)
    names = [a.name for a in arms]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if profile.control and arms[1].name == arms[2].name:  # e.g. --drafter aqmedai on a profile whose control it is
        raise SpecdiagError(f"{arms[1].name!r} is both the candidate (--drafter) and the profile's control: name "
                            "another control with --control NAME, or run without one (--no-control)")
    if dupes:
        raise SpecdiagError(f"arm(s) {', '.join(dupes)} appear twice: each arm must be distinct (drop it from --arms)")
    return arms


def _k_sweep(profile: Profile, cand: Arm, ctrl: Arm | None) -> list[Arm]:
    """The candidate at each other k of profile.k_sweep: the speed model and the verdict read measured vs predicted."""
    return [Arm(f"{cand.name}@k={k}", "probe", cand.drafter, cand.spec.model_copy(
        update={"num_speculative_tokens": k}), "k_sweep") for k in profile.k_sweep
        if k != cand.spec.num_speculative_tokens]


def _graphs(profile: Profile, cand: Arm, ctrl: Arm | None) -> list[Arm]:
    """CUDA graphs / torch.compile on or off (--enforce-eager), everything else equal."""
    eager = "--enforce-eager" in profile.target.args
    args = [a for a in profile.target.args if a != "--enforce-eager"] if eager \
        else [*profile.target.args, "--enforce-eager"]
    return [Arm(f"{cand.name}@{'graphs' if eager else 'eager'}", "probe", cand.drafter, cand.spec, "graphs",
                target_args=tuple(args))]


def _raw_prompts(profile: Profile, cand: Arm, ctrl: Arm | None) -> list[Arm]:
    """The same prompts without (or with) the chat template."""
    other = "completions" if profile.bench.endpoint == "chat" else "chat"
    return [Arm(f"{cand.name}@{'raw' if other == 'completions' else 'chat'}", "probe", cand.drafter, cand.spec,
                "raw_prompts", bench=(("endpoint", other),))]


def _temperature(profile: Profile, cand: Arm, ctrl: Arm | None) -> list[Arm]:
    """Greedy against the served sampling temperature (bench.temperature), or T=1 when the benchmark is greedy."""
    other = 0.0 if profile.bench.temperature > 0 else 1.0
    return [Arm(f"{cand.name}@T={other:g}", "probe", cand.drafter, cand.spec, "temperature",
                bench=(("temperature", other),))]


def _thinking(profile: Profile, cand: Arm, ctrl: Arm | None) -> list[Arm]:
    """A reasoning target's chat template with thinking switched the other way (bench.thinking_kwarg: the template's
    variable, e.g. Qwen3's `enable_thinking`; a template without it is unchanged)."""
    key, kwargs = profile.bench.thinking_kwarg, dict(profile.bench.chat_template_kwargs)
    if profile.bench.endpoint != "chat":
        raise SpecdiagError("probe thinking switches a chat-template kwarg: it needs bench.endpoint chat")
    kwargs[key] = not kwargs.get(key, True)
    return [Arm(f"{cand.name}@{key}={str(kwargs[key]).lower()}", "probe", cand.drafter, cand.spec, "thinking",
                bench=(("chat_template_kwargs", kwargs),))]


def _control_mapping(profile: Profile, cand: Arm, ctrl: Arm | None) -> list[Arm]:
    """The candidate head with the control's d2t/t2d."""
    if not ctrl or cand.spec.method != "eagle3" or ctrl.spec.method != "eagle3":
        raise SpecdiagError("probe control_mapping swaps in the control's d2t/t2d: it needs an EAGLE-3 "
                            "candidate and an EAGLE-3 control (--control)")
    return [Arm(f"{cand.name}@control-mapping", "probe", cand.drafter, cand.spec, "control_mapping",
                mapping_from=ctrl.spec.model)]


def _aux_layers(profile: Profile, cand: Arm, ctrl: Arm | None) -> list[Arm]:
    """The candidate head fed other target layers than its config names: the engine's default (2, N/2, N-3), its own
    ids -1 and +1 (the off-by-one conventions between trainers and engines), and the control's. On an eager server
    each is swapped into the candidate's, a window rather than a load: served, not only offline (a 1T target without
    hidden-state dumps has no offline evaluation)."""
    from infra import checkpoints

    if cand.spec.method != "eagle3":
        raise SpecdiagError("probe aux_layers feeds an EAGLE-3 head other target layers: it needs an EAGLE-3 candidate")
    if profile.host.kind != "local":
        raise SpecdiagError("probe aux_layers writes a config naming other layers beside the head: it needs the "
                            "checkpoint on this machine (host local), as control_mapping does")
    fs = LocalExecutor()
    layers = checkpoints.read_target(fs, resolved_target(profile)).num_layers
    own = tuple(checkpoints.read_drafter(fs, embedded.resolve(cand.spec.model), "eagle3").engine_aux_ids(layers))
    options = [(2, layers // 2, layers - 3), tuple(i - 1 for i in own), tuple(i + 1 for i in own)]
    if ctrl and ctrl.spec.method == "eagle3":
        options.append(tuple(checkpoints.read_drafter(fs, embedded.resolve(ctrl.spec.model), "eagle3")
                             .engine_aux_ids(layers)))
    unique = list(dict.fromkeys(tuple(sorted(set(o))) for o in options))
    return [Arm(f"{cand.name}@aux={','.join(map(str, ids))}", "probe", cand.drafter, cand.spec, "aux_layers",
                aux_ids=ids) for ids in unique if ids != own and all(0 <= i < layers for i in ids)]


# Each probe: the candidate again with one thing changed, so that one measured difference names one cause
# (tasks/verdict/rules.py: probes). Adding a probe is adding an entry here and its name to Profile.probes.
PROBES = {"k_sweep": _k_sweep, "graphs": _graphs, "raw_prompts": _raw_prompts, "temperature": _temperature,
          "thinking": _thinking, "control_mapping": _control_mapping, "aux_layers": _aux_layers}


def probe_arms(profile: Profile, cand: Arm, ctrl: Arm | None) -> list[Arm]:
    """The probes asked for. Under --confirm, for an EAGLE-3 candidate on this machine, also the served interventions
    the verdict's vocabulary and aux-layer causes imply: the control's mapping (with an EAGLE-3 control) and, on an
    eager server, where they are swapped in, the other aux layers. Each is a window on the candidate's server rather
    than a load after the verdict; the verdict reads them, and tasks/confirm.fix_arm judges the fix from them. On a
    target without hidden-state dumps they are the only way to confirm either cause."""
    probes = list(profile.probes)
    if profile.confirm and cand.spec and cand.spec.method == "eagle3" and profile.host.kind == "local":
        if ctrl and ctrl.spec and ctrl.spec.method == "eagle3":
            probes.append("control_mapping")
        if "--enforce-eager" in profile.target.args:
            probes.append("aux_layers")
    return [arm for probe in dict.fromkeys(probes) for arm in PROBES[probe](profile, cand, ctrl)]


def same_server(a: Arm, b: Arm) -> bool:
    """Whether two arms' servers are the same command: the same drafter served the same way on the same target
    arguments. A probe that changes only the benchmark (raw_prompts, temperature, thinking) serves the candidate's."""
    return (a.spec, a.target_args, a.mapping_from, a.aux_ids) == (b.spec, b.target_args, b.mapping_from, b.aux_ids)


def shared_servers(arms: list[Arm], may_ride: Callable[[Arm], bool], keys: dict[str, str] | None = None
                   ) -> list[list[Arm]]:
    """The arms grouped by server, each group in the order its first arm comes; one load serves each group.
    An arm rides on the first earlier group whose server is its own (may_ride: one whose speed the verdict does not
    judge, since the server has served the same prompts before it), or is swapped into the first earlier group whose
    drafters have its shapes (keys: arm -> infra/swap.Shape.key, for the arms that may be swapped; the prefix cache is
    reset, so any arm may be). In a group the control goes first, then the candidate and the arms on its very server:
    the candidate's window then settles its comparison with the control's (tasks/verdict/asks.questions)."""
    keys, groups = keys or {}, []
    for arm in arms:
        host = next((g for g in groups if may_ride(arm) and same_server(g[0], arm)), None) if arm.spec else None
        if host is None and keys.get(arm.name):
            host = next((g for g in groups if keys.get(g[0].name) == keys[arm.name]), None)
        if host:
            host.append(arm)
        else:
            groups.append([arm])
    return [_control_first(g) for g in groups]


def _control_first(group: list[Arm]) -> list[Arm]:
    cand = next((a for a in group if a.role == "candidate"), None)
    rank = {a.name: 0 if a.role == "control" else 1 if a is cand else 2 if cand and same_server(a, cand) else 3
            for a in group}
    return sorted(group, key=lambda a: rank[a.name])  # stable: the plan's order within a rank


def validate_inputs(profile: Profile, arms: list[Arm]) -> None:
    """Before Prefect or any server starts: the host answers, and the paths the servers need are there on it, and
    its port is free (or held by another diagnosis's server, which this one queues behind)."""
    ex = executor_for(profile.host)
    where = "on this machine" if profile.host.kind == "local" else f"on host {profile.host.name}"
    try:
        refs = [(profile.target.model, "target model")] + [
            (a.spec.model, f"drafter {a.name!r}") for a in arms if a.spec and a.spec.model]
        for ref, what in refs:
            if _looks_like_path(ref) and not ref.startswith("embedded:") and not _exists(ex, ref):
                raise SpecdiagError(f"{what} path {ref} does not exist {where}")
        python = profile.engine_python
        if python and "/" in python and not _exists(ex, python):
            raise SpecdiagError(f"engine python {python} does not exist {where} (engine.python or hosts.<name>.python)")
        _check_port(ex, profile.server_port, where, f"--set hosts.{profile.host.name}.server_port=PORT"
                    if profile.host.server_port else "--port")
        _check_extra(ex, python if python or profile.host.kind != "local" else embedded.engine_python(), arms, where)
    finally:
        ex.close()


def _check_extra(ex, python: str | None, arms: list[Arm], where: str) -> None:
    """A drafter's extra speculative settings, checked by the engine's own rules on the host that serves them."""
    extras = {a.name: a.spec.extra for a in arms if a.spec and a.spec.extra}
    if not extras or not python:
        return
    try:
        refused = vllm.check_extra_settings(ex, python, extras)
    except RuntimeError as exc:
        print(f"{exc} {where}; the drafters' extra settings are checked when their servers start")
        return
    if refused:
        each = "; ".join(f"drafter {arm!r}: {', '.join(errors)}" for arm, errors in refused.items())
        raise SpecdiagError(f"the engine {where} refuses these extra speculative settings: {each}. Fix 'extra' under "
                            "the profile's drafters, or with --set drafters.NAME.extra.KEY=VALUE")


def _exists(ex, path: str) -> bool:
    if ex.host == LocalExecutor.host:
        return Path(path).expanduser().exists()
    return ex.run(["test", "-e", path], 30).returncode == 0


def _check_port(ex, port: int, where: str, flag: str) -> None:
    """flag: how to pick another port for this host (the host's own server_port, where it sets one, wins over
    --port)."""
    if ex.port_free(port):
        return
    ours = [e for e in registry.launched(ex.host) if e.get("port") == port]
    if not ours:
        raise SpecdiagError(f"port {port} is already in use {where} by a program specdiag did not start: stop it "
                            f"(`fuser {port}/tcp` shows it) or pick another port with {flag}")
    live = [e for e in ours if registry.owner_alive(e)]
    print(f"port {port} {where} is held by " + (
        f"the server of another diagnosis (pid {live[0]['owner_pid']}): this one queues behind it" if live
        else "a server left by a dead diagnosis: cleanup stops it before launch"))


def resolved_target(profile: Profile) -> str:
    return embedded.resolve(profile.target.model)


def resolved_drafters(arms: list[Arm]) -> list[Arm]:
    """The arms with 'embedded:' drafter references built and replaced by their paths (and probe checkpoints made)."""
    out = []
    for a in arms:
        if a.spec and a.spec.model:
            model = embedded.resolve(a.spec.model)
            if a.mapping_from:
                model = str(with_mapping(Path(model), Path(embedded.resolve(a.mapping_from))))
            if a.aux_ids:
                model = str(with_aux_ids(Path(model), a.aux_ids))
            a = replace(a, spec=a.spec.model_copy(update={"model": model}), mapping_from=None, aux_ids=None)
        out.append(a)
    return out


def run_dir(profile: Profile, diagnosis_id: str) -> str:
    """Where this diagnosis's server logs go on the host (a remote host resolves a relative one in the login dir)."""
    base = PurePosixPath(profile.host.workdir)
    if profile.host.kind == "local" and not base.is_absolute():
        base = PurePosixPath(PROJECT_ROOT) / base
    return str(base / diagnosis_id)


def local_dir(diagnosis_id: str) -> Path:
    """This machine's copy of a diagnosis's files (logs fetched from a remote host, offline-eval reports)."""
    path = PROJECT_ROOT / "runs" / diagnosis_id
    path.mkdir(parents=True, exist_ok=True)
    return path


def plan_server(profile: Profile, arm: Arm, workdir: str, swappable: bool = False) -> ServerPlan:
    """swappable: the server takes other drafters of its shapes while running (infra/swap.launch_args)."""
    python = profile.engine_python or embedded.engine_python()
    model = embedded.resolve(profile.target.model)
    drafter_path = embedded.resolve(arm.spec.model) if arm.spec and arm.spec.model else None
    spec_cfg = arm.spec.speculative_config(drafter_path) if arm.spec else None
    args = arm.server_args(profile)
    argv = vllm.server_argv(python, model, profile.server_port, args, spec_cfg,
                            profile.target.served_model_name, profile.engine.per_request_spec_metrics)
    pinned = {}
    if profile.host.cpus:  # every process of the server on these cores: a CPU host split in parts
        pinned = {"VLLM_CPU_OMP_THREADS_BIND": ",".join(map(str, profile.host.cpus))}
        argv = ["taskset", "-c", pinned["VLLM_CPU_OMP_THREADS_BIND"], *argv]
    env = vllm.server_env({**profile.engine_env, **pinned, **(arm.spec.engine_env if arm.spec else {})})
    if swappable:
        extra_args, extra_env = swap.launch_args(workdir)
        argv, env = argv + extra_args, {**env, **extra_env}
    safe = re.sub(r"[^\w.-]", "_", arm.name)
    params = {
        "arm_role": arm.role,
        "probe": arm.probe or "none",
        **{f"bench_{k}": json.dumps(v, sort_keys=True) if isinstance(v, dict) else str(v)
           for k, v in {"endpoint": profile.bench.endpoint, **dict(arm.bench)}.items()},
        "spec_method": arm.spec.method if arm.spec else "none",
        "num_speculative_tokens": str(arm.spec.num_speculative_tokens if arm.spec else 0),
        "drafter_path": drafter_path or "none",
        "speculative_config": json.dumps(spec_cfg, sort_keys=True) if spec_cfg else "none",
        "target_model": model,
        "host": profile.host.name,
    }
    if arm.spec and arm.spec.engine_env:
        params["engine_env"] = json.dumps(secrets.env(arm.spec.engine_env), sort_keys=True)
    return ServerPlan(arm.name, argv, env, profile.server_port, str(PurePosixPath(workdir) / f"{safe}.server.log"),
                      params)
