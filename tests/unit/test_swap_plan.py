"""Which arms share one server by swapping, decided before any server starts (infra/swap.py, infra/arms.py), and
`--dry-run`, which prints that plan. The heads are the real-format fixtures (tests/fixtures/formats.py): SpecForge
heads of a Kimi-K2.5-shaped target, as the seed's `custom` (fine-tuned from) and `aqmedai` are."""
import pytest

import tests.fixtures.formats as F
from flows.diagnose import main
from infra.arms import Arm, plan_server, shared_servers
from infra.config import DrafterConfig, load_profile
from infra.executor import LocalExecutor
from infra.swap import shape


@pytest.fixture(scope="module")
def kimi(tmp_path_factory):
    d = tmp_path_factory.mktemp("k2")
    target = F.write_target(d / "kimi-k25", F.KIMI_K25, prefix="language_model.model.", sharded=True)
    return d, target


def _seed(capsys, kimi, custom_over=None, args=()):
    """The seed profile's --dry-run on this machine, its target and heads replaced by the fixtures."""
    d, target = kimi
    aqmedai = F.specforge(d / "aqmedai", F.KIMI_K25)
    custom = F.specforge(d / f"custom-{len(list(d.iterdir()))}", F.KIMI_K25, **(custom_over or {}))
    code = main(["--profile", "kimi-k25", "--host", "local", "--port", "8077", "--dry-run",
                 "--set", f"target.model={target}", "--set", f"drafters.custom.model={custom}",
                 "--set", f"drafters.aqmedai.model={aqmedai}", *args])
    out = capsys.readouterr().out
    assert code == 0, out
    return out


def test_the_seeds_custom_and_aqmedai_share_one_server_when_their_shapes_agree(capsys, kimi):
    out = _seed(capsys, kimi)
    assert "plan: 2 server load(s)" in out, out
    assert "aqmedai: fresh load (the first drafter of its shapes)" in out  # the control loads it, first
    assert "custom: swapped into aqmedai's server" in out
    assert "baseline: fresh load (no speculative decoding)" in out


def test_other_shapes_or_aux_ids_baked_into_graphs_get_their_own_load_and_say_why(capsys, kimi):
    out = _seed(capsys, kimi, {"eagle31": True})  # fc_norm weights: another head structure
    assert "plan: 3 server load(s)" in out and "aqmedai: fresh load (not custom's: other shapes" in out, out
    # other aux ids on a server that captures graphs (the profile serves without --enforce-eager): a load each
    ids = {"eagle_config": {"eagle_aux_hidden_state_layer_ids": [2, 30, 58], "use_aux_hidden_state": True}}
    assert "plan: 3 server load(s)" in _seed(capsys, kimi, ids)
    # eager, the running target is told the new ids
    out = _seed(capsys, kimi, ids, ["--set", 'target.args=["--enforce-eager"]'])
    assert "custom: swapped into aqmedai's server" in out, out
    assert "plan: 3 server load(s)" in _seed(capsys, kimi, None, ["--no-swap"])


def _arm(name, role, method="eagle3", k=3, path="/x", env=None):
    return Arm(name, role, name, DrafterConfig(method=method, model=path, num_speculative_tokens=k,
                                               engine_env=env or {}))


def test_grouping_puts_the_control_first_and_keeps_unswappable_arms_apart():
    base = Arm("baseline", "baseline", None, None)
    cand, ctrl, extra, k2 = (_arm("c", "candidate", path="/c"), _arm("g", "control", path="/g"),
                             _arm("e", "extra", path="/e"), _arm("k", "extra", k=2, path="/k"))
    raw = Arm("c@raw", "probe", "c", cand.spec, "raw_prompts", bench=(("endpoint", "completions"),))
    keys = {"c": "K", "g": "K", "e": "K", "k": "K2", "c@raw": "K"}
    groups = shared_servers([base, cand, ctrl, extra, k2, raw], lambda a: a.role == "probe", keys)
    # the control loads the server, the candidate is swapped in and settles against it, its probe rides after it
    assert [[a.name for a in g] for g in groups] == [["baseline"], ["g", "c", "c@raw", "e"], ["k"]]
    assert [[a.name for a in g] for g in shared_servers([base, cand, ctrl], lambda a: False, {})] == [
        ["baseline"], ["c"], ["g"]]  # no keys (swapping off, or none described): one load each


def test_a_swap_server_is_bound_to_loopback_with_the_extension_on_its_path(tmp_path):
    cfg = load_profile("demo")
    plan = plan_server(cfg, _arm("g", "control", path="embedded:smol-self", method="draft_model"), str(tmp_path), True)
    argv = plan.argv
    assert argv[argv.index("--host") + 1] == "127.0.0.1"  # /collective_rpc calls any worker method: never exposed
    assert argv[argv.index("--worker-extension-cls") + 1] == "specdiag_swap.SpecdiagSwap"
    assert plan.env["VLLM_SERVER_DEV_MODE"] == "1" and plan.env["PYTHONPATH"] == str(tmp_path / "engine_side")
    plain = plan_server(cfg, _arm("g", "control", path="embedded:smol-self", method="draft_model"), str(tmp_path))
    assert "--worker-extension-cls" not in plain.argv and "VLLM_SERVER_DEV_MODE" not in plain.env


def test_a_checkpoint_that_cannot_be_described_is_never_swapped(tmp_path):
    cfg = load_profile("demo")
    missing = shape(LocalExecutor(), _arm("m", "extra", path=str(tmp_path / "nothing")), cfg, 30)
    assert missing.key is None and "could not be described" in missing.why
    head = F.specforge(tmp_path / "head", F.LLAMA)  # an EAGLE-3 head whose target's layers are unknown: never swapped,
    unknown = shape(LocalExecutor(), _arm("h", "extra", path=str(head)), cfg, None)  # its aux ids could not be set
    assert unknown.key is None and "layer count" in unknown.why
    ngram = shape(LocalExecutor(), Arm("n", "extra", "ngram", DrafterConfig(method="ngram")), cfg, 30)
    assert ngram.key is None and "no drafter weights" in ngram.why


def test_a_tensor_of_another_dtype_or_shape_is_another_server(tmp_path, kimi):
    """Same config, one tensor stored otherwise: the engine would build the same head, but the weights would not load
    into it in place, so the arm gets its own server."""
    from safetensors.torch import load_file, save_file

    cfg, heads = load_profile("demo"), [F.specforge(tmp_path / n, F.KIMI_K25) for n in ("a", "b")]

    def key(path):
        return shape(LocalExecutor(), _arm("x", "extra", path=str(path)), cfg, 61).key
    assert key(heads[0]) == key(heads[1])
    file = next(heads[1].glob("*.safetensors"))
    tensors = load_file(str(file))
    stored = tensors["fc.weight"].dtype
    tensors["fc.weight"] = tensors["fc.weight"].bfloat16()  # fp32 in the fixture
    save_file(tensors, str(file))
    assert key(heads[0]) != key(heads[1])
    tensors["fc.weight"] = tensors["fc.weight"][:, :-1].to(stored).contiguous()
    save_file(tensors, str(file))
    assert key(heads[0]) != key(heads[1])
