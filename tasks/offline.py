"""Offline drafter evaluation: each drafter's acceptance on the same prompts, computed without the serving engine.

Served acceptance far below offline acceptance of the same checkpoint points at the engine integration; both low
points at the drafter. Runs engine_side/offline_eval.py with the engine's Python, where the target's weights are.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from prefect import task
from prefect.cache_policies import NO_CACHE

from infra import embedded
from infra.arms import Arm, local_dir
from infra.config import Profile
from infra.executor import Completed, executor_for
from infra.tracking import Tracker

METHODS = {"eagle3": ("eagle3",), "all": ("eagle3", "draft_model"), "none": ()}
SCRIPT = embedded.ENGINE_SIDE / "offline_eval.py"
SCRIPTS = ("offline_eval.py", "eagle3_ref.py", "target_states.py")


@dataclass
class OfflineResult:
    """arm name -> offline metrics, and how the evaluation went: ok, failed, skipped (why), or none (no arm chosen)."""

    metrics: dict[str, dict[str, float]] = field(default_factory=dict)
    status: str = "none"
    note: str = ""

    def line(self) -> str | None:
        """One line for the evidence and the summary when offline numbers were wanted but are missing."""
        return f"offline evaluation {self.status}: {self.note}" if self.status in ("failed", "skipped") else None


def offline_metrics(arm_result: dict) -> dict[str, float]:
    """The script's numbers for one arm, under the names the arm's MLflow run carries."""
    out = {"offline_acceptance_rate": arm_result["acceptance_rate"],
           "offline_mean_acceptance_length": arm_result["mean_acceptance_length"],
           "offline_num_slots": float(arm_result["slots"])}
    out.update({f"offline_acceptance_rate_pos_{i}": v for i, v in enumerate(arm_result["per_position"])})
    return out


@task(name="offline-eval", cache_policy=NO_CACHE)
def offline_eval(cfg: Profile, arms: list[Arm], target: str, prompts: list[str], workdir: str,
                 tracker: Tracker, parent_run_id: str,
                 timeout_s: float = 900.0) -> OfflineResult:
    """Offline metrics for the arms whose method the profile's `offline_eval` selects.

    A failure here never stops the diagnosis (the served arms still run); it is the parent run's tag
    `specdiag.offline_eval`, its error file, and a line in the verdict's evidence.
    """
    chosen = [a for a in arms if a.spec and a.spec.method in METHODS[cfg.offline_eval] and not a.probe]
    if not chosen:
        return OfflineResult()
    job = {"target": target, "prompts": prompts, "chat": cfg.bench.endpoint == "chat",
           "max_tokens": cfg.bench.max_tokens,
           "drafters": [{"arm": a.name, "method": a.spec.method, "path": a.spec.model,
                         "k": a.spec.num_speculative_tokens} for a in chosen]}
    local = local_dir(parent_run_id)
    job_file, out_file = local / "offline_job.json", local / "offline_eval.json"
    job_file.write_text(json.dumps(job, indent=2))
    python = cfg.engine_python or embedded.engine_python()
    print(f"offline evaluation of {', '.join(a.name for a in chosen)} on {len(prompts)} prompts (no server)")
    executor = executor_for(cfg.host)
    try:
        script = SCRIPT
        if executor.host != "local":  # the script runs where the target's weights are
            for f in SCRIPTS:
                executor.put(embedded.ENGINE_SIDE / f, f"{workdir}/engine_side/{f}")
            script = f"{workdir}/engine_side/{SCRIPT.name}"
        remote_job, remote_out = executor.put(job_file, f"{workdir}/offline_job.json"), f"{workdir}/offline_eval.json"
        done = executor.run([python, str(script), remote_job, remote_out], timeout_s)
        if done.returncode == 0:
            executor.fetch(remote_out, out_file)
    except Exception as exc:  # e.g. the timeout: the diagnosis goes on without offline numbers
        done = Completed(-1, "", f"{type(exc).__name__}: {exc}")
    finally:
        executor.close()
    if done.returncode != 0 or not out_file.exists():
        lines = (done.stderr or done.stdout).splitlines()
        tail = "\n".join(lines[-10:])
        print(f"offline evaluation failed (exit {done.returncode}); going on without it:\n{tail}")
        tracker.text(parent_run_id, f"exit {done.returncode}\n{done.stdout}\n{done.stderr}", "offline_eval_error.txt")
        result = OfflineResult(status="failed", note=f"exit {done.returncode}: {lines[-1] if lines else 'no output'} "
                                                     f"(offline_eval_error.txt)")
    else:
        tracker.file(parent_run_id, str(out_file))
        report = json.loads(out_file.read_text())
        print(f"offline evaluation: {report['target_tokens']} target tokens in {report['seconds']:.0f} s")
        result = OfflineResult({arm: offline_metrics(r) for arm, r in report["arms"].items()}, "ok")
    tracker.tag(parent_run_id, "specdiag.offline_eval", result.status)
    return result
