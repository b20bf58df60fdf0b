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


def with_mapping(candidate: Path, control: Path) -> Path:
    """The candidate head with the control's d2t/t2d: the control_mapping probe's checkpoint (cached by content)."""
    import hashlib
    import shutil

    from safetensors.torch import load_file

    from infra.config import SpecdiagError
    from infra.embedded import cache_dir

    tensors, mapping = load_file(str(candidate / "model.safetensors")), load_file(str(control / "model.safetensors"))
    if tensors["lm_head.weight"].shape[0] != (mapping["d2t"].shape[0] if "d2t" in mapping else -1):
        raise SpecdiagError(f"probe control_mapping: the control {control} has no d2t of the candidate's draft "
                            f"vocabulary size ({tensors['lm_head.weight'].shape[0]})")
    stamp = "|".join(f"{p.resolve()}:{(p / 'model.safetensors').stat().st_mtime_ns}" for p in (candidate, control))
    digest = hashlib.sha256(stamp.encode()).hexdigest()[:12]
    out = cache_dir() / "derived" / f"{candidate.name}-with-{control.name}-mapping-{digest}"
    if not (out / "model.safetensors").exists():
        tmp = out.with_name(out.name + ".partial")
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.copytree(candidate, tmp)
        tensors.update({k: mapping[k] for k in ("d2t", "t2d") if k in mapping})
        save_file({k: v.contiguous() for k, v in tensors.items()}, str(tmp / "model.safetensors"),
                  metadata={"format": "pt"})
        tmp.rename(out)
    return out
