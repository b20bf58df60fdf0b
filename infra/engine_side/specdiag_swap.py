"""A vLLM worker extension that swaps the drafter of a running engine: new weights, a new d2t, new aux layer ids.

Served with `--worker-extension-cls specdiag_swap.SpecdiagSwap` and reached through `POST /collective_rpc`
(`VLLM_SERVER_DEV_MODE=1`), between `POST /pause?mode=wait` and `POST /resume`; the caller then resets the prefix
cache (its draft KV came from the old head). Installed into the engine's environment as the fault plugin is
(infra/embedded.py); on a remote host it travels with the server's PYTHONPATH (infra/swap.py).

What vLLM 0.32 does underneath (read from its installed source):
- the draft model is `model_runner.get_draft_model()` (`v1/worker/gpu_model_runner.py`, the CPU runner inherits it);
- `initialize_layerwise_reload` / `finalize_layerwise_reload` (`model_executor/model_loader/reload/layerwise.py`)
  put each layer back on the meta device, load the checkpoint, re-run the kernel processing (the CPU's oneDNN
  packing empties a plain `.weight`) and copy the result into the ORIGINAL tensor storage: captured graphs keep
  pointing at valid memory, so a weight swap is safe on a server that captured graphs;
- the aux layers are `aux_hidden_state_layers`, a Python attribute the target's forward reads
  (`model_executor/models/interfaces.py: _set_aux_hidden_state_layers`): a compiled or captured graph baked the
  old ones in, so new aux ids are only honest on an eager server (the caller decides; see infra/swap.py);
- `d2t` loads into the parameter `draft_id_to_target_id` (offsets), read at every draft step; `t2d` is skipped.

Method names start with `specdiag_`: vLLM refuses an extension whose attributes already exist on the worker.
Arguments come as strings only (`/collective_rpc`), results go back as JSON.
"""
import glob
import json
import os
import time


def _weights(path: str):
    """(name, tensor) of every tensor in a checkpoint folder: safetensors files, else torch .bin files."""
    import torch
    from safetensors.torch import safe_open

    files = sorted(glob.glob(os.path.join(path, "*.safetensors")))
    if files:
        for file in files:
            with safe_open(file, "pt") as f:
                for name in f.keys():
                    yield name, f.get_tensor(name)
        return
    files = sorted(glob.glob(os.path.join(path, "*.bin")))
    if not files:
        raise FileNotFoundError(f"no .safetensors or .bin weights in {path}")
    for file in files:
        yield from torch.load(file, map_location="cpu", weights_only=True).items()


def _aux_layers(target) -> list[int] | None:
    """The target layers the engine feeds the draft now (where set_aux_hidden_state_layers keeps them)."""
    parent = target.get_language_model() if hasattr(target, "get_language_model") else target
    fed = getattr(getattr(parent, "model", parent), "aux_hidden_state_layers", None)
    return list(fed) if fed is not None else None


def _d2t_sum(model) -> int | None:
    """A position-weighted checksum of the d2t in place: a permuted mapping has the plain sum of the old one."""
    import torch

    param = getattr(model, "draft_id_to_target_id", None)
    return None if param is None else int((param.detach() * (1 + torch.arange(len(param)))).sum().item())


class SpecdiagSwap:
    """Mixed into the engine's worker (`--worker-extension-cls`)."""

    def specdiag_swap_drafter(self, path: str, aux_ids: str = "") -> dict:
        """Load the drafter checkpoint at PATH into the running draft model, in place; where AUX_IDS (a JSON list)
        is given, feed the draft those target layers from now on. Returns what the engine now holds."""
        from vllm.model_executor.model_loader.reload.layerwise import (
            finalize_layerwise_reload,
            initialize_layerwise_reload,
        )

        runner, start = self.model_runner, time.perf_counter()
        model = runner.get_draft_model()
        if model is None:
            raise RuntimeError("this engine serves no draft model to swap (ngram, suffix or no speculation)")
        config = self.vllm_config.speculative_config.draft_model_config
        names = []

        def counted():
            for name, tensor in _weights(path):
                names.append(name)
                yield name, tensor
        initialize_layerwise_reload(model)
        model.load_weights(counted())
        finalize_layerwise_reload(model, config)
        layers = json.loads(aux_ids) if aux_ids else None
        target = runner.get_model()
        if layers:
            target.set_aux_hidden_state_layers(tuple(layers))
        return {"path": path, "tensors": len(names), "d2t_sum": _d2t_sum(model), "aux_layers": _aux_layers(target),
                "s": time.perf_counter() - start}

    def specdiag_drafter_state(self) -> dict:
        """What the engine holds now, without changing it: the d2t's checksum and the aux layers fed."""
        model = self.model_runner.get_draft_model()
        return {"d2t_sum": _d2t_sum(model) if model is not None else None,
                "aux_layers": _aux_layers(self.model_runner.get_model())}
