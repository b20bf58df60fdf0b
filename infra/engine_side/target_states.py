"""The target's side of drafter training and offline evaluation, from transformers (runs on CPU).

Greedy continuations (what the served target produces at temperature 0) and the aux hidden states an
EAGLE-3 drafter is fed: transformers' `output_hidden_states[k]` is the input of layer k, vLLM's aux id k.
"""
from __future__ import annotations

import torch


def load_target(path: str, dtype=torch.float32, trust_remote_code: bool = False):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.set_num_threads(max(1, torch.get_num_threads()))
    tok = AutoTokenizer.from_pretrained(path, trust_remote_code=trust_remote_code)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype, trust_remote_code=trust_remote_code).eval()
    return model, tok


def encode(tok, prompt: str, chat: bool) -> list[int]:
    if chat:
        out = tok.apply_chat_template([{"role": "user", "content": prompt}], add_generation_prompt=True,
                                      tokenize=True)
        return list(out["input_ids"] if hasattr(out, "keys") else out)
    return tok(prompt)["input_ids"]


@torch.inference_mode()
def greedy(model, tok, prompts: list[list[int]], max_new: int, batch: int = 32) -> list[tuple[list[int], list[int]]]:
    """(prompt ids, generated ids) per prompt; generation stops at EOS."""
    pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    out = []
    for i in range(0, len(prompts), batch):
        chunk = prompts[i:i + batch]
        width = max(len(p) for p in chunk)
        ids = torch.tensor([[pad] * (width - len(p)) + p for p in chunk], device=model.device)
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in chunk], device=model.device)
        gen = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=max_new, do_sample=False,
                             pad_token_id=pad)
        for p, row in zip(chunk, gen[:, width:].tolist()):
            if tok.eos_token_id in row:
                row = row[: row.index(tok.eos_token_id) + 1]
            out.append((p, row))
    return out


@torch.inference_mode()
def aux_states(model, ids: list[int], layers: list[int]) -> torch.Tensor:
    """[len(ids), len(layers) * H]: the inputs of the given layers at every position, concatenated."""
    hs = model(input_ids=torch.tensor([ids], device=model.device), output_hidden_states=True).hidden_states
    return torch.cat([hs[k][0] for k in sorted(set(layers))], -1).cpu()
