"""Derived EAGLE-3 checkpoints: the candidate head with the control's vocabulary mapping (control_mapping probe)."""
from pathlib import Path


def with_mapping(candidate: Path, control: Path) -> Path:
    """The candidate head with the control's d2t/t2d: the control_mapping probe's checkpoint (cached by content)."""
    import hashlib
    import shutil

    from safetensors.torch import load_file, save_file

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


def with_aux_ids(head: Path, ids: tuple[int, ...]) -> Path:
    """The head fed other target layers: its folder again, the weights linked (no copy), the config naming IDS at the
    top level (which vLLM reads first). The aux_layers probe's checkpoint; swapped into the head's eager server, only
    the running target's aux layers change."""
    import json

    from infra.embedded import cache_dir

    config = json.loads((head / "config.json").read_text())
    config["eagle_aux_hidden_state_layer_ids"] = list(ids)
    stamp = f"{head.resolve()}:{(head / 'config.json').stat().st_mtime_ns}"
    out = cache_dir() / "derived" / f"{head.name}-aux-{'-'.join(map(str, ids))}-{_digest(stamp)}"
    if not (out / "config.json").exists():
        out.mkdir(parents=True, exist_ok=True)
        for f in head.iterdir():
            if f.name != "config.json" and not (out / f.name).exists():
                (out / f.name).symlink_to(f.resolve())
        (out / "config.json.partial").write_text(json.dumps(config, indent=2))
        (out / "config.json.partial").rename(out / "config.json")
    return out


def _digest(text: str) -> str:
    import hashlib
    return hashlib.sha256(text.encode()).hexdigest()[:12]
