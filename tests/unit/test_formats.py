"""Static checks on heads laid out as SpecForge, speculators, the original EAGLE repo and NVIDIA ModelOpt save them
(tests/fixtures/formats.py cites each source), against the targets they are made for: Llama-3-shaped and
Kimi-K2.5-shaped (fields under text_config). Good heads: zero errors. Real faults: caught, by the right code."""
import json
import subprocess
import sys

import pytest
import torch

from infra.checkpoints import read_drafter, read_target
from infra.executor import LocalExecutor
from tasks.inspect import inspect_drafter
from tests.conftest import ROOT
from tests.fixtures import formats as F

FS = LocalExecutor()
BUILDERS = {"specforge": F.specforge, "speculators": F.speculators, "eagle-repo": F.eagle_repo,
            "modelopt": F.modelopt_kimi}
TARGET_OF = {"specforge": F.LLAMA, "speculators": F.LLAMA, "eagle-repo": F.LLAMA, "modelopt": F.KIMI_K25}


@pytest.fixture(scope="module")
def targets(tmp_path_factory):
    d = tmp_path_factory.mktemp("targets")
    return {id(F.LLAMA): F.write_target(d / "llama", F.LLAMA),
            id(F.KIMI_K25): F.write_target(d / "kimi-k25", F.KIMI_K25, prefix="language_model.model.", sharded=True)}


def _codes(findings, severity="error"):
    return {f.code for f in findings if f.severity == severity}


def _check(tmp_path, targets, fmt, fault=None, **kw):
    target = TARGET_OF[fmt]
    head = BUILDERS[fmt](tmp_path / f"{fmt}-{fault}", target, fault=fault, **kw)
    return inspect_drafter.fn(str(head), None, str(targets[id(target)]))


@pytest.mark.parametrize("fmt", sorted(BUILDERS))
def test_each_format_loads_with_its_fields_and_no_false_errors(tmp_path, targets, fmt):
    findings = _check(tmp_path, targets, fmt)
    assert _codes(findings) == set(), findings
    assert "mapping_agreement" in _codes(findings, "info"), findings  # the mapping judged from the weights: right
    d = read_drafter(FS, str(tmp_path / f"{fmt}-None"))
    assert (d.format, d.method, d.draft_vocab_size, d.hidden_size, d.target_hidden_size) == (fmt, "eagle3", 512, 64, 64)
    assert d.architecture in {"Eagle3LlamaForCausalLM", "LlamaForCausalLMEagle3", "Eagle3DeepseekV2ForCausalLM",
                              "Eagle3Speculator"}
    assert "layers.0.input_layernorm.weight" in d.tensors and "midlayer.input_layernorm.weight" not in d.tensors
    assert d.fc_inputs == 3


def test_fields_read_where_each_format_keeps_them(tmp_path, targets):
    sf = read_drafter(FS, str(F.specforge(tmp_path / "sf", F.LLAMA, eagle31=True)))
    assert sf.aux_ids == [1, 15, 28] and sf.aux_source == "eagle_config"
    assert sf.norms["fc_norm"] and sf.norms["norm_output"] and not sf.norms["norm_before_residual"]
    sp = read_drafter(FS, str(F.speculators(tmp_path / "sp", F.LLAMA, sharded=True)))
    assert sp.aux_ids == [2, 16, 29] and sp.aux_source == "top level"
    assert sp.norms["norm_before_residual"] and sp.target_hidden_size == 64  # null means "same as hidden"
    assert "embed_tokens.weight" in sp.tensors and sp.tensors["d2t"].file.endswith("of-00002.safetensors")
    er = read_drafter(FS, str(F.eagle_repo(tmp_path / "er", F.LLAMA)))
    assert er.architecture == "Eagle3LlamaForCausalLM" and er.aux_ids is None  # vLLM renames LlamaForCausalLM
    assert er.tensors["d2t"].offset is None  # a torch .bin
    kimi = read_target(FS, str(targets[id(F.KIMI_K25)]))
    assert (kimi.hidden_size, kimi.vocab_size, kimi.num_layers) == (64, 2048, 61)
    assert kimi.output_rows() is not None and kimi.total_bytes > 0


@pytest.mark.parametrize("fmt", sorted(BUILDERS))
@pytest.mark.parametrize("fault, code", [("scrambled", "d2t_scrambled"), ("partial", "d2t_partial"),
                                         ("no_d2t", "d2t_missing")])
def test_mapping_faults_are_caught_in_every_format(tmp_path, targets, fmt, fault, code):
    assert code in _codes(_check(tmp_path, targets, fmt, fault)), fmt


@pytest.mark.parametrize("fmt", sorted(BUILDERS))
def test_config_faults_are_caught_in_every_format(tmp_path, targets, fmt):
    """A head built for another target size, and aux ids past the target's last layer: gating errors."""
    over = {"speculators": {"target_hidden_size": 96, "eagle_aux_hidden_state_layer_ids": [2, 16, 40]},
            "modelopt": {"target_hidden_size": 96, "eagle_config": {"eagle_aux_hidden_state_layer_ids": [2, 30, 70]}},
            }.get(fmt, {"target_hidden_size": 96, "eagle_aux_hidden_state_layer_ids": [2, 16, 40]})
    findings = _check(tmp_path, targets, fmt, **over)
    assert {"hidden_size", "aux_layers"} <= _codes(findings), findings
    assert all(f.gating for f in findings if f.code in ("hidden_size", "aux_layers"))


def test_vocab_size_mismatch_in_every_format(tmp_path, targets):
    for fmt, over in [("specforge", {"vocab_size": 4096}), ("eagle-repo", {"vocab_size": 4096}),
                      ("modelopt", {"vocab_size": 4096})]:
        assert "vocab_size" in _codes(_check(tmp_path, targets, fmt, **over)), fmt
    head = F.speculators(tmp_path / "sp-vocab", F.LLAMA)
    cfg = json.loads((head / "config.json").read_text())
    cfg["transformer_layer_config"]["vocab_size"] = 4096
    (head / "config.json").write_text(json.dumps(cfg))
    assert "vocab_size" in _codes(inspect_drafter.fn(str(head), None, str(targets[id(F.LLAMA)])))


def test_what_vllm_accepts_is_not_an_error(tmp_path, targets):
    """ModelOpt's frequency-ordered d2t and an int32 d2t serve correctly in vLLM (scattered by index, copied into
    int64); a speculators `target_hidden_size: null` means "same as hidden"."""
    findings = _check(tmp_path, targets, "modelopt", d2t_dtype=torch.int32)
    assert _codes(findings) == set(), findings
    assert any("stored as I32" in f.message for f in findings)


def test_fc_width_is_the_one_the_engine_builds(tmp_path, targets):
    """Four top-level aux ids and a 4H fc: vLLM 0.32 builds fc for 3 (num_aux_hidden_states, else eagle_config's ids,
    else 3), so the load fails; num_aux_hidden_states: 4 makes it load."""
    head = F.speculators(tmp_path / "four", F.LLAMA, eagle_aux_hidden_state_layer_ids=[2, 10, 20, 29])
    fc = F.head_tensors(F.LLAMA, 512, 64, n_aux=4)["fc.weight"]
    from safetensors.torch import load_file, save_file
    tensors = load_file(str(head / "model.safetensors"))
    tensors["fc.weight"] = fc
    save_file(tensors, str(head / "model.safetensors"))
    assert "fc_shape" in _codes(inspect_drafter.fn(str(head), None, str(targets[id(F.LLAMA)])))


def test_candidate_vs_control_compares_every_flag_the_engine_reads(tmp_path, targets):
    cand = F.specforge(tmp_path / "c", F.LLAMA, eagle31=True)
    ctrl = F.specforge(tmp_path / "k", F.LLAMA)
    findings = inspect_drafter.fn(str(cand), None, str(targets[id(F.LLAMA)]), str(ctrl))
    assert {"fc_norm_differs", "norm_output_differs"} <= _codes(findings, "warning")


def test_cli_on_a_kimi_k25_target_reports_instead_of_crashing(tmp_path, targets):
    head = F.modelopt_kimi(tmp_path / "kimi-head", F.KIMI_K25, fault="scrambled")
    proc = subprocess.run([sys.executable, "flows/inspect_drafter.py", str(head), "--target",
                           str(targets[id(F.KIMI_K25)])], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1 and "d2t_scrambled" in proc.stdout and "Traceback" not in proc.stderr, proc.stderr


def test_a_full_size_kimi_k2_head_is_read_from_headers_not_weights(tmp_path):
    """3.4 GB head, 2.3 GB target shard, both sparse: the checks read headers, d2t/t2d and sampled rows only
    (benchmarks/inspect_full_size.py times it)."""
    head, target = F.kimi_k2_full_size(tmp_path)
    findings = inspect_drafter.fn(str(head), None, str(target))
    assert _codes(findings) == set(), findings
    assert {"d2t", "aux_layers", "mapping_unjudged"} <= _codes(findings, "info")  # zero rows: cannot judge
