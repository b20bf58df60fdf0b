"""Static checks: what is and is not an error (the formats themselves: test_formats.py)."""
import json
import subprocess
import sys

import pytest
import torch
from safetensors.torch import load_file, save_file

from tasks.inspect import embedding_neighbour_overlap, inspect_drafter, row_agreement
from tests.conftest import ROOT
from tests.fixtures import formats as F


@pytest.fixture(scope="module")
def target(tmp_path_factory):
    return str(F.write_target(tmp_path_factory.mktemp("t") / "llama", F.LLAMA))


def _codes(findings, severity="error"):
    return {f.code for f in findings if f.severity == severity}


def _edit(head, **tensors):
    sd = load_file(str(head / "model.safetensors"))
    sd.update(tensors)
    save_file({k: v.contiguous() for k, v in sd.items() if v is not None}, str(head / "model.safetensors"))
    return head


def test_an_untrained_head_is_not_called_scrambled(tmp_path, target):
    """Zero or random lm_head rows carry nothing to compare: the check says it cannot decide, as info."""
    head = _edit(F.specforge(tmp_path / "h", F.LLAMA, fault="scrambled"), **{"lm_head.weight": torch.zeros(512, 64)})
    findings = inspect_drafter.fn(str(head), None, target)
    assert _codes(findings) == set() and "mapping_unjudged" in _codes(findings, "info")


def test_d2t_validity_is_what_the_engine_needs(tmp_path, target):
    head = F.specforge(tmp_path / "h", F.LLAMA)
    d2t = load_file(str(head / "model.safetensors"))["d2t"]
    dup = d2t.clone()
    dup[1] = d2t[0] - 1  # draft id 1 onto draft id 0's target id
    assert "d2t_duplicates" in _codes(inspect_drafter.fn(str(_edit(head, d2t=dup)), None, target))
    assert "d2t_range" in _codes(inspect_drafter.fn(str(_edit(head, d2t=d2t + 5000)), None, target))
    assert "d2t_shape" in _codes(inspect_drafter.fn(str(_edit(head, d2t=d2t[:100])), None, target))


def test_t2d_disagreeing_with_d2t_is_a_warning_not_an_error(tmp_path, target):
    """vLLM ignores t2d; a t2d apart from d2t is a sign of a regenerated mapping (SpecForge PR #534), not a load
    fault."""
    head = F.specforge(tmp_path / "h", F.LLAMA)
    t2d = load_file(str(head / "model.safetensors"))["t2d"].clone()
    t2d[t2d.nonzero()[:5, 0]] = False
    findings = inspect_drafter.fn(str(_edit(head, t2d=t2d)), None, target)
    assert _codes(findings) == set() and "t2d_mismatch" in _codes(findings, "warning")


def test_missing_aux_ids_warn_that_the_engine_default_applies(tmp_path, target):
    head = F.eagle_repo(tmp_path / "h", F.LLAMA)  # the EAGLE repo's config names none
    findings = inspect_drafter.fn(str(head), None, target)
    assert "aux_default" in _codes(findings, "warning") and "[2, 16, 29]" in next(
        f.message for f in findings if f.code == "aux_default")


def test_candidate_vs_control_aux_ids(tmp_path, target):
    cand = F.specforge(tmp_path / "c", F.LLAMA, eagle_config={"eagle_aux_hidden_state_layer_ids": [1, 14, 26]})
    ctrl = F.speculators(tmp_path / "k", F.LLAMA)
    findings = inspect_drafter.fn(str(cand), None, target, str(ctrl))
    assert {"aux_layers_differ", "norm_before_residual_differs"} <= _codes(findings, "warning")


def test_row_agreement_holds_across_spaces_and_for_any_order():
    g = torch.Generator().manual_seed(0)
    rows = F.target_rows()[:512]
    proj = torch.randn(64, 96, generator=g)
    r, s_a, s_b = row_agreement(rows @ proj, rows)
    assert float(r.median()) > 0.8 and min(s_a, s_b) > 1.5
    perm = torch.randperm(512, generator=g)
    assert float(row_agreement((rows @ proj)[perm], rows[perm])[0].median()) > 0.8  # same pairs, another order
    assert abs(float(row_agreement((rows @ proj)[perm], rows)[0].median())) < 0.1  # pairs broken


def test_embedding_neighbourhoods_survive_rescale_but_not_permutation():
    g = torch.Generator().manual_seed(1)
    emb = torch.randn(2000, 32, generator=g)
    assert embedding_neighbour_overlap(emb * 3.0, emb) == 1.0
    assert embedding_neighbour_overlap(emb[torch.randperm(2000, generator=g)], emb) < 0.05


def test_bad_config_is_one_line_not_a_traceback(tmp_path, target):
    from infra.config import SpecdiagError

    head = F.specforge(tmp_path / "h", F.LLAMA)
    (head / "config.json").write_text("[1, 2]")
    with pytest.raises(SpecdiagError, match="not a JSON object"):
        inspect_drafter.fn(str(head), None, target)
    (head / "config.json").write_text(json.dumps({"architectures": ["Foo"]}))
    with pytest.raises(SpecdiagError, match="cannot tell the drafter type"):
        inspect_drafter.fn(str(head), None, target)
    done = subprocess.run([sys.executable, "flows/inspect_drafter.py", str(head), "--target", target],
                          capture_output=True, text=True, cwd=ROOT, timeout=120)  # as a user meets it
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert done.stderr.strip().startswith("specdiag: error: cannot tell the drafter type")


def test_a_draft_model_in_hugging_face_layout_is_checked_for_its_token_ids(tmp_path, target):
    """`model.embed_tokens.weight`, as every HF causal LM saves it: a shuffled vocabulary is named, a faithful one not."""
    good = inspect_drafter.fn(str(F.draft_model(tmp_path / "good", F.LLAMA)), None, target)
    bad = inspect_drafter.fn(str(F.draft_model(tmp_path / "bad", F.LLAMA, permuted=True)), None, target)
    assert _codes(good, "info") == {"embedding"} and not _codes(good)
    assert _codes(bad) == {"embedding_mismatch"}


def test_a_tokenizer_with_other_ids_is_named_and_a_reformatted_one_is_not(tmp_path):
    from infra.executor import LocalExecutor
    from tasks.inspect import tokenizers_differ

    vocab = {"model": {"type": "BPE", "vocab": {"a": 0, "b": 1, "ab": 2}}}
    for name, tok in {"t": vocab, "same": vocab, "other": {"model": {"type": "BPE", "vocab": {"a": 1, "b": 0, "ab": 2}}},
                      "spaced": {"model": {"vocab": {"ab": 2, "b": 1, "a": 0}, "type": "BPE"}, "added_tokens": []}}.items():
        (tmp_path / name).mkdir()
        (tmp_path / name / "tokenizer.json").write_text(json.dumps(tok, indent=2 if name == "spaced" else None))
    fs = LocalExecutor()
    assert not tokenizers_differ(fs, str(tmp_path / "same"), str(tmp_path / "t"))
    assert not tokenizers_differ(fs, str(tmp_path / "spaced"), str(tmp_path / "t"))  # other bytes, same ids
    assert tokenizers_differ(fs, str(tmp_path / "other"), str(tmp_path / "t"))
    assert not tokenizers_differ(fs, str(tmp_path / "none"), str(tmp_path / "t"))  # nothing to compare
