import pytest

from infra.config import DrafterConfig, SpecdiagError, load_profile


def test_demo_profile_loads_with_its_drafters():
    p = load_profile("demo")
    assert p.name == "demo" and p.target.model == "embedded:smollm2"
    assert {"smol-self", "smol-self-short", "smol-permuted", "smol-noisy", "ngram", "ngram-never", "smol-eagle3",
            "smol-eagle3-weak", "smol-eagle3-scrambled", "smol-eagle3-nod2t", "smol-eagle3-wrongaux", "smol-eagle3-badpatch", "smol-eagle3-noisy"} == set(p.drafters)
    assert p.drafters["smol-eagle3-badpatch"].engine_env == {"SPECDIAG_FAULT_AUX_LAYERS": "0,1,2"}
    assert (p.drafter, p.control) == ("smol-permuted", "smol-self")
    assert "--enforce-eager" in p.target.args


def test_kimi_profile_is_the_seed_deployment():
    p = load_profile("kimi-k25")
    args = p.target.args
    assert args[args.index("--tensor-parallel-size") + 1] == "8"
    assert args[args.index("--tool-call-parser") + 1] == "kimi_k2"
    assert args[args.index("--reasoning-parser") + 1] == "kimi_k2"
    assert args[args.index("--max-model-len") + 1] == "32768"
    assert args[args.index("--gpu-memory-utilization") + 1] == "0.95"
    assert "--trust-remote-code" in args
    assert p.drafters["aqmedai"].model == "/data/eagle3/aq-medai-k2-drafter"
    assert p.drafters["custom"].model == "/data/eagle3/output_10k/4"
    assert {d.method for d in p.drafters.values()} == {"eagle3"}
    assert {d.num_speculative_tokens for d in p.drafters.values()} == {5}


def test_cli_overrides_beat_yaml():
    p = load_profile("demo", {"drafter": "ngram", "bench.max_tokens": 7, "control": None},
                     ["bench.concurrency=3", "target.args=[--foo]"])
    assert p.drafter == "ngram" and p.control == "smol-self"  # None keeps the profile's value
    assert p.bench.max_tokens == 7 and p.bench.concurrency == 3 and p.target.args == ["--foo"]


def test_unknown_profile_lists_known_ones():
    with pytest.raises(SpecdiagError, match="known profiles: demo, kimi-k25"):
        load_profile("nope")


@pytest.mark.parametrize("sets, message", [
    (["drafters.x.method=bogus"], "unknown speculative method 'bogus'"),
    (["drafters.x={method: eagle3}"], "needs a drafter checkpoint"),
    (["drafters.x={method: ngram, extra: {method: eagle}}"], "must not repeat"),
    (["bench.max_tokens=0"], "bench.max_tokens"),
    (["target.typo=1"], "target.typo"),
    (["bench.max_tokens"], "expected KEY=VALUE"),
])
def test_bad_config_is_a_clear_error(sets, message):
    with pytest.raises(SpecdiagError, match=message):
        load_profile("demo", sets=sets)


def test_speculative_config_shape():
    d = DrafterConfig(method="ngram", num_speculative_tokens=3, extra={"prompt_lookup_max": 4})
    assert d.speculative_config(None) == {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 4}


def test_host_inventory_picks_the_profiles_ssh_host():
    p = load_profile("kimi-k25")
    assert p.host.name == "gpu-box" and p.host.kind == "ssh" and p.host.gpus == list(range(8))
    assert p.engine_python == "/opt/vllm/bin/python" and not p.host.accept_unknown_host_keys
    assert load_profile("kimi-k25", sets=["host=local"]).host.kind == "local"


def test_unknown_host_lists_the_inventory():
    with pytest.raises(SpecdiagError, match="unknown host 'nope'; known hosts: gpu-box, local"):
        load_profile("kimi-k25", sets=["host=nope"])
    with pytest.raises(SpecdiagError, match="kind ssh: set its address"):
        load_profile("demo", sets=["hosts.box={kind: ssh}", "host=box"])
