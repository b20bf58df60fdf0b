"""Offline drafter evaluation: each drafter's acceptance on the same prompts, computed without the serving engine.

Served acceptance far below offline acceptance of the same checkpoint points at the engine integration; both low
points at the drafter. Runs engine_side/offline_eval.py with the engine's Python, where the target's weights are, or
reads the user's hidden-state dumps there instead (offline.hidden_states): then no target weights are loaded.
"""
from __future__ import annotations

import json
import threading
from dataclasses import asdict, dataclass, field
from pathlib import Path

from prefect import task
from prefect.cache_policies import NO_CACHE

from infra import embedded
from infra.arms import Arm, local_dir
from infra.checkpoints import read_drafter, read_target
from infra.config import Profile
from infra.executor import Completed, executor_for
from infra.tracking import Tag, Tracker

METHODS = {"eagle3": ("eagle3",), "all": ("eagle3", "draft_model"), "none": ()}
SCRIPT = embedded.ENGINE_SIDE / "offline_eval.py"
SCRIPTS = ("offline_eval.py", "eagle3_ref.py", "target_states.py", "dumps.py")


@dataclass
class OfflineResult:
    """arm name -> offline metrics, and how the evaluation went: ok, failed, skipped (why), or none (no arm chosen)."""

    metrics: dict[str, dict[str, float]] = field(default_factory=dict)
    status: str = "none"
    variants: dict[str, dict[str, dict]] = field(default_factory=dict)  # arm -> variant -> what it changed
    note: str = ""

    def line(self) -> str | None:
        """One line for the evidence and the summary when offline numbers were wanted but are missing."""
        return f"offline evaluation {self.status}: {self.note}" if self.status in ("failed", "skipped") else None


def offline_metrics(arm_result: dict) -> dict[str, float]:
    """The script's numbers for one arm, under the names the arm's MLflow run carries; aux-layer variants as
    offline_<metric>_aux_<variant>."""
    out = {"offline_acceptance_rate": arm_result["acceptance_rate"],
           "offline_mean_acceptance_length": arm_result["mean_acceptance_length"],
           "offline_num_slots": float(arm_result["slots"])}
    out.update({f"offline_acceptance_rate_pos_{i}": v for i, v in enumerate(arm_result["per_position"])})
    for name, v in (arm_result.get("variants") or {}).items():
        out.update({f"offline_acceptance_rate_aux_{name}": v["acceptance_rate"],
                    f"offline_mean_acceptance_length_aux_{name}": v["mean_acceptance_length"],
                    f"offline_num_slots_aux_{name}": float(v["slots"])})
    return out


def variants(d, target, control=None) -> dict[str, dict]:
    """The head with one thing changed, each evaluated offline beside it. Other aux layer sets it may have been
    trained on than the ones the engine will feed it: the engine's default (ids missing from a config, vLLM #50170),
    the ids shifted by one (a trainer/engine offset convention, SGLang #25454), the control's; only sets of the same
    size (the fc width) within the target's layers. And the control's d2t, for a head of the same draft vocab size
    (the control_mapping intervention, without a server)."""
    n, fed = target.num_layers, d.engine_aux_ids(target.num_layers)
    aux = {"default": sorted({2, n // 2, n - 3}), "plus1": [i + 1 for i in fed], "minus1": [i - 1 for i in fed]}
    if control is not None:
        aux["control"] = control.engine_aux_ids(n)
    out = {k: {"aux": v} for k, v in aux.items()
           if v != fed and len(set(v)) == len(fed) and 0 <= min(v) and max(v) < n}
    ref = control.tensors.get("d2t") if control is not None else None
    if ref is not None and ref.shape == (d.draft_vocab_size,) and d.tensors.get("d2t") != ref:
        out["control_mapping"] = {"d2t": asdict(ref)}
    return out


def describe(arm: Arm, d, target, control=None) -> dict:
    """One drafter of the job, from its normalised description d (a DrafterSpec; None for a draft model): the
    engine's config, aux ids and tensor places, and the variants to try it with (control: the control's DrafterSpec,
    if it is an EAGLE-3 head)."""
    spec = {"arm": arm.name, "method": arm.spec.method, "path": arm.spec.model, "k": arm.spec.num_speculative_tokens}
    if d is None:
        return spec
    config = {**d.config, "eagle_aux_hidden_state_layer_ids": d.engine_aux_ids(target.num_layers),
              "target_hidden_size": d.target_hidden_size, "draft_vocab_size": d.draft_vocab_size,
              "vocab_size": d.vocab_size or target.vocab_size}
    return {**spec, "config": config, "tensors": {k: asdict(r) for k, r in d.tensors.items()},
            "variants": variants(d, target, control)}


def skip_reason(cfg: Profile, target) -> str | None:
    """Why the target is not run here: too large for transformers on the host and no dumps to read instead."""
    size = (target.total_bytes or 0) / 1e9
    if cfg.offline.hidden_states or size <= cfg.offline.max_target_gb:
        return None
    return (f"the target's weights are {size:.0f} GB (over offline.max_target_gb={cfg.offline.max_target_gb:g}); "
            f"evaluate from your training pipeline's hidden-state dumps instead: --hidden-states DIR on the host "
            f"(SpecForge rows_*/data_*.ckpt, speculators hs_*.safetensors)")


def build_job(cfg: Profile, fs, chosen: list[Arm], target_path: str, prompts: list[str]) -> tuple[dict, str | None]:
    target = read_target(fs, target_path)
    embed = target.tensors.get("embed_tokens.weight")
    job = {"target": target_path, "prompts": prompts, "chat": cfg.bench.endpoint == "chat",
           "max_tokens": cfg.bench.max_tokens, "trust_remote_code": "--trust-remote-code" in cfg.target.args,
           "target_embed": asdict(embed) if embed else None,
           "hidden_states": cfg.offline.hidden_states, "loss_masks": cfg.offline.loss_masks,
           "drafters": []}
    specs = {a.name: read_drafter(fs, a.spec.model, "eagle3") for a in chosen if a.spec.method == "eagle3"}
    ctrl = next((a.name for a in chosen if a.role == "control" and a.name in specs), None)
    job["drafters"] = [describe(a, specs.get(a.name), target, specs[ctrl] if ctrl and a.name != ctrl else None)
                       for a in chosen]
    return job, skip_reason(cfg, target)


class Stop(threading.Event):
    """The diagnosis's end, for an evaluation still running: closed (set) as the diagnosis's block exits, however it
    exits (a Ctrl-C, a cancellation), the evaluation's process group is stopped where it runs, within seconds."""

    close = threading.Event.set


@task(name="offline-eval", cache_policy=NO_CACHE)
def offline_eval(cfg: Profile, arms: list[Arm], target: str, prompts: list[str], workdir: str,
                 tracker: Tracker, parent_run_id: str, cancel=None,
                 timeout_s: float = 900.0) -> OfflineResult:
    """Offline metrics for the arms whose method the profile's `offline_eval` selects. cancel: a threading.Event the
    diagnosis sets when it ends: an evaluation still running then is stopped, its process group and all, on its host.

    A failure here never stops the diagnosis (the served arms still run); it is the parent run's tag
    `specdiag.offline_eval`, its error file, and a line in the verdict's evidence.
    """
    chosen = [a for a in arms if a.spec and a.spec.method in METHODS[cfg.offline_eval] and not a.probe]
    if not chosen:
        return OfflineResult()
    local = local_dir(parent_run_id)
    job_file, out_file = local / "offline_job.json", local / "offline_eval.json"
    executor, skip = executor_for(cfg.host), None
    try:
        job, skip = build_job(cfg, executor, chosen, target, prompts)
        if skip:
            done = None
        else:
            job_file.write_text(json.dumps(job, indent=2))
            done = _run(cfg, executor, job_file, workdir, timeout_s, out_file, cancel)
            print(f"offline evaluation of {', '.join(a.name for a in chosen)} "
                  f"{'from ' + job['hidden_states'] if job['hidden_states'] else f'on {len(prompts)} prompts'}")
    except Exception as exc:  # e.g. the timeout: the diagnosis goes on without offline numbers
        done = Completed(-1, "", f"{type(exc).__name__}: {exc}")
    finally:
        executor.close()
    result = _result(done, skip if done is None else None, out_file, tracker, parent_run_id)
    tracker.tag(parent_run_id, Tag.OFFLINE_EVAL, result.status)
    return result


def _run(cfg: Profile, executor, job_file: Path, workdir: str, timeout_s: float, out_file: Path, cancel) -> Completed:
    """The engine-side script where the target (or the dumps) are; its JSON back in out_file."""
    python = cfg.offline.python or cfg.engine_python
    if python is None:  # the embedded engine's: it gets what reading speculators' loss masks needs
        python = embedded.engine_python()
        if cfg.offline.hidden_states:
            embedded.ensure_package(python, "pyarrow", "for speculators' preprocessed dataset")
    script = SCRIPT
    if executor.host != "local":  # the script runs where the target's weights are
        for f in SCRIPTS:
            executor.put(embedded.ENGINE_SIDE / f, f"{workdir}/engine_side/{f}")
        script = f"{workdir}/engine_side/{SCRIPT.name}"
    remote_job, remote_out = executor.put(job_file, f"{workdir}/offline_job.json"), f"{workdir}/offline_eval.json"
    done = executor.run([python, str(script), remote_job, remote_out], timeout_s, cancel=cancel)
    if done.returncode == 0:
        executor.fetch(remote_out, out_file)
    return done


def _result(done: Completed | None, skip: str | None, out_file: Path, tracker: Tracker, parent: str) -> OfflineResult:
    if done is None:
        print(f"offline evaluation skipped: {skip}")
        return OfflineResult(status="skipped", note=skip or "")
    if done.returncode != 0 or not out_file.exists():
        lines = (done.stderr or done.stdout).splitlines()
        tail = "\n".join(lines[-10:])
        print(f"offline evaluation failed (exit {done.returncode}); going on without it:\n{tail}")
        tracker.text(parent, f"exit {done.returncode}\n{done.stdout}\n{done.stderr}", "offline_eval_error.txt")
        return OfflineResult(status="failed", note=f"exit {done.returncode}: {lines[-1] if lines else 'no output'} "
                                                   f"(offline_eval_error.txt)")
    tracker.file(parent, str(out_file))
    report = json.loads(out_file.read_text())
    print(f"offline evaluation: {report['target_tokens']} target tokens from {report.get('source', 'the target')} "
          f"in {report['seconds']:.0f} s")
    return OfflineResult({arm: offline_metrics(r) for arm, r in report["arms"].items()}, "ok",
                         variants={arm: {k: {c: v[c] for c in ("aux", "d2t") if c in v}
                                         for k, v in (r.get("variants") or {}).items()}
                                   for arm, r in report["arms"].items()})
