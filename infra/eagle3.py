"""Write an EAGLE-3 head checkpoint in the format vLLM 0.32 loads (config.json + model.safetensors).

Weights here are untrained placeholders with the right shapes; the vocabulary mapping (d2t/t2d) is real
and valid unless a fault is asked for. Used by the static checks' tests and benchmark.
"""
import json
from pathlib import Path

import torch
from safetensors.torch import save_file


def make_eagle3(out: Path, target: dict, draft_vocab: int = 512, aux=None, fault: str | None = None) -> Path:
    """fault: None, 'scrambled_d2t' (mapping shuffled) or 'no_d2t' (mapping dropped)."""
    h, vocab, layers = target["hidden_size"], target["vocab_size"], target["num_hidden_layers"]
    g = torch.Generator().manual_seed(0)
    ids = torch.sort(torch.randperm(vocab, generator=g)[:draft_vocab]).values
    d2t = ids - torch.arange(draft_vocab)
    t2d = torch.zeros(vocab, dtype=torch.bool)
    t2d[ids] = True
    if fault == "scrambled_d2t":
        d2t = d2t[torch.randperm(draft_vocab, generator=g)]
    tensors = {"fc.weight": torch.zeros(h, 3 * h), "norm.weight": torch.ones(h),
               "lm_head.weight": torch.zeros(draft_vocab, h), "midlayer.input_layernorm.weight": torch.ones(h),
               "t2d": t2d}
    if fault != "no_d2t":
        tensors["d2t"] = d2t.to(torch.int64)
    out.mkdir(parents=True, exist_ok=True)
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(out / "model.safetensors"))
    config = {"architectures": ["LlamaForCausalLMEagle3"], "hidden_size": h, "target_hidden_size": h,
              "vocab_size": vocab, "draft_vocab_size": draft_vocab, "num_hidden_layers": 1,
              "eagle_aux_hidden_state_layer_ids": aux or [2, layers // 2, layers - 3]}
    (out / "config.json").write_text(json.dumps(config))
    return out
