"""Offline drafter evaluation: a drafter's acceptance computed without the serving engine. Run by the engine's Python.

Usage: python offline_eval.py JOB.json OUT.json
JOB: {"target": DIR, "prompts": [...], "chat": bool, "max_tokens": N,
      "drafters": [{"arm": NAME, "method": "eagle3"|"draft_model", "path": DIR, "k": K}],
      "hidden_states": DIR (optional: user-supplied dumps instead of running the target, see below)}

The target's greedy continuation of each prompt (what a temperature-0 server returns) is the reference. A draft
slot is every position whose next token is generated; at slot t the drafter proposes k tokens, and position i
counts as accepted when drafts 0..i all equal the target's tokens: the prefix rule behind vLLM's
`spec_decode_num_accepted_tokens_per_pos` counters, so the two are comparable. EAGLE-3 heads are fed the target's
aux hidden states from transformers (eagle3_ref.py follows vLLM's conventions); draft models run on the text.

For targets too large for this, pass "hidden_states": a folder of seq_<i>.pt files, each a dict with
"ids" (prompt + greedy answer, int64 [L]), "prompt_len" (int) and "aux" ([L, n_aux*H], the inputs of the
drafter's aux layers), dumped by the user's own serving stack.
"""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
import eagle3_ref  # noqa: E402
from target_states import aux_states, encode, greedy, load_target  # noqa: E402


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
    """(ids, prompt_len, aux or None) per prompt."""
    if job.get("hidden_states"):
        for f in sorted(Path(job["hidden_states"]).glob("seq_*.pt")):
            s = torch.load(f)
            yield torch.as_tensor(s["ids"]), int(s["prompt_len"]), s["aux"]
        return
    model, tok = load_target(job["target"])
    prompts = [encode(tok, p, job.get("chat", True)) for p in job["prompts"]]
    for prompt, gen in greedy(model, tok, prompts, job["max_tokens"], batch=8):
        ids = prompt + gen
        aux = aux_states(model, ids, sorted(layers)) if layers else None
        yield torch.tensor(ids), len(prompt), aux


def main() -> None:
    job = json.loads(Path(sys.argv[1]).read_text())
    start = time.monotonic()
    drafters, layers = [], set()
    for spec in job["drafters"]:
        if spec["method"] == "eagle3":
            cfg = json.loads((Path(spec["path"]) / "config.json").read_text())
            layers |= set(cfg["eagle_aux_hidden_state_layer_ids"])
        drafters.append(spec)
    seqs = list(sequences(job, layers))
    layers = sorted(layers)
    embed = None
    results = {}
    for spec in drafters:
        k, rows = spec["k"], []
        if spec["method"] == "eagle3":
            if embed is None:
                from safetensors import safe_open
                target_dir = Path(job["target"])
                for f in sorted(target_dir.glob("*.safetensors")):
                    with safe_open(str(f), "pt") as sf:
                        if "model.embed_tokens.weight" in sf.keys():
                            embed = sf.get_tensor("model.embed_tokens.weight").float()
            d = eagle3_ref.load(spec["path"], embed)
            own = [layers.index(i) for i in d.aux_layers]  # this head's aux states, out of the union computed
            h = d.cfg.get("target_hidden_size", d.cfg["hidden_size"])
            idx = torch.cat([torch.arange(i * h, (i + 1) * h) for i in own])
        else:
            from transformers import AutoModelForCausalLM
            model = AutoModelForCausalLM.from_pretrained(spec["path"], dtype=torch.float32).eval()
        for ids, plen, aux in seqs:
            slots = torch.arange(max(0, plen - 1), len(ids) - k - 1)  # token t+1 generated, t+k+1 inside
            if len(slots) == 0:
                continue
            rows.append(eagle3_correct(d, ids, aux[:, idx], slots, k) if spec["method"] == "eagle3"
                        else draft_model_correct(model, ids, slots, k))
        correct = torch.cat(rows) if rows else torch.zeros(0, k, dtype=torch.bool)
        per_pos = prefix_rates(correct)
        results[spec["arm"]] = {"per_position": per_pos, "slots": len(correct),
                                "acceptance_rate": sum(per_pos) / k if per_pos else 0.0,
                                "mean_acceptance_length": 1 + sum(per_pos)}
    out = {"arms": results, "sequences": len(seqs), "target_tokens": int(sum(len(s[0]) for s in seqs)),
           "seconds": time.monotonic() - start}
    Path(sys.argv[2]).write_text(json.dumps(out, indent=2))
    print(json.dumps(out))


if __name__ == "__main__":
    main()
