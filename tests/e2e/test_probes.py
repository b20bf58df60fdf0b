"""Every probe that changes how the candidate is served or benchmarked, against the real engine, in one diagnosis of
the cheapest candidate (n-gram lookup: no drafter weights to load). Each probe arm is the candidate with one thing
changed; the arm's run records the change, the engine takes it, and the verdict reads the arm. A probe that changes
only the benchmark rides on the candidate's server."""
import json
import re

import pytest

from infra.tracking import metric_name
from tasks.verdict import HEALTHY, acceptance_interval
from tasks.verdict.probes import probe_flips

pytestmark = pytest.mark.e2e

PROBES = ("k_sweep", "graphs", "raw_prompts", "temperature", "thinking")


def test_each_probe_serves_the_candidate_with_one_thing_changed(cli, no_servers_left):
    args = [x for p in PROBES for x in ("--probe", p)]
    done = cli("--drafter", "ngram", "--no-control", *args, "--set", "k_sweep=[2]", "--prompts", "3",
               "--max-tokens", "32")
    assert done.returncode == 0, done.output[-3000:]
    arms = done.arms
    assert set(arms) == {"baseline", "ngram", "ngram@k=2", "ngram@graphs", "ngram@raw", "ngram@T=1",
                         "ngram@enable_thinking=false"}
    for name, run in arms.items():
        assert run.info.status == "FINISHED", name
        assert run.data.metrics["sys/requests_ok"] == 3 and run.data.metrics["sys/output_tokens"] > 0, name
        if name != "baseline":  # every probe arm served with speculation on (raw completions may find no n-gram)
            assert "num_draft_tokens" in run.data.metrics and "--speculative-config" in run.data.params["server_cmd"]
    assert arms["ngram"].data.metrics["num_drafts"] > 0
    params = {name: run.data.params for name, run in arms.items()}
    assert {params[a]["probe"] for a in arms if "@" in a} == set(PROBES)
    assert params["ngram@k=2"]["num_speculative_tokens"] == "2"
    # graphs: the one arm whose server compiles (no --enforce-eager); every other keeps the profile's eager flag
    assert "--enforce-eager" not in params["ngram@graphs"]["server_cmd"]
    assert all("--enforce-eager" in params[a]["server_cmd"] for a in arms if a != "ngram@graphs")
    assert params["ngram@raw"]["bench_endpoint"] == "completions" and params["ngram"]["bench_endpoint"] == "chat"
    assert params["ngram@T=1"]["bench_temperature"] == "1.0"
    assert json.loads(params["ngram@enable_thinking=false"]["bench_chat_template_kwargs"]) == {"enable_thinking": False}
    # the probes that change only the benchmark are measured on the candidate's own server, after it: one load for
    # the four of them, each in its own run and window; k_sweep and graphs each load their own
    riders = {"ngram@raw", "ngram@T=1", "ngram@enable_thinking=false"}
    assert {a for a in arms if params[a].get("server_shared_with") == "ngram"} == riders
    assert all(params[a]["server_cmd"] == params["ngram"]["server_cmd"] for a in riders)
    launches = sorted(re.search(r"\[(\S+)\] launched pid", ln)[1] for ln in done.output.splitlines()
                      if "] launched pid" in ln)
    assert launches == sorted(["baseline", "ngram", "ngram@k=2", "ngram@graphs"]), launches
    for a in riders:  # the printed table and the closing line say where each rider was measured
        assert "now, on ngram's server" in next(ln for ln in done.output.splitlines() if ln.split()[:1] == [a])
        assert f"{a} on ngram's server + " in done.output
    # each window records what it was measured towards; the riders were compared with the candidate's window just
    # measured on their server (flows/arm.run_arm), at the points where the probes rule's comparison flips
    candidate = {metric_name(k): v for k, v in arms["ngram"].data.metrics.items()}
    # the baseline, measured last on this one host, was asked the speedups the verdict judges: the k_sweep arm's
    # always, the candidate's where its acceptance may be healthy (tasks/verdict/asks.speed_compared)
    asked = arms["baseline"].data.tags["specdiag.asked"]
    assert asked.startswith("tok/s against ") and "ngram@k=2 (3 requests, bound " in asked, asked
    assert ("ngram (3 requests, bound " in asked) == (acceptance_interval(candidate)[1] >= HEALTHY), asked
    assert arms["ngram"].data.tags["specdiag.asked"].endswith("tok/s to its own precision where its acceptance "
                                                               "reaches 0.6")
    for a in riders | {"ngram@graphs"}:
        flips = probe_flips(params[a]["probe"], candidate)
        asked = arms[a].data.tags["specdiag.asked"]
        assert flips and all(f"{t:g}" in asked for t in flips), (a, flips, asked)
    verdict = done.artifact_text(done.parent, "verdict.md")
    # k_sweep: predicted vs measured speedup at each k, and the k with the best measured speedup named
    sweep = next(ln for ln in verdict.splitlines() if ln.startswith("- k_sweep:"))
    measured = {int(k): float(v) for k, v in re.findall(r"k=(\d+): predicted \d+\.\d+x, measured (\d+\.\d+)x", sweep)}
    assert set(measured) == {2, 4} and int(re.search(r"best measured k=(\d+)", sweep)[1]) == max(measured,
                                                                                                  key=measured.get)
    assert all(f"{a}: acceptance" in verdict for a in arms if "@" in a), verdict  # every probe's own line
