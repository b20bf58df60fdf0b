"""Offline evaluation from a training pipeline's hidden-state dumps, without the target's weights.

The transformers path runs the demo target (SmolLM2-135M) on the prompts and, from the very states it evaluated,
writes SpecForge-format (rows_0-2000/data_<i>.ckpt) and speculators-format (hidden_states/hs_<i>.safetensors
beside a preprocessed dataset) dumps with the project's own writer (infra/engine_side/dumps.py). Evaluating from
either dump, with the target folder gone, must give the same per-position acceptance.
"""
import json
import subprocess

import pytest

from infra import embedded
from infra.arms import resolve_arm, resolved_drafters
from infra.config import load_profile
from infra.executor import LocalExecutor
from tasks.offline import SCRIPT, build_job

pytestmark = pytest.mark.e2e

PROMPTS = ["Explain what a hash map is in two sentences.", "Write a haiku about autumn rain.",
           "List three uses of a paperclip.", "What is the capital of Australia, and why not Sydney?"]


def _evaluate(python: str, job: dict, folder) -> dict:
    job_file, out = folder / "job.json", folder / "out.json"
    job_file.write_text(json.dumps(job))
    done = subprocess.run([python, str(SCRIPT), str(job_file), str(out)], capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(out.read_text())


def test_specforge_and_speculators_dumps_give_the_transformers_paths_acceptance(tmp_path):
    cfg = load_profile("demo", sets=["bench.max_tokens=40"])
    target, head = embedded.resolve(cfg.target.model), embedded.resolve("embedded:smol-eagle3")
    python = embedded.engine_python()
    embedded.ensure_package(python, "pyarrow", "for speculators' preprocessed dataset")
    arm = resolved_drafters([resolve_arm(cfg, "smol-eagle3", "candidate")])[0]
    job, skip = build_job(cfg, LocalExecutor(), [arm], target, PROMPTS)
    assert skip is None and job["drafters"][0]["tensors"], job  # the head travels as its normalised description
    sf, sp = tmp_path / "specforge", tmp_path / "speculators"
    job["write_dumps"] = [{"format": "specforge", "folder": str(sf)}, {"format": "speculators", "folder": str(sp)}]
    ref = _evaluate(python, job, tmp_path)
    assert ref["source"] == "transformers" and ref["arms"]["smol-eagle3"]["slots"] > 50

    assert (sf / "rows_0-2000" / "data_0.ckpt").exists() and (sp / "hidden_states" / "hs_0.safetensors").exists()
    for folder in (sf, sp / "hidden_states"):
        dumped = {**job, "target": str(tmp_path / "no-target-here"), "prompts": [], "write_dumps": [],
                  "hidden_states": str(folder)}
        got = _evaluate(python, dumped, tmp_path)
        assert got["source"] == "hidden_states" and "transformers" not in got["modules"]
        assert got["sequences"] == ref["sequences"] and got["target_tokens"] == ref["target_tokens"]
        assert got["arms"]["smol-eagle3"]["slots"] == ref["arms"]["smol-eagle3"]["slots"]
        assert got["arms"]["smol-eagle3"]["per_position"] == ref["arms"]["smol-eagle3"]["per_position"], folder
