"""Arm fingerprints, read on the host by the engine's own interpreter: each input that changes a measurement
changes the fingerprint (a fresh arm); nothing else does (the arm is reused)."""
import os
import shutil
import time
from dataclasses import replace

import pytest

from infra import embedded
from infra.arms import plan_arms
from infra.config import load_profile
from infra.executor import LocalExecutor
from infra.fingerprint import digest, fields, identify


@pytest.fixture(scope="module")
def python():
    return embedded.engine_python()


def _checkpoint(folder):
    """A small EAGLE-3-shaped folder: config, a safetensors file (8-byte header length + JSON header + data)."""
    folder.mkdir()
    (folder / "config.json").write_text('{"architectures": ["LlamaForCausalLMEagle3"], "hidden_size": 64}')
    header = b'{"fc.weight":{"dtype":"F32","shape":[2,2],"data_offsets":[0,16]}}'
    (folder / "model.safetensors").write_bytes(len(header).to_bytes(8, "little") + header + bytes(16))
    return folder


def _digests(python, cfg, target, prompts, drafter_dir):
    arms = plan_arms(cfg)
    arms = [replace(a, spec=a.spec.model_copy(update={"model": str(drafter_dir)})) if a.spec else a for a in arms]
    ids = identify(LocalExecutor(), python, [str(target), str(drafter_dir)])
    return {a.name: digest(fields(cfg, a, str(target), prompts, ids, True)) for a in arms}, ids


def test_each_input_that_changes_a_measurement_changes_the_fingerprint(python, tmp_path):
    target, drafter = _checkpoint(tmp_path / "target"), _checkpoint(tmp_path / "drafter")
    cfg = load_profile("demo", {"drafter": "smol-eagle3", "control": ""})
    prompts = ["What is a prime?", "Name a river."]
    same, ids = _digests(python, cfg, target, prompts, drafter)
    assert ids["engine"] not in ("", "unknown")  # read from the engine's own installation
    assert same == _digests(python, cfg, target, prompts, drafter)[0]

    moved = tmp_path / "moved"
    shutil.copytree(drafter, moved)  # copy2 keeps mtimes: the same files elsewhere are the same drafter
    assert _digests(python, cfg, target, prompts, moved)[0]["smol-eagle3"] == same["smol-eagle3"]

    args = load_profile("demo", {"drafter": "smol-eagle3", "control": "", "target.args": cfg.target.args[:-2]})
    changed = {
        "server argument": _digests(python, args, target, prompts, drafter)[0],
        "prompt set": _digests(python, cfg, target, prompts[:1], drafter)[0],
        "benchmark": _digests(python, load_profile("demo", {"drafter": "smol-eagle3", "control": "",
                                                            "bench.max_tokens": 7}), target, prompts, drafter)[0],
    }
    for what, d in changed.items():
        assert d["baseline"] != same["baseline"] and d["smol-eagle3"] != same["smol-eagle3"], what

    time.sleep(0.01)
    (drafter / "model.safetensors").write_bytes((drafter / "model.safetensors").read_bytes())  # rewritten file
    rewritten = _digests(python, cfg, target, prompts, drafter)[0]
    assert rewritten["smol-eagle3"] != same["smol-eagle3"] and rewritten["baseline"] == same["baseline"]

    other_engine = dict(ids, engine="0.31.0")
    arm = plan_arms(cfg)[0]
    assert digest(fields(cfg, arm, str(target), prompts, other_engine, True)) != \
        digest(fields(cfg, arm, str(target), prompts, ids, True))
    os.utime(target / "config.json")  # the target's files too
    assert _digests(python, cfg, target, prompts, drafter)[0]["baseline"] != same["baseline"]
