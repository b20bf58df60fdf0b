"""Arms of a diagnosis: baseline, candidate, control, extras; each resolved to the exact server to launch.

All resolution happens before any server starts, so bad input fails in seconds, not after a 25-minute load.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Literal

from infra import embedded, vllm
from infra.executor import LocalExecutor
from infra.config import PROJECT_ROOT, DrafterConfig, Profile, SpecdiagError

Role = Literal["baseline", "candidate", "control", "extra"]


@dataclass(frozen=True)
class Arm:
    name: str
    role: Role
    drafter: str | None  # registry name, a checkpoint path, or None for the baseline
    spec: DrafterConfig | None


@dataclass(frozen=True)
class ServerPlan:
    arm: str
    argv: list[str]
    env: dict[str, str]
    port: int
    log_path: str
    params: dict[str, str] = field(default_factory=dict)  # what the arm's MLflow run records


def infer_method(path: Path) -> str:
    """An EAGLE-3 config -> eagle3; a full causal LM -> draft_model."""
    cfg_file = path / "config.json"
    if not cfg_file.exists():
        raise SpecdiagError(f"{path} has no config.json: pass a drafter checkpoint folder or a registry name")
    try:
        cfg = json.loads(cfg_file.read_text())
    except json.JSONDecodeError as exc:
        raise SpecdiagError(f"{cfg_file} is not valid JSON: {exc}") from None
    archs = cfg.get("architectures") or []
    algo = str((cfg.get("speculators_config") or {}).get("algorithm", ""))
    if any("eagle3" in a.lower() for a in archs) or "eagle_aux_hidden_state_layer_ids" in cfg \
            or "eagle3" in algo.lower():
        return "eagle3"
    if any(a.lower().endswith("eagle") for a in archs) or algo.lower() == "eagle":
        return "eagle"
    if any(a.endswith("ForCausalLM") for a in archs):
        return "draft_model"
    raise SpecdiagError(f"cannot tell the drafter type of {path} (architectures={archs}): "
                        f"add it to the profile's drafters with an explicit method")


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
    names = [a.name for a in arms]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise SpecdiagError(f"arm(s) {', '.join(dupes)} appear twice: each arm must be distinct")
    return arms


def _check_local_path(ref: str, what: str) -> None:
    if _looks_like_path(ref) and not Path(ref).expanduser().exists():
        raise SpecdiagError(f"{what} path {ref} does not exist")


def validate_local_inputs(profile: Profile, arms: list[Arm]) -> None:
    """Paths that must exist on this machine (the local host); remote hosts check on their side."""
    if profile.host.kind != "local":
        return
    _check_local_path(profile.target.model, "target model")
    for arm in arms:
        if arm.spec and arm.spec.model and not arm.spec.model.startswith("embedded:"):
            _check_local_path(arm.spec.model, f"drafter {arm.name!r}")
    if profile.engine.python and "/" in profile.engine.python and not Path(profile.engine.python).exists():
        raise SpecdiagError(f"engine.python {profile.engine.python} does not exist")
    if not LocalExecutor().port_free(profile.target.port):
        raise SpecdiagError(f"port {profile.target.port} is already in use on this machine: stop what holds it "
                            f"(`fuser {profile.target.port}/tcp` shows it) or pick another with --port")


def resolved_target(profile: Profile) -> str:
    return embedded.resolve(profile.target.model)


def resolved_drafters(arms: list[Arm]) -> list[Arm]:
    """The arms with 'embedded:' drafter references built and replaced by their paths."""
    return [replace(a, spec=a.spec.model_copy(update={"model": embedded.resolve(a.spec.model)}))
            if a.spec and a.spec.model else a for a in arms]


def run_dir(profile: Profile, diagnosis_id: str) -> Path:
    base = Path(profile.host.workdir)
    base = base if base.is_absolute() else PROJECT_ROOT / base
    return base / diagnosis_id


def plan_server(profile: Profile, arm: Arm, workdir: Path) -> ServerPlan:
    python = profile.engine.python or embedded.engine_python()
    model = embedded.resolve(profile.target.model)
    drafter_path = embedded.resolve(arm.spec.model) if arm.spec and arm.spec.model else None
    spec_cfg = arm.spec.speculative_config(drafter_path) if arm.spec else None
    argv = vllm.server_argv(python, model, profile.target.port, profile.target.args, spec_cfg,
                            profile.target.served_model_name)
    env = vllm.server_env(profile.engine.env)
    safe = re.sub(r"[^\w.-]", "_", arm.name)
    params = {
        "arm_role": arm.role,
        "spec_method": arm.spec.method if arm.spec else "none",
        "num_speculative_tokens": str(arm.spec.num_speculative_tokens if arm.spec else 0),
        "drafter_path": drafter_path or "none",
        "speculative_config": json.dumps(spec_cfg, sort_keys=True) if spec_cfg else "none",
        "target_model": model,
        "host": profile.host.name,
    }
    return ServerPlan(arm.name, argv, env, profile.target.port, str(workdir / f"{safe}.server.log"), params)
