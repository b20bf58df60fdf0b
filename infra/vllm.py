"""The vLLM engine adapter: the server command, and how to read its /metrics and its log."""
from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field

from prometheus_client.parser import text_string_to_metric_families

SPEC_PREFIX = "vllm:spec_decode_"
FATAL_LOG_PATTERNS = (
    "Engine core initialization failed",
    "EngineCore failed to start",
    "RuntimeError: Engine",
    "Address already in use",
    "unrecognized arguments",
)


def server_argv(python: str, model: str, port: int, args: list[str], speculative_config: dict | None,
                served_model_name: str | None, per_request_spec_metrics: str = "none") -> list[str]:
    argv = [python, "-m", "vllm.entrypoints.openai.api_server", "--model", model,
            "--host", "127.0.0.1", "--port", str(port)]
    if served_model_name:
        argv += ["--served-model-name", served_model_name]
    argv += list(args)
    if speculative_config is not None:
        argv += ["--speculative-config", json.dumps(speculative_config, sort_keys=True)]
        if per_request_spec_metrics != "none":  # each response's usage chunk then carries its own spec counts
            argv += ["--per-request-spec-decode-metrics", per_request_spec_metrics]
    return argv


def server_env(env: dict[str, str]) -> dict[str, str]:
    """Engine environment; 'auto' for the CPU thread binding means every core this process may use."""
    out = dict(env)
    if out.get("VLLM_CPU_OMP_THREADS_BIND") == "auto":
        cores = sorted(os.sched_getaffinity(0))
        out["VLLM_CPU_OMP_THREADS_BIND"] = f"{cores[0]}-{cores[-1]}" if len(cores) > 1 else str(cores[0])
    out.setdefault("VLLM_LOG_STATS_INTERVAL", "1")  # fine-grained log cross-check
    return out


# vLLM parses --speculative-config into its own pydantic dataclass (extra keys forbidden), but only once the server
# starts. These are the engine's own field rules, run by the host's engine Python on a drafter's 'extra' keys before
# any server starts: a typo costs seconds, not a load. Importing vLLM's config takes seconds on a small host, so the
# answer is kept there (~/.cache/specdiag/extra-checks), keyed by the engine (its Python, version and the installed
# speculative config's file) and the question. Output: one JSON line, arm -> its errors.
_CHECK_EXTRA = r"""
import dataclasses, difflib, hashlib, importlib.util, json, os, sys
from importlib.metadata import version
from typing import Annotated
asked, cache = sys.argv[1], None
try:
    src = os.path.join(os.path.dirname(importlib.util.find_spec("vllm").origin), "config", "speculative.py")
    engine = f"{sys.executable}\0{version('vllm')}\0{os.stat(src).st_mtime_ns}\0{asked}"
    cache = os.path.expanduser(f"~/.cache/specdiag/extra-checks/{hashlib.sha256(engine.encode()).hexdigest()}.json")
    with open(cache) as f:
        print("SPECDIAG_EXTRA " + f.read())
    sys.exit(0)
except (OSError, ValueError, AttributeError, ImportError):
    pass
try:
    from vllm.config.speculative import SpeculativeConfig
except ImportError:
    from vllm.config import SpeculativeConfig
import pydantic
fields = getattr(SpeculativeConfig, "__pydantic_fields__", None)
names = sorted(fields) if fields is not None else sorted(f.name for f in dataclasses.fields(SpeculativeConfig))
out = {}
for arm, extra in json.loads(asked).items():
    for key, value in extra.items():
        if key not in names:
            near = difflib.get_close_matches(key, names, 3)
            out.setdefault(arm, []).append(f"unknown key {key!r}" + (f" (did you mean {' or '.join(near)}?)" if near else ""))
        elif fields is not None:
            f = fields[key]
            try:
                pydantic.TypeAdapter(Annotated[(f.annotation, *f.metadata)]).validate_python(value)
            except pydantic.ValidationError as exc:
                out.setdefault(arm, []).append(f"{key}={value!r}: {exc.errors()[0]['msg']}")
if cache:
    try:
        os.makedirs(os.path.dirname(cache), exist_ok=True)
        with open(cache + ".tmp", "w") as f:
            json.dump(out, f)
        os.replace(cache + ".tmp", cache)
    except OSError:
        pass
print("SPECDIAG_EXTRA " + json.dumps(out))
"""


def check_extra_settings(ex, python: str, extras: dict[str, dict]) -> dict[str, list[str]]:
    """Per arm, what the engine on this host would refuse in its drafter's extra speculative settings (answered
    from the host's kept answers where the same engine was asked the same before: see _CHECK_EXTRA)."""
    done = ex.run([python, "-c", _CHECK_EXTRA, json.dumps(extras)], 180)
    line = next((ln for ln in done.stdout.splitlines() if ln.startswith("SPECDIAG_EXTRA ")), None)
    if line is None:
        tail = (done.stderr or done.stdout).strip().splitlines()[-1:] or [f"exit {done.returncode}"]
        raise RuntimeError(f"the engine's speculative settings could not be read: {tail[0]}")
    return json.loads(line.split(" ", 1)[1])


@dataclass
class SpecCounters:
    """Cumulative spec-decode counters from one /metrics scrape, summed over engines."""

    present: bool = False
    num_drafts: float = 0.0
    num_draft_tokens: float = 0.0
    num_accepted_tokens: float = 0.0
    accepted_per_pos: dict[int, float] = field(default_factory=dict)
    generation_tokens: float = 0.0

    def __sub__(self, before: "SpecCounters") -> "SpecCounters":
        return SpecCounters(
            present=self.present,
            num_drafts=self.num_drafts - before.num_drafts,
            num_draft_tokens=self.num_draft_tokens - before.num_draft_tokens,
            num_accepted_tokens=self.num_accepted_tokens - before.num_accepted_tokens,
            accepted_per_pos={p: v - before.accepted_per_pos.get(p, 0.0)
                              for p, v in self.accepted_per_pos.items()},
            generation_tokens=self.generation_tokens - before.generation_tokens,
        )

    def rates(self) -> dict[str, float]:
        """acceptance_rate, mean_acceptance_length and acceptance_rate_pos_<i> (FIELD_NOTES' formulas)."""
        out = {"num_drafts": self.num_drafts, "num_draft_tokens": self.num_draft_tokens,
               "num_accepted_tokens": self.num_accepted_tokens}
        if self.num_draft_tokens > 0:
            out["acceptance_rate"] = self.num_accepted_tokens / self.num_draft_tokens
        if self.num_drafts > 0:
            out["mean_acceptance_length"] = 1.0 + self.num_accepted_tokens / self.num_drafts
            for pos, acc in sorted(self.accepted_per_pos.items()):
                out[f"acceptance_rate_pos_{pos}"] = acc / self.num_drafts
        return out


def parse_metrics(text: str) -> SpecCounters:
    counters = SpecCounters()
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            name = sample.name
            if not name.endswith("_total"):
                continue  # skips the _created series
            if name == "vllm:generation_tokens_total":
                counters.generation_tokens += sample.value
            if not name.startswith(SPEC_PREFIX):
                continue
            counters.present = True
            key = name[len(SPEC_PREFIX):-len("_total")]
            if key == "num_accepted_tokens_per_pos":
                pos = int(sample.labels["position"])
                counters.accepted_per_pos[pos] = counters.accepted_per_pos.get(pos, 0.0) + sample.value
            elif key in ("num_drafts", "num_draft_tokens", "num_accepted_tokens"):
                setattr(counters, key, getattr(counters, key) + sample.value)
    return counters


_SPEC_LOG = re.compile(r"SpecDecoding metrics: .*?Accepted: (\d+) tokens, Drafted: (\d+) tokens")
_VERSION_LOG = re.compile(r"(?:vLLM API server version |Initializing a V1 LLM engine \(v)([\w.+-]+?)\)?[\s,]")
_AUX_LOG = re.compile(r"Using auxiliary layers from speculative config: \(([\d, ]+)\)")


def parse_log_spec_lines(text: str) -> dict[str, float]:
    """Sum the per-interval 'SpecDecoding metrics' log lines: the engine's own cross-check."""
    accepted = drafted = lines = 0
    for match in _SPEC_LOG.finditer(text):
        accepted += int(match.group(1))
        drafted += int(match.group(2))
        lines += 1
    out = {"log_spec_lines": float(lines), "log_accepted_tokens": float(accepted),
           "log_draft_tokens": float(drafted)}
    if drafted:
        out["log_acceptance_rate"] = accepted / drafted
    return out


def parse_engine_version(log_text: str) -> str | None:
    match = _VERSION_LOG.search(log_text)
    return match.group(1) if match else None


def parse_aux_layers(log_text: str) -> list[int] | None:
    match = _AUX_LOG.search(log_text)
    return [int(x) for x in match.group(1).split(",") if x.strip()] if match else None


# A fatal line that names one of these gets the fix beside it.
FATAL_HINTS = {
    "--per-request-spec-decode-metrics": "this vLLM predates per-request spec-decode metrics (0.32): "
                                         "--set engine.per_request_spec_metrics=none",
}


def fatal_line(log_text: str) -> str | None:
    for line in log_text.splitlines():
        if any(p in line for p in FATAL_LOG_PATTERNS):
            hints = [h for key, h in FATAL_HINTS.items() if key in line]
            return line.strip() + "".join(f" (fix: {h})" for h in hints)
    return None
