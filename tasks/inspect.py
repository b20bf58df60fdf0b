"""Static drafter checks: seconds, no server. Catch what would otherwise cost a 25-minute load.

EAGLE-3: config vs target, fc/lm_head shapes, aux layer ids, d2t/t2d validity. Draft models: tokenizer
and embedding agreement with the target. Candidate vs control: mapping overlap, aux ids, norm flags.
"""
from __future__ import annotations

import hashlib
import json
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import torch
from prefect import task
from safetensors import safe_open

Severity = Literal["error", "warning", "info"]
_ST_DTYPES = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16, "I64": torch.int64,
              "I32": torch.int32, "BOOL": torch.bool, "U8": torch.uint8, "I8": torch.int8}
KNOWN_EAGLE3_ARCHS = {"LlamaForCausalLMEagle3", "Eagle3LlamaForCausalLM", "Eagle3DeepseekV2ForCausalLM"}


@dataclass(frozen=True)
class Finding:
    severity: Severity
    code: str
    message: str

    def line(self) -> str:
        return f"{self.severity.upper():7} {self.code}: {self.message}"


@dataclass
class Drafter:
    path: Path
    config: dict
    tensors: dict[str, torch.Tensor] = field(default_factory=dict)

    @classmethod
    def load(cls, path: str | Path, names: tuple[str, ...] | None = None) -> "Drafter":
        path = Path(path)
        config = json.loads((path / "config.json").read_text())
        tensors = {}
        for file in sorted(path.glob("*.safetensors")):
            with safe_open(str(file), "pt") as f:
                for key in f.keys():
                    if names is None or any(key.endswith(n) for n in names):
                        tensors[key] = f.get_tensor(key)
        return cls(path, config, tensors)

    @classmethod
    def load_remote(cls, executor, path: str, names: tuple[str, ...], shapes_only: tuple[str, ...] = ()) -> "Drafter":
        """The same, over SFTP: config.json, then only the named tensors' bytes out of each safetensors file (its
        JSON header says where they are); `shapes_only` tensors come back as meta tensors (shape, no data)."""
        config = json.loads(executor.read_bytes(f"{path}/config.json"))
        tensors = {}
        for file in executor.glob(f"{path}/*.safetensors"):
            with executor.open(file) as f:
                size = struct.unpack("<Q", f.read(8))[0]
                header = json.loads(f.read(size))
                for key, meta in header.items():
                    if key == "__metadata__" or not any(key.endswith(n) for n in names + shapes_only):
                        continue
                    dtype = _ST_DTYPES[meta["dtype"]]
                    if any(key.endswith(n) for n in shapes_only):
                        tensors[key] = torch.empty(meta["shape"], dtype=dtype, device="meta")
                        continue
                    start, end = meta["data_offsets"]
                    f.seek(8 + size + start)
                    tensors[key] = torch.frombuffer(bytearray(f.read(end - start)), dtype=dtype).reshape(meta["shape"])
        return cls(Path(path), config, tensors)

    def tensor(self, suffix: str) -> torch.Tensor | None:
        return next((t for k, t in self.tensors.items() if k == suffix or k.endswith("." + suffix)), None)


def _cfg(config: dict, key: str, default=None):
    for source in (config, config.get("eagle_config") or {}, config.get("transformer_layer_config") or {}):
        if key in source:
            return source[key]
    return default


def aux_layer_ids(config: dict, target_layers: int) -> list[int]:
    ids = _cfg(config, "eagle_aux_hidden_state_layer_ids")
    return sorted(set(ids)) if ids else [2, target_layers // 2, target_layers - 3]


def check_eagle3(d: Drafter, target: dict) -> list[Finding]:
    out: list[Finding] = []
    archs = set(d.config.get("architectures") or [])
    if not archs & KNOWN_EAGLE3_ARCHS and "speculators_config" not in d.config:
        out.append(Finding("warning", "architecture", f"architectures {sorted(archs)} is not one vLLM loads as EAGLE-3"))
    vocab, t_vocab = _cfg(d.config, "vocab_size"), target["vocab_size"]
    if vocab != t_vocab:
        out.append(Finding("error", "vocab_size", f"drafter vocab_size {vocab} != target's {t_vocab}"))
    t_hidden, layers = target["hidden_size"], target["num_hidden_layers"]
    d_target_hidden = _cfg(d.config, "target_hidden_size", _cfg(d.config, "hidden_size"))
    if d_target_hidden != t_hidden:
        out.append(Finding("error", "hidden_size", f"drafter expects target hidden size {d_target_hidden}, target has {t_hidden}"))
    ids = aux_layer_ids(d.config, layers)
    if any(not 0 <= i < layers for i in ids):
        out.append(Finding("error", "aux_layers", f"aux layer ids {ids} outside the target's layers [0, {layers})"))
    else:
        out.append(Finding("info", "aux_layers", f"drafter is fed target layers {ids} (of {layers})"))
    fc = d.tensor("fc.weight")
    if fc is not None and fc.shape[1] != len(ids) * t_hidden:
        out.append(Finding("error", "fc_shape", f"fc.weight takes {fc.shape[1]} inputs, expected {len(ids)} x {t_hidden}"))
    draft_vocab = _cfg(d.config, "draft_vocab_size", vocab)
    lm_head = d.tensor("lm_head.weight")
    if lm_head is not None and lm_head.shape[0] != draft_vocab:
        out.append(Finding("error", "lm_head", f"lm_head has {lm_head.shape[0]} rows, draft_vocab_size is {draft_vocab}"))
    out += check_vocab_mapping(d.tensor("d2t"), d.tensor("t2d"), draft_vocab, t_vocab)
    return out


def check_vocab_mapping(d2t, t2d, draft_vocab: int, target_vocab: int) -> list[Finding]:
    if draft_vocab == target_vocab:
        return [] if d2t is None else [Finding("info", "d2t", "d2t present although the draft vocab is the full vocab")]
    if d2t is None:
        return [Finding("error", "d2t_missing", f"draft vocab {draft_vocab} < target vocab {target_vocab} but no d2t: "
                         f"draft ids would be read as the first {draft_vocab} target ids")]
    out = []
    if tuple(d2t.shape) != (draft_vocab,) or d2t.dtype != torch.int64:
        return [Finding("error", "d2t_shape", f"d2t is {d2t.dtype}{list(d2t.shape)}, expected int64[{draft_vocab}]")]
    ids = torch.arange(draft_vocab) + d2t
    if ids.min() < 0 or ids.max() >= target_vocab:
        out.append(Finding("error", "d2t_range", f"i + d2t[i] spans [{ids.min()}, {ids.max()}], outside the target vocab"))
    if not bool((ids[1:] > ids[:-1]).all()):
        bad = int((ids[1:] <= ids[:-1]).sum())
        out.append(Finding("error", "d2t_order", f"i + d2t[i] is not strictly increasing ({bad} inversions): "
                           f"the draft->target vocabulary mapping is scrambled"))
    if t2d is not None:
        if tuple(t2d.shape) != (target_vocab,) or t2d.dtype != torch.bool:
            out.append(Finding("error", "t2d_shape", f"t2d is {t2d.dtype}{list(t2d.shape)}, expected bool[{target_vocab}]"))
        else:
            if int(t2d.sum()) != draft_vocab:
                out.append(Finding("error", "t2d_sum", f"t2d marks {int(t2d.sum())} tokens, draft vocab is {draft_vocab}"))
            valid = ids[(ids >= 0) & (ids < target_vocab)]
            if not bool(t2d[valid].all()):
                out.append(Finding("error", "t2d_mismatch", "t2d is false at some i + d2t[i]: d2t and t2d disagree"))
    if not any(f.severity == "error" for f in out):
        out.append(Finding("info", "d2t", f"d2t/t2d consistent: {draft_vocab} draft tokens mapped into {target_vocab}"))
    return out


def _tokenizer_digest(path: Path) -> str | None:
    file = path / "tokenizer.json"
    if not file.exists():
        return None
    vocab = json.loads(file.read_text()).get("model", {}).get("vocab")
    return hashlib.sha256(json.dumps(vocab, sort_keys=True).encode()).hexdigest() if vocab else None


def embedding_neighbour_overlap(draft: torch.Tensor, target: torch.Tensor, sample: int = 256, k: int = 10) -> float:
    """Mean overlap of each sampled token's k nearest neighbours in both embedding tables (1.0 = same geometry).

    Works across hidden sizes: a draft model that maps token ids to the target's meaning keeps its
    neighbourhoods; one whose rows are shuffled does not.
    """
    n = min(draft.shape[0], target.shape[0])
    ids = torch.randperm(n, generator=torch.Generator().manual_seed(0))[:sample]

    def neighbours(table: torch.Tensor) -> torch.Tensor:
        t = torch.nn.functional.normalize(table[:n].float(), dim=1)
        sims = t[ids] @ t.T
        sims[torch.arange(len(ids)), ids] = -2.0  # not itself
        return sims.topk(k, dim=1).indices

    a, b = neighbours(draft), neighbours(target)
    return float(sum(len(set(x.tolist()) & set(y.tolist())) for x, y in zip(a, b)) / (len(ids) * k))


def check_draft_model(d: Drafter, target_path: Path, target: dict) -> list[Finding]:
    out = []
    if d.config.get("vocab_size") != target["vocab_size"]:
        out.append(Finding("error", "vocab_size", f"draft model vocab {d.config.get('vocab_size')} != target's {target['vocab_size']}"))
    d_tok, t_tok = _tokenizer_digest(d.path), _tokenizer_digest(target_path)
    if d_tok and t_tok and d_tok != t_tok:
        out.append(Finding("error", "tokenizer", "draft model's tokenizer vocabulary differs from the target's"))
    emb = d.tensor("embed_tokens.weight")
    t_emb = Drafter.load(target_path, ("embed_tokens.weight",)).tensor("embed_tokens.weight")
    if emb is not None and t_emb is not None:
        overlap = embedding_neighbour_overlap(emb, t_emb)
        if overlap < 0.2:
            out.append(Finding("error", "embedding_mismatch", f"token neighbourhoods agree {overlap:.0%} with the target's: "
                               f"the draft model's embedding rows do not match the target's token ids (vocab mapping fault)"))
        else:
            out.append(Finding("info", "embedding", f"token neighbourhoods agree {overlap:.0%} with the target's"))
    return out


def compare_eagle3(cand: Drafter, ctrl: Drafter, target_layers: int) -> list[Finding]:
    out = []
    a, b = aux_layer_ids(cand.config, target_layers), aux_layer_ids(ctrl.config, target_layers)
    if a != b:
        out.append(Finding("warning", "aux_layers_differ", f"candidate reads target layers {a}, control {b}"))
    for flag in ("norm_before_fc", "fc_norm"):
        if bool(_cfg(cand.config, flag, False)) != bool(_cfg(ctrl.config, flag, False)):
            out.append(Finding("warning", f"{flag}_differs", f"{flag} differs between candidate and control"))
    m1, m2 = cand.tensor("d2t"), ctrl.tensor("d2t")
    if m1 is not None and m2 is not None:
        s1 = set((torch.arange(len(m1)) + m1).tolist())
        s2 = set((torch.arange(len(m2)) + m2).tolist())
        overlap = len(s1 & s2) / max(1, min(len(s1), len(s2)))
        level: Severity = "warning" if overlap < 0.5 else "info"
        out.append(Finding(level, "mapping_overlap", f"candidate and control draft vocabularies overlap {overlap:.0%}"))
    return out


@task(name="inspect-drafters")
def inspect_drafter(path: str, method: str, target_path: str, control: str | None = None,
                    control_method: str | None = None) -> list[Finding]:
    target = json.loads((Path(target_path) / "config.json").read_text())
    if method == "eagle3":
        d = Drafter.load(path)  # a head: small, and every tensor is checked
        out = check_eagle3(d, target)
        if control and control_method == "eagle3":
            out += compare_eagle3(d, Drafter.load(control), target["num_hidden_layers"])
        return out
    if method == "draft_model":  # a whole LM: read only the embedding the check compares
        return check_draft_model(Drafter.load(path, ("embed_tokens.weight",)), Path(target_path), target)
    return [Finding("info", "unchecked", f"no static checks for method {method!r}")]


def findings_markdown(findings: dict[str, list[Finding]]) -> str:
    lines = ["# Static drafter checks", ""]
    for arm, items in findings.items():
        lines += [f"## {arm}", *[f"- {f.line()}" for f in items], ""]
    return "\n".join(lines)


def _remote_config(executor, target: str) -> str:
    """A target's config.json on the host: a folder, or a Hugging Face id in the host's HF cache."""
    if target.count("/") == 1 and not target.startswith(("/", "~", ".")):
        org, name = target.split("/")
        found = executor.glob(f"~/.cache/huggingface/hub/models--{org}--{name}/snapshots/*")
        if found:
            return f"{found[0]}/config.json"
    return f"{target}/config.json"


def inspect_remote(executor, path: str, method: str, target_path: str, control: str | None = None) -> list[Finding]:
    """EAGLE-3 checks of a head that lives on the GPU host, read over SFTP: config, d2t/t2d, and only the shapes
    of fc and lm_head (megabytes, not the gigabytes of a 1T model's head)."""
    if method != "eagle3":
        return [Finding("info", "unchecked", f"{method} checkpoint on {executor.host}: run flows/inspect_drafter.py there")]
    target = json.loads(executor.read_bytes(_remote_config(executor, target_path)))
    load = lambda p: Drafter.load_remote(executor, p, ("d2t", "t2d"), ("fc.weight", "lm_head.weight"))  # noqa: E731
    d = load(path)
    out = check_eagle3(d, target)
    if control:
        out += compare_eagle3(d, load(control), target["num_hidden_layers"])
    return out


@task(name="inspect-arms")
def inspect_arms(target_model: str, arms: list, host=None) -> dict[str, list[Finding]]:
    """Static checks of every drafter arm, before any server starts: on this machine, or over SFTP on the remote
    host when the checkpoints live there."""
    from infra.executor import executor_for

    executor = executor_for(host) if host is not None and host.kind != "local" else None
    try:
        return _inspect_all(target_model, arms, executor)
    finally:
        if executor is not None:
            executor.close()


def _inspect_all(target_model: str, arms: list, executor) -> dict[str, list[Finding]]:
    control = next((a for a in arms if a.role == "control" and a.spec and a.spec.model), None)
    out: dict[str, list[Finding]] = {}
    for arm in arms:
        if not (arm.spec and arm.spec.model):
            continue
        path, ctrl_path = Path(arm.spec.model), Path(control.spec.model) if control else None
        if not (path / "config.json").exists() or not (Path(target_model) / "config.json").exists():
            out[arm.name] = _remote_findings(executor, arm, control, target_model)
            for f in out[arm.name]:
                print(f"[{arm.name}] static check {f.line()}")
            continue
        use_ctrl = control is not None and arm is not control and (ctrl_path / "config.json").exists()
        out[arm.name] = inspect_drafter.fn(str(path), arm.spec.method, target_model,
                                           str(ctrl_path) if use_ctrl else None,
                                           control.spec.method if use_ctrl else None)
        for f in out[arm.name]:
            print(f"[{arm.name}] static check {f.line()}")
    return out


def _remote_findings(executor, arm, control, target_model: str) -> list[Finding]:
    if executor is None or executor.host == "local":
        return [Finding("info", "unchecked", "checkpoint or target not on this machine: no static checks")]
    try:
        ctrl = control.spec.model if control is not None and arm is not control and \
            control.spec.method == "eagle3" else None
        return inspect_remote(executor, arm.spec.model, arm.spec.method, target_model, ctrl)
    except (OSError, ValueError, KeyError) as exc:
        return [Finding("info", "unchecked", f"could not read the checkpoint on {executor.host}: {exc}")]
