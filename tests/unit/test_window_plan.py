"""Before measuring, the plan says how many requests a window can take and whether they can settle a candidate as
good as its control (issue 38, item 4): a window never repeats a prompt under greedy decoding (a repeat is answered
identically, so it adds no evidence), and the shipped chat set is large enough for the demo's default to settle."""
from flows.diagnose import main, prepare
from tasks.verdict.evidence import NARROW
from tasks.verdict.settle import REQUEST_SD_32, requests_to_narrow, window_lines


def test_a_greedy_window_never_repeats_a_prompt_and_a_sampled_one_may():
    _, _, prompts = prepare("demo", sets=["bench.prompts=long", "bench.num_prompts=15"])
    assert len(prompts) == len(set(prompts)) == 8  # the long set holds 8: one warmup, 7 measured
    _, _, sampled = prepare("demo", sets=["bench.prompts=long", "bench.num_prompts=15", "bench.temperature=0.7"])
    assert len(sampled) == 16 and len(set(sampled)) == 8
    _, _, default = prepare("demo")
    assert len(default) == len(set(default)) == 41  # the demo's cap of 40 and its warmup, all distinct


def test_the_estimate_follows_the_spread_and_the_tokens():
    need = requests_to_narrow(32)
    assert 15 <= need <= 25  # measured 2026-12-07: the demo's EAGLE-3 head settled narrow after 17 chat requests
    assert requests_to_narrow(128) < need < requests_to_narrow(8)
    assert requests_to_narrow(32, width=2 * NARROW) < need
    # the estimate is what its docstring says: a t-interval at REQUEST_SD_32 just narrower than NARROW at `need`
    from scipy.special import stdtrit
    assert stdtrit(need - 1, 0.975) * REQUEST_SD_32 / need ** 0.5 <= NARROW / 2 < \
        stdtrit(need - 2, 0.975) * REQUEST_SD_32 / (need - 1) ** 0.5


def test_too_few_is_said_only_where_a_control_is_planned_and_the_window_cannot_reach_it():
    assert any("too few to settle" in ln for ln in window_lines(14, 16, 0, "chat", 32, paired=True))
    assert not any("too few" in ln for ln in window_lines(14, 16, 0, "chat", 32, paired=False))
    assert not any("too few" in ln for ln in window_lines(40, 64, 0, "chat", 32, paired=True))
    capped = window_lines(7, 8, 8, "long", 32, paired=True)
    assert "8 repeat(s) dropped" in capped[1] and "use a larger set" in capped[2]


def test_dry_run_says_it_before_any_server(capsys):
    assert main(["--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "prompts: at most 40 measured per arm ('chat' holds 64 distinct prompts)" in out and "too few" not in out
    assert main(["--dry-run", "--prompts", "15", "--prompt-set", "long"]) == 0
    out = capsys.readouterr().out
    assert "prompts: at most 7 measured per arm ('long' holds 8 distinct prompts)" in out
    assert "too few to settle a candidate as good as its control" in out, out
