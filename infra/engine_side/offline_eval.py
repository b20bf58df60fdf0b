"""Offline drafter evaluation: a drafter's acceptance computed without the serving engine. Run by the engine's Python.

Usage: python offline_eval.py JOB.json OUT.json
JOB: {"target": DIR, "prompts": [...], "chat": bool, "max_tokens": N, "trust_remote_code": bool,
      "target_embed": TENSOR-REF (the target's input embedding, for heads without their own),
      "drafters": [{"arm": NAME, "method": "eagle3"|"draft_model", "path": DIR, "k": K,
                    "config": {...}, "tensors": {ENGINE-NAME: TENSOR-REF}}],
      "hidden_states": DIR (optional: dumps instead of running the target), "loss_masks": DIR (optional)}
A TENSOR-REF is infra/checkpoints.TensorRef as a dict: a safetensors file with the data's byte offset, dtype and
shape, or a .bin file and key. "config" is the flat config the engine builds the head from, with the aux ids the
engine will feed it: the orchestrator's normalised description (infra/checkpoints.read_drafter), so every format
it reads is evaluated here the same way.

The target's greedy continuation of each prompt (what a temperature-0 server returns) is the reference. A draft
slot is every position whose next token is generated; at slot t the drafter proposes k tokens, and position i
counts as accepted when drafts 0..i all equal the target's tokens: the prefix rule behind vLLM's
`spec_decode_num_accepted_tokens_per_pos` counters, so the two are comparable. EAGLE-3 heads are fed the target's
aux hidden states from transformers (eagle3_ref.py follows vLLM's conventions); draft models run on the text.

For targets too large for this, "hidden_states" names a folder of dumps from the user's training pipeline
(SpecForge, speculators, or seq_*.pt: see dumps.py). No target weights are loaded then: only the input embedding,
and only for heads that do not carry their own.
"""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
import dumps  # noqa: E402
import eagle3_ref  # noqa: E402
from target_states import aux_states, encode, greedy, load_target  # noqa: E402


DTYPES = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16, "I64": torch.int64, "I32": torch.int32,
          "I16": torch.int16, "BOOL": torch.bool, "U8": torch.uint8, "I8": torch.int8, "F64": torch.float64}


def prefix_rates(correct: torch.Tensor) -> list[float]:
    """correct [slots, k] bool -> per-position prefix acceptance rates."""
    return torch.cumprod(correct.int(), 1).float().mean(0).tolist() if len(correct) else []


def eagle3_correct(d, ids: torch.Tensor, aux: torch.Tensor, slots: torch.Tensor, k: int) -> torch.Tensor:
    with torch.inference_mode():
        steps = d.chain_logits(aux.float(), ids, k)
    cols = [d.to_target(steps[j][slots].argmax(-1)) == ids[slots + j + 2] for j in range(k)]
    return torch.stack(cols, 1)


def draft_model_correct(model, ids: torch.Tensor, slots: torch.Tensor, k: int) -> torch.Tensor:
    with torch.inference_mode():
        pred = model(input_ids=ids[None]).logits[0].argmax(-1)  # pred[p] is the draft's guess for ids[p+1]
    return torch.stack([pred[slots + j + 1] == ids[slots + j + 2] for j in range(k)], 1)


def sequences(job: dict, layers: set[int]):
    """(ids, mask, aux or None) per sequence: mask[p] marks the generated (scored) tokens."""
    if job.get("hidden_states"):
        name, seqs = dumps.read(job["hidden_states"], job.get("loss_masks"))
        print(f"reading {name} hidden-state dumps from {job['hidden_states']}", file=sys.stderr)
        yield from seqs
        return
    model, tok = load_target(job["target"], trust_remote_code=job.get("trust_remote_code", False))
    prompts = [encode(tok, p, job.get("chat", True)) for p in job["prompts"]]
    for prompt, gen in greedy(model, tok, prompts, job["max_tokens"], batch=8):
        ids = torch.tensor(prompt + gen)
        aux = aux_states(model, ids.tolist(), sorted(layers)) if layers else None
        yield ids, torch.arange(len(ids)) >= len(prompt), aux


def read_ref(ref: dict) -> torch.Tensor:
    """One tensor from its reference: only its own bytes of a safetensors file; a .bin is loaded (mmap) for it."""
    if ref.get("offset") is None:
        return torch.load(ref["file"], map_location="cpu", mmap=True, weights_only=True)[ref["key"]].clone()
    dtype = DTYPES[ref["dtype"]]
    count = int(torch.tensor(ref["shape"]).prod()) if ref["shape"] else 1
    with open(ref["file"], "rb") as f:
        f.seek(ref["offset"])
        data = bytearray(f.read(count * torch.empty(0, dtype=dtype).element_size()))
    return torch.frombuffer(data, dtype=dtype).reshape(ref["shape"])


def head(spec: dict, embed_ref: dict | None):
    """The EAGLE-3 head from the job's description (any format the orchestrator reads)."""
    if "kv_lora_rank" in spec["config"]:
        raise SystemExit(f"{spec['arm']}: an MLA head ({spec['config'].get('model_type')}); the offline reference "
                         f"models Llama-layer EAGLE-3 heads only: judge it by the served control instead")
    tensors = {k: read_ref(r) for k, r in spec["tensors"].items()}
    embed = read_ref(embed_ref).float() if embed_ref and "embed_tokens.weight" not in tensors else None
    return eagle3_ref.build(spec["config"], tensors, embed, spec["path"])


def columns(layers: list[int], ids, h: int) -> torch.Tensor:
    """The columns of the aux states computed for `layers` (h wide each) that hold the given layer ids, sorted."""
    return torch.cat([torch.arange(layers.index(i) * h, (layers.index(i) + 1) * h) for i in sorted(set(ids))])


def slots_of(mask: torch.Tensor, k: int) -> torch.Tensor:
    """Slots t whose next token is generated and whose k drafts still fall inside the sequence."""
    t = torch.arange(len(mask) - 1)
    return t[mask[1:] & (t <= len(mask) - k - 2)]


def summary(rows: list[torch.Tensor], k: int) -> dict:
    correct = torch.cat(rows) if rows else torch.zeros(0, k, dtype=torch.bool)
    per_pos = prefix_rates(correct)
    return {"per_position": per_pos, "slots": len(correct), "acceptance_rate": sum(per_pos) / k if per_pos else 0.0,
            "mean_acceptance_length": 1 + sum(per_pos)}


def eagle3_result(spec: dict, job: dict, seqs: list, layers: list[int]) -> dict:
    """The head fed the layers its config names (what the engine feeds it), then each variant of spec["variants"]
    (other aux id sets it may have been trained on) whose layers were computed."""
    d, k = head(spec, job.get("target_embed")), spec["k"]
    h = d.cfg.get("target_hidden_size") or d.cfg["hidden_size"]
    if seqs and seqs[0][2].shape[-1] != len(layers) * h:
        raise SystemExit(f"{spec['arm']}: the hidden states are {seqs[0][2].shape[-1]} wide; the heads read "
                         f"{len(layers)} aux layers {layers} of {h}: dumps of other layers or another target?")

    slots = [slots_of(m, k) for _, m, _ in seqs]

    def fed(ids: list[int]) -> dict:
        idx = columns(layers, ids, h)
        return summary([eagle3_correct(d, t, aux[:, idx].float(), s, k) for (t, _, aux), s in zip(seqs, slots)
                        if len(s)], k)

    out, own_d2t = fed(d.aux_layers), d.d2t.clone()
    out["variants"] = {}
    for name, change in (spec.get("variants") or {}).items():  # one thing changed: the layers, or the mapping
        if "aux" in change and set(change["aux"]) <= set(layers):
            out["variants"][name] = {**fed(change["aux"]), **change}
        elif "d2t" in change:
            d.d2t.copy_(read_ref(change["d2t"]).long())
            out["variants"][name] = {**fed(d.aux_layers), "d2t": change["d2t"]["file"]}
            d.d2t.copy_(own_d2t)
    return out


def draft_model_result(spec: dict, seqs: list) -> dict:
    from transformers import AutoModelForCausalLM

    model, k = AutoModelForCausalLM.from_pretrained(spec["path"], dtype=torch.float32).eval(), spec["k"]
    slots = [slots_of(m, k) for _, m, _ in seqs]
    return summary([draft_model_correct(model, t, s, k) for (t, _, _), s in zip(seqs, slots) if len(s)], k)


def main() -> None:
    job = json.loads(Path(sys.argv[1]).read_text())
    start = time.monotonic()
    drafters = job["drafters"]
    own = sorted({i for d in drafters if d["method"] == "eagle3"
                  for i in d["config"]["eagle_aux_hidden_state_layer_ids"]})
    layers = set(own)
    if not job.get("hidden_states"):  # dumps hold the layers they were made for; a target run computes any
        layers |= {i for d in drafters for v in (d.get("variants") or {}).values() for i in v.get("aux", ())}
    seqs = list(sequences(job, layers))
    layers = sorted(layers)
    for dump in job.get("write_dumps") or []:  # the heads' own layers, as a training pipeline dumps them
        cols = columns(layers, own, seqs[0][2].shape[-1] // len(layers))
        dumps.write(dump["folder"], dump["format"],
                    [(ids, int((~mask).sum()), aux[:, cols]) for ids, mask, aux in seqs], len(own))
    results = {spec["arm"]: eagle3_result(spec, job, seqs, layers) if spec["method"] == "eagle3"
               else draft_model_result(spec, seqs) for spec in drafters}
    out = {"arms": results, "sequences": len(seqs), "target_tokens": int(sum(len(s[0]) for s in seqs)),
           "source": "hidden_states" if job.get("hidden_states") else "transformers",
           "modules": sorted(m for m in ("transformers", "vllm") if m in sys.modules),
           "seconds": time.monotonic() - start}
    Path(sys.argv[2]).write_text(json.dumps(out, indent=2))
    print(json.dumps(out))


if __name__ == "__main__":
    main()
