"""Arms spread over hosts (infra/spread.py): each next arm to the first free host, a host's own port and engine
environment, and the refusals that name the missing service."""
import threading
import time

import pytest
from prefect.settings import PREFECT_API_URL, temporary_settings

from infra import spread
from infra.arms import plan_arms, plan_server
from infra.config import SpecdiagError, load_profile

TWO_HOSTS = ["hosts.gpu1.kind=ssh", "hosts.gpu1.address=10.0.0.1", "hosts.gpu1.env={CUDA_MODULE_LOADING: LAZY}",
             "hosts.gpu2.kind=ssh", "hosts.gpu2.address=10.0.0.2", "hosts.gpu2.server_port=8020", "hosts.gpu2.cpus=[2, 3]",
             "engine.env={A: engine, CUDA_MODULE_LOADING: EAGER}", "spread.hosts=[gpu1, gpu2]"]


def test_each_next_item_goes_to_the_first_free_host_and_no_host_runs_two_at_once():
    busy, log, lock = set(), [], threading.Lock()

    def run(item, host):
        with lock:
            assert host not in busy, f"{host} was given {item} while busy"
            busy.add(host)
            log.append((item, host, time.monotonic()))
        time.sleep(item[1])
        with lock:
            busy.discard(host)
        return f"{item[0]}@{host}"

    items = [("baseline", 0.2), ("candidate", 1.0), ("control", 0.2), ("extra", 0.2)]
    out = spread.dispatch(["a", "b"], items, run)
    assert [o.split("@")[0] for o in out] == ["baseline", "candidate", "control", "extra"]  # the items' order
    hosts = dict((name, host) for (name, _), host, _ in log)
    assert hosts["baseline"] != hosts["candidate"]
    # the long candidate holds its host: the next arms go to the other one, as it frees
    assert hosts["control"] == hosts["extra"] == hosts["baseline"]
    started = {name: t for (name, _), _, t in log}
    assert started["extra"] - started["baseline"] < 0.9  # did not wait for the candidate


def test_a_host_serves_with_its_own_port_and_engine_environment():
    cfg = load_profile("demo", sets=TWO_HOSTS)
    arm = plan_arms(cfg)[1]
    one, two = cfg.on_host("gpu1"), cfg.on_host("gpu2")
    assert (one.host.name, one.server_port, two.host.name, two.server_port) == ("gpu1", 8011, "gpu2", 8020)
    assert one.engine_env["CUDA_MODULE_LOADING"] == "LAZY" and one.engine_env["A"] == "engine"
    assert two.engine_env["CUDA_MODULE_LOADING"] == "EAGER"
    plan = plan_server(two, arm, "/tmp/w")
    assert plan.port == 8020 and "8020" in plan.argv and plan.env["CUDA_MODULE_LOADING"] == "EAGER"
    assert plan.argv[:3] == ["taskset", "-c", "2,3"] and plan.env["VLLM_CPU_OMP_THREADS_BIND"] == "2,3"
    assert plan_server(one, arm, "/tmp/w").argv[0] != "taskset"
    assert cfg.host.name == "local"  # the profile's own host is unchanged


def test_an_unknown_host_to_spread_over_is_a_clear_error():
    with pytest.raises(SpecdiagError, match="unknown host 'gpu3'.*known hosts: gpu1, gpu2, local"):
        load_profile("demo", sets=TWO_HOSTS[:-1] + ["spread.hosts=[gpu1, gpu3]"])


def test_spreading_needs_a_prefect_server_and_a_tracking_server(prefect_server):
    cfg = load_profile("demo", sets=TWO_HOSTS)
    with temporary_settings({PREFECT_API_URL: None}), pytest.raises(SpecdiagError, match="prefect server start"):
        spread.check(cfg, "http://127.0.0.1:5000")
    with pytest.raises(SpecdiagError, match="mlflow server --backend-store-uri"):
        spread.check(cfg, "sqlite:///mlflow.db")
    # the session's Prefect server answers without credentials: refused, naming the fix and the way around it
    with pytest.raises(SpecdiagError, match="Prefect server at .* answers without credentials.*"
                                            "PREFECT_API_AUTH_STRING.*--insecure-services"):
        spread.check(cfg, "http://127.0.0.1:5000")
    # a name no test deploys: the session's Prefect server may hold arm/spread already (tests/e2e/test_spread.py)
    cfg = load_profile("demo", sets=TWO_HOSTS + ["spread.deployment=arm/never-deployed",
                                                 "spread.insecure_services=true"])
    with pytest.raises(SpecdiagError, match="prefect --no-prompt deploy --name never-deployed"):
        spread.check(cfg, "http://127.0.0.1:5000")
    assert spread.unpolled("never-created-pool", ["gpu1", "gpu2"]) == ["gpu1", "gpu2"]  # no queue, no worker


def test_a_worker_takes_code_choosing_settings_only_from_its_own_profile(tmp_path):
    """A flow run of the arm deployment whose parameters change the engine's Python, its env, a host or the target's
    server args (--trust-remote-code) is refused by the worker before anything starts: anyone who can create a flow
    run could otherwise run code on it and, through its SSH keys, on the hosts."""
    import yaml

    from infra.arms import plan_arms
    from infra.config import PROFILES_DIR

    own = yaml.safe_load((PROFILES_DIR / "demo.yaml").read_text())
    own["hosts"] = {"gpu1": {"kind": "ssh", "address": "10.0.0.1"}, "gpu2": {"kind": "ssh", "address": "10.0.0.2"}}
    path = tmp_path / "fleet.yaml"
    path.write_text(yaml.safe_dump(own))
    cfg = load_profile(str(path), sets=["spread.hosts=[gpu1, gpu2]", "bench.max_tokens=8"])
    spread.vet(cfg.on_host("gpu1"), plan_arms(cfg))  # as the profile on this disk says (benchmark settings aside)
    forged = ["engine.python=/tmp/evil/python", "engine.env.LD_PRELOAD=/tmp/evil.so", "hosts.gpu1.address=10.6.6.6",
              'target.args=["--trust-remote-code"]', "drafters.smol-permuted.engine_env.VLLM_PLUGINS=evil"]
    for forged_set in forged:
        bad = load_profile(str(path), sets=["spread.hosts=[gpu1, gpu2]", forged_set])
        with pytest.raises(SpecdiagError, match="refused: this run's .* differ from the worker's profile"):
            spread.vet(bad.on_host("gpu1"), plan_arms(bad))
    with pytest.raises(SpecdiagError, match="no profile 'elsewhere.yaml'"):
        spread.vet(cfg.model_copy(update={"source": "elsewhere.yaml"}), plan_arms(cfg))


def test_a_confirm_arm_of_a_spread_diagnosis_goes_to_a_spread_hosts_worker(monkeypatch, tmp_path):
    """--confirm with --hosts: the fix arm is measured by a spread host's worker with that host's settings, not in
    the diagnosing process on the profile's own host (which, on a GPU fleet, may have no GPU)."""
    import flows.diagnose as d
    from tasks.record import ArmResult
    from tasks.verdict import Verdict

    cfg = load_profile("demo", {"drafter": "ngram", "confirm": True}, TWO_HOSTS + ["host=local"])
    measured = []
    monkeypatch.setattr(d, "_measure", lambda on, group, *a: measured.append((on, *group, a)) or
                        [ArmResult(group[0].name, group[0].role, "run-fix", True)])
    monkeypatch.setattr(d, "confirm", lambda tracker, parent, v, results, why: v)
    monkeypatch.setattr(d, "compare", lambda tracker, parent, results: None)
    runs = spread.RemoteRuns(cfg.spread.deployment, cfg.spread.pool)
    from infra.tracking import Tracker

    tracker = Tracker(f"sqlite:///{tmp_path}/mlflow.db")
    d._confirmed(cfg, Verdict("draft_overhead", fix={"num_speculative_tokens": 2}), plan_arms(cfg), [], tracker,
                 ("exp", "parent"), ["p"], runs)
    (on, arm, rest), = measured
    assert arm.role == "confirm" and arm.spec.num_speculative_tokens == 2
    assert on.host.name == "gpu1" and rest[-2:] == (runs, "gpu1")  # by gpu1's worker, as gpu1 serves


def test_the_arms_riding_on_a_spread_arms_server_reach_its_worker_as_planned():
    """Spread, a server's group is one flow run of the arm deployment: its parameters go as JSON to the worker, whose
    flow validates them back. The riders (probes on the candidate's server) must arrive equal to the plan, with their
    own benchmark settings, offline numbers and fingerprints."""
    from pydantic import TypeAdapter

    from flows.arm import Rider, run_arm
    from infra.arms import shared_servers

    cfg = load_profile("demo", {"drafter": "ngram", "control": ""}, ["probes=[raw_prompts, temperature, k_sweep]"])
    server, *_ = [g for g in shared_servers(plan_arms(cfg), lambda a: a.role == "probe") if len(g) > 1]
    riders = [Rider(a, {"offline_acceptance_rate": 0.5}, {"bench": a.name}) for a in server[1:]]
    params = dict(cfg=cfg, arm=server[0], tracking_uri="http://mlflow:5000", experiment_id="1", parent_run_id="p",
                  workdir="/w", prompts=["a"], riders=riders, beside=True)
    back = run_arm.validate_parameters(TypeAdapter(dict).dump_python(params, mode="json"))
    assert [r.arm.name for r in back["riders"]] == ["ngram@raw", "ngram@T=1"] and back["riders"] == riders
    assert back["riders"][0].arm.bench_config(back["cfg"]).endpoint == "completions"
