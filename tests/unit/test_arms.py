import json
import socket

import pytest

from infra.arms import infer_method, plan_arms, plan_server, resolve_arm, shared_servers, validate_inputs
from infra.config import SpecdiagError, load_profile


def _checkpoint(path, config):
    path.mkdir(parents=True)
    (path / "config.json").write_text(json.dumps(config))
    return path


def test_arms_run_in_order_baseline_candidate_control_extras():
    p = load_profile("demo", {"arms": ["ngram", "smol-noisy"]})
    arms = plan_arms(p)
    assert [(a.name, a.role) for a in arms] == [
        ("baseline", "baseline"), ("smol-permuted", "candidate"), ("smol-self", "control"),
        ("ngram", "extra"), ("smol-noisy", "extra")]
    assert arms[0].spec is None and arms[0].drafter is None


def test_probes_that_change_only_the_benchmark_ride_on_the_candidates_server(tmp_path):
    """raw_prompts, temperature and thinking serve the candidate exactly as it is served (the same command line):
    one load for the candidate and them. k_sweep (another k) and graphs (other target arguments) need their own
    server; so do arms whose speed the verdict judges (the server has served the same prompts before them)."""
    p = load_profile("demo", {"drafter": "ngram", "arms": ["smol-noisy"]},
                     ["probes=[k_sweep, graphs, raw_prompts, temperature, thinking]", "k_sweep=[2]"])
    arms = plan_arms(p)
    judged = {"baseline", "candidate", "extra"}
    groups = shared_servers(arms, lambda a: a.role not in judged)
    assert [[a.name for a in g] for g in groups] == [
        ["baseline"], ["ngram", "ngram@raw", "ngram@T=1", "ngram@enable_thinking=false"], ["smol-self"],
        ["smol-noisy"], ["ngram@k=2"], ["ngram@graphs"]]
    for g in groups:  # each rider's own server command would be the one it rides on, to the byte
        assert {tuple(plan_server(p, a, tmp_path).argv) for a in g} == {tuple(plan_server(p, g[0], tmp_path).argv)}
    assert len({tuple(plan_server(p, g[0], tmp_path).argv) for g in groups}) == len(groups)
    # an arm that may not ride (its speed judged, or a static finding blocks it) gets its own server
    assert [len(g) for g in shared_servers(arms, lambda a: False)] == [1] * len(arms)


def test_unknown_drafter_lists_known_ones():
    with pytest.raises(SpecdiagError, match="known drafters in profile 'demo': ngram, ngram-never, smol-eagle3"):
        plan_arms(load_profile("demo", {"drafter": "aqmedai"}))


def test_duplicate_arms_are_refused():
    with pytest.raises(SpecdiagError, match="appear twice"):
        plan_arms(load_profile("demo", {"arms": ["smol-self"]}))
    # the seed's own command on its profile: aqmedai is kimi-k25's control; the error names the way out
    with pytest.raises(SpecdiagError, match="'aqmedai' is both the candidate.*--control NAME.*--no-control"):
        plan_arms(load_profile("kimi-k25", {"drafter": "aqmedai"}))
    assert [a.role for a in plan_arms(load_profile("kimi-k25", {"drafter": "aqmedai", "control": ""}))] == [
        "baseline", "candidate"]


def test_checkpoint_path_infers_method_and_names_arm_after_folder(tmp_path):
    eagle = _checkpoint(tmp_path / "my-eagle", {"architectures": ["LlamaForCausalLMEagle3"], "draft_vocab_size": 32000})
    lm = _checkpoint(tmp_path / "small-lm", {"architectures": ["LlamaForCausalLM"]})
    spec_fmt = _checkpoint(tmp_path / "spec", {"speculators_config": {"algorithm": "eagle3"}})
    p = load_profile("demo")
    arm = resolve_arm(p, str(eagle), "candidate")
    assert (arm.name, arm.spec.method, arm.spec.model) == ("my-eagle", "eagle3", str(eagle))
    assert resolve_arm(p, str(lm), "control").spec.method == "draft_model"
    assert infer_method(spec_fmt) == "eagle3"
    with pytest.raises(SpecdiagError, match="no config.json"):
        infer_method(tmp_path)
    with pytest.raises(SpecdiagError, match="cannot tell the drafter type"):
        infer_method(_checkpoint(tmp_path / "odd", {"architectures": ["BertModel"]}))


def test_missing_drafter_path_is_refused(tmp_path):
    with pytest.raises(SpecdiagError, match="does not exist"):
        resolve_arm(load_profile("demo"), str(tmp_path / "gone"), "candidate")
    p = load_profile("demo", sets=[f"drafters.x={{method: eagle3, model: {tmp_path / 'gone'}}}", "drafter=x"])
    with pytest.raises(SpecdiagError, match="drafter 'x' path .* does not exist"):
        validate_inputs(p, plan_arms(p))


def test_port_in_use_is_refused_before_launch():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        p = load_profile("demo", {"target.port": s.getsockname()[1]})
        with pytest.raises(SpecdiagError, match="already in use .* specdiag did not start.*--port"):
            validate_inputs(p, plan_arms(p))
        # a host with its own server_port: --port would not change it, the host's setting does
        own = load_profile("demo", sets=[f"hosts.local.server_port={s.getsockname()[1]}"])
        with pytest.raises(SpecdiagError, match=r"pick another port with --set hosts.local.server_port=PORT\Z"):
            validate_inputs(own, plan_arms(own))


def test_port_held_by_another_diagnosis_queues_instead(tmp_path, monkeypatch, capsys):
    """The port is busy because a live diagnosis's server holds it: this one waits for the host lock, not fails."""
    from infra import registry

    monkeypatch.setattr(registry, "_dir", lambda: tmp_path)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        registry.remember(4242, 4242, "baseline", "local", "vllm serve", port)  # by this (live) process
        p = load_profile("demo", {"target.port": port})
        validate_inputs(p, plan_arms(p))
        assert f"port {port} on this machine is held by the server of another diagnosis" in capsys.readouterr().out


def test_kimi_server_command_is_the_seed_command(tmp_path):
    p = load_profile("kimi-k25")
    arm = plan_arms(p)[1]
    plan = plan_server(p, arm, tmp_path)
    argv = plan.argv
    assert argv[0] == "/opt/vllm/bin/python" and argv[argv.index("--model") + 1] == "moonshotai/Kimi-K2.5"
    assert argv[argv.index("--tensor-parallel-size") + 1] == "8"
    spec = json.loads(argv[argv.index("--speculative-config") + 1])
    assert spec == {"method": "eagle3", "model": "/data/eagle3/output_10k/4", "num_speculative_tokens": 5}
    assert plan.params["spec_method"] == "eagle3" and plan.params["num_speculative_tokens"] == "5"
    assert plan.log_path == str(tmp_path / "custom.server.log")
    # the roles the seed meant: the fine-tuned head is the suspect, the checkpoint it came from the reference
    assert [(a.name, a.role) for a in plan_arms(p)[1:3]] == [("custom", "candidate"), ("aqmedai", "control")]
    baseline = plan_server(p, plan_arms(p)[0], tmp_path)
    assert "--speculative-config" not in baseline.argv and baseline.params["spec_method"] == "none"


def test_a_cached_model_built_from_an_older_fixture_is_built_again(tmp_path, monkeypatch):
    """Cached copies carry a stamp of the fixture they came from: retraining the shipped head reaches every user."""
    from infra import embedded

    monkeypatch.setenv("SPECDIAG_CACHE", str(tmp_path))
    builds = []

    def build(tmp):
        tmp.mkdir(parents=True)
        (tmp / "model.safetensors").write_text(str(len(builds)))
        builds.append(tmp)

    first = embedded._built_once("head", ".from-aaa", build)
    assert embedded._built_once("head", ".from-aaa", build) == first and len(builds) == 1
    again = embedded._built_once("head", ".from-bbb", build)  # the fixture changed
    assert len(builds) == 2 and (again / ".from-bbb").exists() and not (again / ".from-aaa").exists()


def test_the_stamp_of_a_fixture_changes_with_its_weights_alone(tmp_path):
    """A head retrained into the same config and notes is another head: its cached copy must not be served (one was,
    for a whole measurement, before the weights entered the stamp)."""
    from infra.embedded import _stamp

    for name, text in (("config.json", "{}"), ("specdiag.json", "{}"), ("model.safetensors", "head 1")):
        (tmp_path / name).write_text(text)
    first = _stamp(tmp_path)
    (tmp_path / "model.safetensors").write_text("head 2")
    assert _stamp(tmp_path) != first and _stamp(tmp_path).startswith(".from-")


def test_extra_settings_are_left_to_the_server_when_the_engine_cannot_be_read(capsys):
    """An engine Python without vLLM (a wrong hosts.<name>.python is caught elsewhere): a note, not a refusal."""
    import sys

    from infra.arms import Arm, _check_extra
    from infra.config import DrafterConfig
    from infra.executor import LocalExecutor

    arm = Arm("ngram", "candidate", "ngram", DrafterConfig(method="ngram", extra={"prompt_lookup_min": 2}))
    _check_extra(LocalExecutor(), sys.executable, [arm], "on this machine")
    assert "the engine's speculative settings could not be read: ModuleNotFoundError: No module named 'vllm'" \
        in capsys.readouterr().out
