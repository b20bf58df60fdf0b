"""Static drafter checks: seconds, no server. Catch what would otherwise cost a 25-minute load.

Every check reads the normalised description of infra/checkpoints.py (any supported format, local or over SFTP) and
reports only what the engine would really reject or serve wrongly as an error; a check that cannot decide says so as
info. Errors in GATING are facts that make a server load pointless: the arm fails before its server starts.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from prefect import task

from infra.checkpoints import EAGLE3_ARCHS, CannotCheck, DrafterSpec, TargetSpec, mapping, read_block, read_drafter, \
    read_rows, read_target, read_tensor
from infra.config import SpecdiagError

if TYPE_CHECKING:
    import torch

Severity = Literal["error", "warning", "info"]
# Findings that make a load pointless: the engine refuses the checkpoint, or serves drafts it cannot map.
GATING = {"architecture", "vocab_size", "hidden_size", "fc_shape", "lm_head", "aux_layers", "d2t_missing", "d2t_shape", "d2t_range",
          "d2t_duplicates", "tokenizer", "unreadable"}
SAMPLE = 512  # vocabulary rows compared for the mapping's agreement
STRUCTURE = 1.5  # off-diagonal cosine spread x sqrt(dim): 1.0 for random rows; SmolLM2's output rows 4.2


@dataclass(frozen=True)
class Finding:
    severity: Severity
    code: str
    message: str
    value: float | None = None  # the number a rule compares with, where there is one (position_limit: the limit)

    def line(self) -> str:
        return f"{self.severity.upper():7} {self.code}: {self.message}"

    @property
    def gating(self) -> bool:
        return self.severity == "error" and self.code in GATING


def check_eagle3(fs, d: DrafterSpec, t: TargetSpec) -> list[Finding]:
    out: list[Finding] = []
    if d.architecture not in EAGLE3_ARCHS and d.format != "speculators":
        out.append(Finding("error", "architecture", f"architecture {d.architecture} is not an EAGLE-3 model vLLM "
                                                    f"registers"))
    if d.vocab_size is not None and d.vocab_size != t.vocab_size:
        out.append(Finding("error", "vocab_size", f"drafter vocab_size {d.vocab_size} != target's {t.vocab_size}"))
    if d.target_hidden_size != t.hidden_size:
        out.append(Finding("error", "hidden_size", f"drafter expects target hidden size {d.target_hidden_size}, "
                                                   f"target has {t.hidden_size}"))
    ids = d.engine_aux_ids(t.num_layers)
    if any(not 0 <= i < t.num_layers for i in ids):
        out.append(Finding("error", "aux_layers", f"aux layer ids {ids} outside the target's layers [0, {t.num_layers})"))
    elif d.aux_ids is None:
        out.append(Finding("warning", "aux_default", f"the config names no eagle_aux_hidden_state_layer_ids: the engine "
                           f"silently feeds its default layers {ids}; check the head was trained on those (vLLM #50170)"))
    else:
        out.append(Finding("info", "aux_layers", f"drafter is fed target layers {ids} (of {t.num_layers}; "
                                                 f"ids from the {d.aux_source})"))
    fc = d.tensors.get("fc.weight")
    if fc is not None and fc.shape[1] != d.fc_inputs * t.hidden_size:
        out.append(Finding("error", "fc_shape", f"fc.weight takes {fc.shape[1]} inputs; the engine builds fc for "
                           f"{d.fc_inputs} x {t.hidden_size} (num_aux_hidden_states, else eagle_config's ids, else 3)"))
    lm_head = d.tensors.get("lm_head.weight")
    if lm_head is not None and (lm_head.shape[0] != d.draft_vocab_size or lm_head.shape[1] != d.hidden_size):
        out.append(Finding("error", "lm_head", f"lm_head is {list(lm_head.shape)}, the engine builds "
                                               f"[{d.draft_vocab_size}, {d.hidden_size}]"))
    return out + check_mapping(fs, d, t)


def check_mapping(fs, d: DrafterSpec, t: TargetSpec) -> list[Finding]:
    """d2t validity (what vLLM does with it: target id = i + d2t[i], scattered by index, any order), then whether the
    mapped ids are the right ones: the head's output rows against the target's at those ids."""
    import torch
    draft_vocab, vocab = d.draft_vocab_size or t.vocab_size, t.vocab_size
    ids = mapping(fs, d)
    if draft_vocab == vocab:
        return [] if ids is None else [Finding("info", "d2t", "d2t present although the draft vocab is the full vocab")]
    if ids is None:
        return [Finding("error", "d2t_missing", f"draft vocab {draft_vocab} < target vocab {vocab} but no d2t: draft "
                                                f"ids would be read as the first {draft_vocab} target ids")]
    if tuple(ids.shape) != (draft_vocab,):
        return [Finding("error", "d2t_shape", f"d2t has {list(ids.shape)} entries, draft vocab is {draft_vocab}")]
    if ids.min() < 0 or ids.max() >= vocab:
        return [Finding("error", "d2t_range", f"i + d2t[i] spans [{ids.min()}, {ids.max()}], outside the target "
                                              f"vocab [0, {vocab})")]
    dupes = len(ids) - len(torch.unique(ids))
    if dupes:
        return [Finding("error", "d2t_duplicates", f"{dupes} draft ids map onto target ids already taken: their "
                                                   f"logits overwrite each other when scattered")]
    stored = d.tensors["d2t"].dtype
    note = "" if stored in ("I64", "int64") else f" (stored as {stored}; vLLM copies it into int64)"
    out = [Finding("info", "d2t", f"d2t valid: {draft_vocab} draft tokens mapped into {vocab}{note}")]
    t2d_ref = d.tensors.get("t2d")
    if t2d_ref is not None:
        t2d = read_tensor(fs, t2d_ref).bool()
        if tuple(t2d.shape) != (vocab,) or int(t2d.sum()) != draft_vocab or not bool(t2d[ids].all()):
            out.append(Finding("warning", "t2d_mismatch", "t2d disagrees with d2t: vLLM ignores t2d, but a mapping "
                               "regenerated apart from the head's training data does this (SpecForge PR #534)"))
    return out + [mapping_agreement(fs, d, t, ids)]


def row_agreement(a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, float, float]:
    """Rows of two tables meant to stand for the same tokens, in any two spaces -> per-row agreement (the correlation
    of each row's cosine similarities to the other rows, in one table and in the other) and each table's structure."""
    import torch
    def sims(x: torch.Tensor) -> tuple[torch.Tensor, float]:
        x = x.float()  # centred: the direction all rows share (output embeddings are anisotropic) says nothing of
        x = torch.nn.functional.normalize(x - x.mean(0), dim=1)  # which token is which
        s = x @ x.T
        off = s[~torch.eye(len(s), dtype=torch.bool)].view(len(s), -1)
        return off, float(off.std() * x.shape[1] ** 0.5) if off.numel() > 1 else 0.0
    (sa, struct_a), (sb, struct_b) = sims(a), sims(b)
    sa, sb = sa - sa.mean(1, keepdim=True), sb - sb.mean(1, keepdim=True)
    r = (sa * sb).sum(1) / ((sa.pow(2).sum(1) * sb.pow(2).sum(1)).sqrt() + 1e-12)
    return r, struct_a, struct_b


def mapping_agreement(fs, d: DrafterSpec, t: TargetSpec, ids: torch.Tensor) -> Finding:
    """Evidence that holds for any d2t order: a trained head's lm_head row for draft token i behaves like the target's
    output row for token i + d2t[i] (the same tokens are near each other in both). Reads SAMPLE rows of each."""
    import torch
    lm_head, target_rows = d.tensors.get("lm_head.weight"), t.output_rows()
    if lm_head is None or target_rows is None:
        return Finding("info", "mapping_unjudged", "no lm_head or target output rows to compare: the offline "
                                                   "evaluation judges the mapping")
    n = min(SAMPLE, len(ids))
    sample = sorted(torch.randperm(len(ids), generator=torch.Generator().manual_seed(0))[:n].tolist())
    r, s_head, s_target = row_agreement(read_rows(fs, lm_head, sample), read_rows(fs, target_rows,
                                                                                  ids[sample].tolist()))
    if min(s_head, s_target) < STRUCTURE:
        return Finding("info", "mapping_unjudged", f"the {'head' if s_head < STRUCTURE else 'target'}'s output rows "
                       f"have no structure to compare (untrained or zero): the offline evaluation judges the mapping")
    chance = 3 / (n - 2) ** 0.5
    bad = r < chance
    median = float(r.median())
    if median < chance:
        return Finding("error", "d2t_scrambled", f"the head's output rows do not match the target's at the mapped ids "
                       f"(median agreement {median:.2f}, chance level {chance:.2f}, over {n} sampled draft tokens): "
                       f"the draft->target vocabulary mapping is scrambled")
    share = float(bad.float().mean())
    if share >= 0.10:
        span = ids[torch.tensor(sample)[bad]]
        return Finding("error", "d2t_partial", f"{share:.0%} of {n} sampled draft tokens map to target ids whose "
                       f"output rows disagree with the head's (target ids {int(span.min())}-{int(span.max())}); the "
                       f"rest agree (median {median:.2f}): part of the vocabulary is re-indexed, e.g. a tokenizer "
                       f"revision; drafts of those tokens are rejected")
    return Finding("info", "mapping_agreement", f"the head's output rows agree with the target's at the mapped ids "
                   f"(median {median:.2f}, {share:.0%} below chance level, {n} sampled)")


def _tokenizer_json(fs, path: str) -> bytes | None:
    try:
        return fs.read_bytes(f"{path}/tokenizer.json")
    except (FileNotFoundError, OSError):
        return None


def _vocab_digest(raw: bytes) -> str | None:
    try:
        vocab = json.loads(raw).get("model", {}).get("vocab")
    except ValueError:
        return None
    return hashlib.sha256(json.dumps(vocab, sort_keys=True).encode()).hexdigest() if vocab else None


def tokenizers_differ(fs, draft: str, target: str) -> bool:
    """The two tokenizer.json vocabularies differ (the same file bytes: no parse, the usual case)."""
    a, b = _tokenizer_json(fs, draft), _tokenizer_json(fs, target)
    if not a or not b or a == b:
        return False
    d_tok, t_tok = _vocab_digest(a), _vocab_digest(b)
    return bool(d_tok and t_tok and d_tok != t_tok)


def embedding_neighbour_overlap(draft, target, sample: int = 256, k: int = 10) -> float:
    """Mean overlap of each sampled token's k nearest neighbours in both embedding tables, the same rows of each
    (1.0 = same geometry; rows of other tokens, as after a permutation, share almost none)."""
    import numpy as np
    draft, target = np.asarray(draft, dtype=np.float32), np.asarray(target, dtype=np.float32)
    n = min(len(draft), len(target))
    ids = np.random.default_rng(0).permutation(n)[:sample]

    def neighbours(table):
        t = table[:n] / np.maximum(np.linalg.norm(table[:n], axis=1, keepdims=True), 1e-12)
        sims = t[ids] @ t.T
        sims[np.arange(len(ids)), ids] = -2.0  # not itself
        return np.argpartition(-sims, k, axis=1)[:, :k]

    a, b = neighbours(draft), neighbours(target)
    return float(sum(len(set(x.tolist()) & set(y.tolist())) for x, y in zip(a, b)) / (len(ids) * k))


EMBED_ROWS = 8192  # the block of token ids whose neighbourhoods are compared: one read each, a second of numpy


def embedding_block(fs, d_ref, t_ref) -> tuple:
    """The same EMBED_ROWS rows of both embedding tables, from the middle of the vocabulary (past the special and
    byte tokens at its start)."""
    n = min(d_ref.shape[0], t_ref.shape[0])
    start, count = max(0, n // 2 - EMBED_ROWS // 2), min(n, EMBED_ROWS)
    return read_block(fs, d_ref, start, count), read_block(fs, t_ref, start, count)


def check_draft_model(fs, d: DrafterSpec, t: TargetSpec) -> list[Finding]:
    out = []
    if d.vocab_size != t.vocab_size:
        out.append(Finding("error", "vocab_size", f"draft model vocab {d.vocab_size} != target's {t.vocab_size}"))
    if tokenizers_differ(fs, d.path, t.path):
        out.append(Finding("error", "tokenizer", "draft model's tokenizer vocabulary differs from the target's"))
    emb, t_emb = d.tensors.get("embed_tokens.weight"), t.tensors.get("embed_tokens.weight")
    if emb is not None and t_emb is not None:
        overlap = embedding_neighbour_overlap(*embedding_block(fs, emb, t_emb))
        if overlap < 0.2:
            out.append(Finding("error", "embedding_mismatch", f"token neighbourhoods agree {overlap:.0%} with the "
                               f"target's: the draft model's embedding rows do not match the target's token ids "
                               f"(vocab mapping fault)"))
        else:
            out.append(Finding("info", "embedding", f"token neighbourhoods agree {overlap:.0%} with the target's"))
    return out


def compare_eagle3(fs, cand: DrafterSpec, ctrl: DrafterSpec, t: TargetSpec) -> list[Finding]:
    """Candidate vs control on everything the engine reads: aux ids, fc width, every norm flag, the mapping."""
    out = []
    a, b = cand.engine_aux_ids(t.num_layers), ctrl.engine_aux_ids(t.num_layers)
    if a != b:
        out.append(Finding("warning", "aux_layers_differ", f"candidate reads target layers {a}, control {b}"))
    if cand.fc_inputs != ctrl.fc_inputs:
        out.append(Finding("warning", "fc_differs", f"the engine builds fc for {cand.fc_inputs} aux states for the "
                                                    f"candidate, {ctrl.fc_inputs} for the control"))
    for flag in sorted(cand.norms):
        if cand.norms[flag] != ctrl.norms[flag]:
            out.append(Finding("warning", f"{flag}_differs", f"{flag} is {cand.norms[flag]} for the candidate, "
                                                             f"{ctrl.norms[flag]} for the control"))
    m1, m2 = mapping(fs, cand), mapping(fs, ctrl)
    if m1 is not None and m2 is not None:
        s1, s2 = set(m1.tolist()), set(m2.tolist())
        overlap = len(s1 & s2) / max(1, min(len(s1), len(s2)))
        level: Severity = "warning" if overlap < 0.5 else "info"
        out.append(Finding(level, "mapping_overlap", f"candidate and control draft vocabularies overlap {overlap:.0%}"))
    return out


def check_positions(d: DrafterSpec, t: TargetSpec, served: int | None) -> list[Finding]:
    """The drafter's declared position range against the longest sequence served (--max-model-len, else the
    target's own). vLLM extends an EAGLE head's rotary cache to the target's length (#48894), not its training:
    a head trained on 2048 positions collapses on longer sequences (SpecForge #271, speculators #613)."""
    served = served or t.max_positions
    if not d.max_positions or not served or d.max_positions >= served:
        return []
    rope = f", rope_scaling {d.rope_scaling}" if d.rope_scaling else ""
    return [Finding("warning", "position_limit", f"the drafter declares max_position_embeddings {d.max_positions}"
                    f"{rope}, the server serves up to {served} positions: drafts beyond {d.max_positions} come from "
                    f"a range it was not trained on; acceptance by position in the sequence decides it",
                    float(d.max_positions))]


def position_limit(findings: list[Finding]) -> int:
    """The positions a drafter declares where the server serves more (check_positions' finding), else 0."""
    return next((int(f.value) for f in findings if f.code == "position_limit" and f.value), 0)


def check(fs, path: str, method: str | None, target: TargetSpec, control: str | None = None,
          served: int | None = None) -> list[Finding]:
    """Every static finding for one drafter (and against the control's checkpoint, when one is given). served: the
    longest sequence the server accepts."""
    d = read_drafter(fs, path, method)
    if d.method == "draft_model":
        return check_draft_model(fs, d, target) + check_positions(d, target, served)
    if d.method != "eagle3":
        return [Finding("info", "unchecked", f"no static checks for method {d.method!r}")]
    out = [Finding("info", "format", f"{d.format} checkpoint, served as {d.architecture}")] + \
        check_eagle3(fs, d, target) + check_positions(d, target, served)
    if control:
        ctrl = read_drafter(fs, control)
        if ctrl.method == "eagle3":
            out += compare_eagle3(fs, d, ctrl, target)
    return out


@task(name="inspect-drafters")
def inspect_drafter(path: str, method: str | None, target_path: str, control: str | None = None,
                    control_method: str | None = None, fs=None) -> list[Finding]:
    from infra.executor import LocalExecutor

    fs = fs or LocalExecutor()
    return check(fs, path, method, read_target(fs, target_path), control)


def findings_markdown(findings: dict[str, list[Finding]]) -> str:
    lines = ["# Static drafter checks", ""]
    for arm, items in findings.items():
        lines += [f"## {arm}", *[f"- {f.line()}" for f in items], ""]
    return "\n".join(lines)


@task(name="inspect-arms")
def inspect_arms(target_model: str, arms: list, host=None, served: int | None = None) -> dict[str, list[Finding]]:
    """Static checks of every drafter arm, before any server starts, where the checkpoints are: this machine, or the
    GPU host over SFTP (only headers, the mapping and sampled rows cross the wire)."""
    from infra.config import HostConfig
    from infra.executor import executor_for

    fs = executor_for(host or HostConfig())
    control = next((a for a in arms if a.role == "control" and a.spec and a.spec.model), None)
    out: dict[str, list[Finding]] = {}
    try:
        target = read_target(fs, target_model)
    except (SpecdiagError, OSError, ValueError) as exc:
        target = None
        why = f"target config unreadable on {fs.host}: {exc}"
    try:
        for arm in (a for a in arms if a.spec and a.spec.model):
            ctrl = control.spec.model if control is not None and arm is not control else None
            try:
                out[arm.name] = check(fs, arm.spec.model, arm.spec.method, target, ctrl, served) if target else \
                    [Finding("info", "unchecked", why)]
            except CannotCheck as exc:
                out[arm.name] = [Finding("info", "unchecked", str(exc))]
            except (SpecdiagError, OSError, ValueError, KeyError) as exc:
                out[arm.name] = [Finding("error", "unreadable", f"checkpoint unreadable on {fs.host}: {exc}")]
            for f in out[arm.name]:
                print(f"[{arm.name}] static check {f.line()}")
    finally:
        fs.close()
    return out
