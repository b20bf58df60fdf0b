"""The probes rule's reading of each probe arm against the candidate: the cause a clear difference names, where the
comparison flips (what a probe's early stop settles), and what a probe that did not differ says."""
from __future__ import annotations

from tasks.record import ArmResult
from tasks.verdict.evidence import MIN_DRAFTS, PROBE_RATIO, acceptance_interval, differs, probe_line
from tasks.verdict.settle import settle

# What a probe arm's clear difference from the candidate names: (either direction counts, cause, why, what to do).
# The control_mapping and aux_layers probes count only upwards: another mapping or other layers can only help a head
# whose own are wrong (a correct head accepts less on any other layers).
PROBE_CAUSES = {
    "control_mapping": (False, "vocab_mismatch", "with the control's d2t/t2d the same head accepts far more: its own "
                        "vocabulary mapping is wrong", "regenerate the candidate's d2t/t2d from the data it was "
                        "trained on, or reuse the control's"),
    "aux_layers": (False, "aux_layers", "fed other target layers, the same head accepts far more: the engine feeds "
                   "it layers it was not trained on", "set eagle_aux_hidden_state_layer_ids in the drafter's config "
                   "to the layers this probe arm fed it (its name)"),
    "graphs": (True, "integration", "acceptance changes with CUDA graphs / compilation alone: the engine's graph "
               "path runs the drafter differently", "serve the drafter eager (speculative config enforce_eager) and "
               "report it to the engine"),
    "raw_prompts": (True, "template_mismatch", "the same prompts with and without the chat template give very "
                    "different acceptance: the drafter was trained on another prompt format than it is served with",
                    "benchmark and train with the serving chat template"),
    "thinking": (True, "template_mismatch", "the same prompts with the template's thinking switched give very "
                 "different acceptance: the drafter was trained with thinking the other way than it is served",
                 "serve with the thinking mode the drafter was trained on, or train it on the served mode "
                 "(chat_template_kwargs)"),
    "temperature": (True, "sampling_mismatch", "greedy and sampled decoding accept very differently: the drafter "
                    "matches the target's top token but not its sampled distribution", "judge it at the served "
                    "temperature; train on sampled target outputs, or lower k for sampled traffic"),
}


def probe_flips(probe: str, candidate: dict[str, float] | None) -> tuple[float, ...]:
    """Where the probes rule's comparison (evidence.differs) flips for a probe arm against the measured candidate. It
    differs upwards once both above the candidate's interval and PROBE_RATIO times its rate: a probe interval wholly
    above the larger of the two does, one wholly below it never will (its point lies under one of them). Likewise
    downwards, for a probe counted either way, at the smaller of the candidate's lower end and its rate over
    PROBE_RATIO. Clear of these, a probe's window has settled what the rule asks of it."""
    if probe not in PROBE_CAUSES or not candidate or not candidate.get("num_drafts"):
        return ()
    (lo, hi), rate = acceptance_interval(candidate), candidate.get("acceptance_rate", 0.0)
    flips = (max(hi, PROBE_RATIO * rate),) + ((min(lo, rate / PROBE_RATIO),) if PROBE_CAUSES[probe][0] else ())
    return tuple(round(t, 4) for t in flips if 0 < t < 1)  # at 0 or 1 that direction cannot differ at all


def _quiet(p: ArmResult, cand: dict[str, float]) -> str:
    """A probe that did not differ from the candidate: checked where, over the rule's floor of drafts, its interval
    lies clear of where the comparison flips; else open, with what settling it would cost."""
    flips, (lo, hi) = probe_flips(p.probe, cand), acceptance_interval(p.metrics)
    if p.metrics.get("num_drafts", 0) >= MIN_DRAFTS and not any(lo <= t <= hi for t in flips):
        return f"{probe_line(p)}: no clear difference from the candidate"
    return f"{probe_line(p)}: no clear difference yet, but whether it differs from the candidate is open: " + \
        settle(p.arm, p.metrics, flips, at_least=MIN_DRAFTS)[0]


def read_probes(results: list[ArmResult], cand: dict[str, float]) -> tuple[list[tuple], list[str]]:
    """(the probes that differ clearly from the candidate, each with its cause, why and fix; a line for each other)."""
    fired, quiet = [], []
    for p in (r for r in results if r.role == "probe" and r.ok and r.probe in PROBE_CAUSES):
        both, cause, why, fix = PROBE_CAUSES[p.probe]
        if differs(p.metrics, cand) or (both and differs(cand, p.metrics)):
            fired.append((p, cause, why, fix))
        else:
            quiet.append(_quiet(p, cand))
    return fired, quiet
