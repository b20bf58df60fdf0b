import json
from pathlib import Path

import pytest

from infra import vllm

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
METRICS = (FIXTURES / "metrics_draft_model.txt").read_text()  # captured from a real vLLM CPU server


def test_parse_real_metrics_reads_spec_counters():
    c = vllm.parse_metrics(METRICS)
    assert c.present
    assert (c.num_drafts, c.num_draft_tokens, c.num_accepted_tokens) == (26.0, 104.0, 1.0)
    assert c.accepted_per_pos == {0: 1.0, 1: 0.0, 2: 0.0, 3: 0.0}
    assert c.generation_tokens == 28.0


def test_counters_sum_over_engines():
    second = "\n".join(line.replace('engine="0"', 'engine="1"') for line in METRICS.splitlines()
                       if line.startswith("vllm:spec_decode_") and line.split("{")[0].endswith("_total"))
    # a second engine's samples appended to the first's families
    c = vllm.parse_metrics(METRICS + "\n" + second + "\n")
    assert c.num_drafts == 52.0 and c.num_draft_tokens == 208.0 and c.accepted_per_pos[0] == 2.0


def test_no_spec_series_means_spec_decoding_off():
    baseline = "\n".join(l for l in METRICS.splitlines() if "spec_decode" not in l) + "\n"
    assert not vllm.parse_metrics(baseline).present


def test_deltas_and_rates_follow_the_field_formulas():
    before = vllm.SpecCounters(True, 10, 40, 20, {0: 8, 1: 6, 2: 4, 3: 2})
    after = vllm.SpecCounters(True, 110, 440, 320, {0: 98, 1: 86, 2: 74, 3: 62})
    rates = (after - before).rates()
    assert rates["acceptance_rate"] == pytest.approx(300 / 400)
    assert rates["mean_acceptance_length"] == pytest.approx(1 + 300 / 100)
    assert [rates[f"acceptance_rate_pos_{i}"] for i in range(4)] == pytest.approx([0.9, 0.8, 0.7, 0.6])
    assert rates["num_drafts"] == 100


def test_zero_drafts_reports_no_rates_rather_than_zero():
    rates = vllm.SpecCounters(True).rates()
    assert "acceptance_rate" not in rates and "mean_acceptance_length" not in rates


def test_log_spec_lines_are_summed():
    text = (FIXTURES / "spec_log_lines.txt").read_text()
    out = vllm.parse_log_spec_lines(text)
    assert out["log_spec_lines"] == 3
    assert out["log_accepted_tokens"] == 1 and out["log_draft_tokens"] == 104
    assert out["log_acceptance_rate"] == pytest.approx(1 / 104)
    assert vllm.parse_engine_version(text) == "0.32.0"


def test_aux_layers_and_fatal_lines():
    assert vllm.parse_aux_layers("INFO Using auxiliary layers from speculative config: (2, 15, 27)") == [2, 15, 27]
    assert vllm.fatal_line("ok\nRuntimeError: Engine core initialization failed. See root cause above.\n")
    assert vllm.fatal_line("INFO all good\n") is None


def test_server_argv_has_exact_speculative_config():
    argv = vllm.server_argv("py", "/m", 8011, ["--enforce-eager"], {"method": "ngram", "num_speculative_tokens": 4},
                            "smol")
    assert argv[:3] == ["py", "-m", "vllm.entrypoints.openai.api_server"]
    assert argv[argv.index("--port") + 1] == "8011" and argv[argv.index("--host") + 1] == "127.0.0.1"
    assert json.loads(argv[argv.index("--speculative-config") + 1]) == {"method": "ngram", "num_speculative_tokens": 4}
    assert "--speculative-config" not in vllm.server_argv("py", "/m", 1, [], None, None)


def test_server_env_binds_all_cores_for_auto():
    env = vllm.server_env({"VLLM_CPU_OMP_THREADS_BIND": "auto"})
    assert env["VLLM_CPU_OMP_THREADS_BIND"] != "auto"
    assert env["VLLM_LOG_STATS_INTERVAL"] == "1"


def test_configured_drafter_without_spec_series_is_reported_off_not_zero():
    from tasks.scrape import Snapshot, SpecDecodingOff, counter_metrics

    off = "\n".join(l for l in METRICS.splitlines() if "spec_decode" not in l) + "\n"
    snap = Snapshot(off, vllm.parse_metrics(off), 0)
    with pytest.raises(SpecDecodingOff, match="speculative decoding is OFF"):
        counter_metrics("cand", snap, snap, speculative=True)
    assert counter_metrics("baseline", snap, snap, speculative=False) == {}
    on = Snapshot(METRICS, vllm.parse_metrics(METRICS), 0)
    assert counter_metrics("cand", snap, on, speculative=True)["num_draft_tokens"] == 104.0
