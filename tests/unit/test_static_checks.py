import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from tasks.inspect import check_vocab_mapping, embedding_neighbour_overlap, inspect_drafter
from infra.eagle3 import make_eagle3

ROOT = Path(__file__).resolve().parents[2]
TARGET = {"hidden_size": 64, "vocab_size": 2048, "num_hidden_layers": 30}


@pytest.fixture
def target_dir(tmp_path):
    import json
    d = tmp_path / "target"
    d.mkdir()
    (d / "config.json").write_text(json.dumps({**TARGET, "architectures": ["LlamaForCausalLM"]}))
    return d


def _codes(findings, severity="error"):
    return {f.code for f in findings if f.severity == severity}


def test_good_eagle3_head_has_no_errors(tmp_path, target_dir):
    path = make_eagle3(tmp_path / "good", TARGET)
    findings = inspect_drafter.fn(str(path), "eagle3", str(target_dir))
    assert _codes(findings) == set()
    assert "d2t" in _codes(findings, "info") and "aux_layers" in _codes(findings, "info")


@pytest.mark.parametrize("fault, code", [("scrambled_d2t", "d2t_order"), ("no_d2t", "d2t_missing")])
def test_vocab_mapping_faults_are_errors(tmp_path, target_dir, fault, code):
    path = make_eagle3(tmp_path / fault, TARGET, fault=fault)
    assert code in _codes(inspect_drafter.fn(str(path), "eagle3", str(target_dir)))


def test_config_mismatches_are_errors(tmp_path, target_dir):
    path = make_eagle3(tmp_path / "x", {**TARGET, "vocab_size": 4096, "hidden_size": 32}, aux=[2, 15, 31])
    assert {"vocab_size", "hidden_size", "aux_layers"} <= _codes(inspect_drafter.fn(str(path), "eagle3", str(target_dir)))


def test_candidate_vs_control_differences_are_warned(tmp_path, target_dir):
    cand = make_eagle3(tmp_path / "c", TARGET, aux=[1, 14, 26])
    ctrl = make_eagle3(tmp_path / "k", TARGET)
    findings = inspect_drafter.fn(str(cand), "eagle3", str(target_dir), str(ctrl), "eagle3")
    assert "aux_layers_differ" in _codes(findings, "warning")


def test_t2d_disagreeing_with_d2t():
    d2t = torch.tensor([0, 1, 2], dtype=torch.int64)  # ids 0, 2, 4
    t2d = torch.zeros(8, dtype=torch.bool)
    t2d[[0, 2, 5]] = True
    assert {f.code for f in check_vocab_mapping(d2t, t2d, 3, 8)} == {"t2d_mismatch"}
    t2d[5] = False
    t2d[4] = True
    assert {f.code for f in check_vocab_mapping(d2t, t2d, 3, 8)} == {"d2t"}


def test_embedding_neighbourhoods_survive_rescale_but_not_permutation():
    g = torch.Generator().manual_seed(1)
    emb = torch.randn(2000, 32, generator=g)
    assert embedding_neighbour_overlap(emb * 3.0, emb) == 1.0
    assert embedding_neighbour_overlap(emb[torch.randperm(2000, generator=g)], emb) < 0.05


def test_cli_flags_scrambled_d2t_in_seconds(tmp_path, target_dir):
    path = make_eagle3(tmp_path / "scrambled", TARGET, fault="scrambled_d2t")
    start = time.monotonic()
    proc = subprocess.run([sys.executable, "flows/inspect_drafter.py", str(path), "--target", str(target_dir)],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1 and "d2t_order" in proc.stdout
    assert time.monotonic() - start < 60
