"""Checkpoint formats, read the way vLLM 0.32 reads them: one seam that turns any supported drafter checkpoint (and
any target config) into one normalised description. The checks, the launch gate, the offline evaluation and the
control_mapping probe work from that description; nothing else parses checkpoint files.

Formats (each entry of FORMATS: how it is recognised, and where it comes from):
- SpecForge (sgl-project/SpecForge `configs/*-eagle3*.json`): `LlamaForCausalLMEagle3`, aux ids top level or nested
  in `eagle_config`, `midlayer.*` weights, `fc_norm` / `norm_output` in the eagle3.1 recipes.
- speculators (vllm-project/speculators `src/speculators/models/eagle3/config.py`): `speculators_config`, the layer's
  own fields under `transformer_layer_config`, null values meaning "not set", `norm_before_residual`.
- the original EAGLE repo (SafeAILab/EAGLE `eagle/traineagle3/config.json`): `LlamaForCausalLM` plus
  `draft_vocab_size`, `pytorch_model.bin`; vLLM serves it as `Eagle3LlamaForCausalLM`.
- NVIDIA Model-Optimizer (`modelopt/torch/export/plugins/hf_spec_export.py`): `layers.0.*`, d2t without t2d in
  token-frequency order, MLA drafters (`Eagle3DeepseekV2ForCausalLM`, `model_type: kimi_k2`).
What vLLM reads (vllm 0.32, installed in the engine environment): `transformers_utils/configs/eagle.py` (the
`Eagle3<arch>` renaming), `transformers_utils/configs/speculators/algos.py` (target_hidden_size copied only when not
null, norm_before_residual default True), `model_executor/models/llama_eagle3.py` (fc width from
`num_aux_hidden_states`, else the `eagle_config` ids, else 3; `midlayer.` -> `layers.0.`; t2d skipped; d2t optional,
any order, copied into an int64 parameter), the model registry's EAGLE-3 architecture names.
Files are read through an executor (`glob`, `read_bytes`, `open`): the same code reads a local folder and one on a
GPU host over SFTP, and only headers, the mapping and sampled rows are read, never whole weights.
"""
from __future__ import annotations

import functools
import json
import os
import struct
from dataclasses import dataclass, field
from pathlib import PurePosixPath
from typing import TYPE_CHECKING

from infra.config import SpecdiagError

if TYPE_CHECKING:
    import torch

# Every EAGLE-3 architecture vLLM 0.32's registry (model_executor/models/registry.py) knows.
EAGLE3_ARCHS = {"LlamaForCausalLMEagle3", "Eagle3LlamaForCausalLM", "Eagle3MiniMaxM2ForCausalLM",
                "Eagle3Qwen2_5vlForCausalLM", "Eagle3Qwen3vlForCausalLM", "Eagle3Qwen3ForCausalLM",
                "Eagle3DeepseekV2ForCausalLM", "Eagle3DeepseekV3ForCausalLM", "PEagleDraftModel",
                "PeagleLlamaForCausalLM", "PeagleQwen3ForCausalLM"}
# safetensors dtype -> torch's name (torch is imported where a tensor is read: a diagnosis's arms never need it)
ST_DTYPES = {"F32": "float32", "F16": "float16", "BF16": "bfloat16", "I64": "int64", "I32": "int32", "I16": "int16",
             "BOOL": "bool", "U8": "uint8", "I8": "int8", "F64": "float64"}


class CannotCheck(SpecdiagError):
    """The checkpoint is there, but this reader cannot look inside it from here (not a fault of the checkpoint)."""


NORM_FLAGS = {"norm_before_fc": False, "fc_norm": False, "norm_output": False, "norm_before_residual": False}


@dataclass(frozen=True)
class TensorRef:
    """Where one tensor lives: a safetensors file and its byte offset, or a torch .bin (read whole, locally)."""

    file: str
    dtype: str
    shape: tuple[int, ...]
    offset: int | None = None  # absolute byte offset of the data in a safetensors file; None for a .bin
    key: str = ""  # the tensor's name inside a .bin

    @property
    def torch_dtype(self) -> torch.dtype:
        import torch
        return getattr(torch, ST_DTYPES.get(self.dtype, self.dtype))


@dataclass
class TargetSpec:
    path: str
    architectures: list[str]
    model_type: str
    hidden_size: int
    vocab_size: int
    num_layers: int
    max_positions: int | None
    tie_embeddings: bool
    tensors: dict[str, TensorRef] = field(default_factory=dict)  # only embed_tokens / lm_head, when found
    total_bytes: int | None = None  # the weights' size, from the index or the headers

    def output_rows(self) -> TensorRef | None:
        """The target's output embedding (lm_head, or the tied input embedding)."""
        return self.tensors.get("lm_head.weight") or self.tensors.get("embed_tokens.weight")


@dataclass
class DrafterSpec:
    """One drafter checkpoint, normalised: what the engine will build from it and where each tensor is."""

    path: str
    format: str  # an entry of FORMATS
    method: str  # eagle3 | draft_model | eagle
    architecture: str  # what vLLM instantiates (after its Eagle3 renaming)
    model_type: str
    hidden_size: int
    target_hidden_size: int
    vocab_size: int | None
    draft_vocab_size: int | None
    aux_ids: list[int] | None  # None: not set, the engine's default applies
    aux_source: str  # where the ids come from: "top level", "eagle_config" or "engine default"
    fc_inputs: int  # how many aux states the engine builds fc for
    norms: dict[str, bool]
    max_positions: int | None
    rope_scaling: dict | None
    tensors: dict[str, TensorRef] = field(default_factory=dict)  # engine names ("layers.0.*", "d2t", ...)
    config: dict = field(default_factory=dict)  # the flat config the engine builds the head from

    def engine_aux_ids(self, target_layers: int) -> list[int]:
        """The layers the engine feeds this head: the config's ids, else vLLM's default (2, N//2, N-3)."""
        ids = self.aux_ids or [2, target_layers // 2, target_layers - 3]
        return sorted(set(ids))


# ---- files -------------------------------------------------------------------------------------------------------

def _join(path: str, name: str) -> str:
    return str(PurePosixPath(path) / name)


def read_json(fs, file: str) -> dict:
    try:
        data = json.loads(fs.read_bytes(file))
    except FileNotFoundError:
        raise SpecdiagError(f"{file} not found: pass a checkpoint folder with a config.json") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise SpecdiagError(f"{file} is not valid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise SpecdiagError(f"{file} is not a JSON object")
    return data


MAX_HEADER = 100_000_000  # the safetensors format's own bound on its JSON header


def safetensors_header(fs, file: str) -> dict[str, TensorRef]:
    """A corrupt or hostile header (a size past the format's bound or the file's end, JSON that is no header) is
    that checkpoint's one-line SpecdiagError, never a read of gigabytes or a traceback."""
    with fs.open(file) as f:
        raw = f.read(8)
        size = struct.unpack("<Q", raw)[0] if len(raw) == 8 else -1
        if not 0 < size <= MAX_HEADER:
            raise SpecdiagError(f"{file} is no safetensors file: its header size is {size} bytes (a corrupt or "
                                f"truncated checkpoint; the format allows 1 to {MAX_HEADER})")
        text = f.read(size)
    try:
        if len(text) < size:
            raise ValueError(f"the file ends {size - len(text)} bytes into its {size}-byte header")
        header = json.loads(text)
        return {key: TensorRef(file, meta["dtype"], tuple(meta["shape"]), 8 + size + meta["data_offsets"][0])
                for key, meta in header.items() if key != "__metadata__"}
    except (ValueError, KeyError, TypeError, AttributeError, IndexError) as exc:
        raise SpecdiagError(f"{file} has a corrupt safetensors header: {type(exc).__name__}: {exc}") from None


def _bin_refs(file: str) -> dict[str, TensorRef]:
    """A torch .bin (the original EAGLE repo's `pytorch_model.bin`), memory-mapped: shapes without reading data."""
    sd = _bin(file)
    if not isinstance(sd, dict) or not all(isinstance(k, str) and hasattr(v, "shape") for k, v in sd.items()):
        raise SpecdiagError(f"{file} is no state dict (a mapping of names to tensors): "
                            f"it holds a {type(sd).__name__}; save the head's state_dict() as safetensors")
    return {k: TensorRef(file, str(v.dtype).replace("torch.", ""), tuple(v.shape), None, k) for k, v in sd.items()}


def weight_files(fs, path: str) -> list[str]:
    """safetensors (single or sharded) first, as vLLM does; `.bin` only when there are none."""
    found = fs.glob(_join(path, "*.safetensors"))
    return found or fs.glob(_join(path, "*.bin"))


def tensor_index(fs, path: str, wanted=None) -> dict[str, TensorRef]:
    """name -> TensorRef over every weight file; `wanted(name)` limits which shards are opened when an index
    file says where each tensor is (a 1T target has ~64 shards: only the ones holding wanted names are read)."""
    files = weight_files(fs, path)
    index = next((f for f in fs.glob(_join(path, "*.index.json"))), None)
    if index and wanted is not None:
        weight_map = read_json(fs, index).get("weight_map", {})
        outside = [f for f in set(weight_map.values()) if not _inside(f)]
        if outside:
            raise SpecdiagError(f"{index} maps tensors to {outside[0]!r}, outside the checkpoint folder: a weight_map "
                                "names files of its own folder only")
        files = sorted({_join(path, f) for k, f in weight_map.items() if wanted(k)})
    out: dict[str, TensorRef] = {}
    for f in files:
        if f.endswith(".safetensors"):
            out.update(safetensors_header(fs, f))
        elif hasattr(fs, "host") and fs.host != "local":
            raise CannotCheck(f"{f} is a torch .bin on {fs.host}: its shapes cannot be read over SFTP; run "
                              f"flows/inspect_drafter.py on that host")
        else:
            out.update(_bin_refs(f))
    return out if wanted is None else {k: v for k, v in out.items() if wanted(k)}


def _inside(name) -> bool:
    """A weight_map file name that stays in the checkpoint's folder (Transformers writes bare shard names)."""
    parts = PurePosixPath(str(name)).parts
    return isinstance(name, str) and bool(parts) and not PurePosixPath(name).is_absolute() and ".." not in parts \
        and "\\" not in name


def _bin(file: str) -> dict[str, torch.Tensor]:
    """A torch .bin state dict, memory-mapped once per file version (its tensors are read on use)."""
    return _bin_version(file, os.stat(file).st_mtime_ns)


@functools.lru_cache(maxsize=2)
def _bin_version(file: str, _mtime: int) -> dict[str, torch.Tensor]:
    import pickle

    import torch
    try:
        return torch.load(file, map_location="cpu", mmap=True, weights_only=True)
    except pickle.UnpicklingError as exc:  # a pickled object that is no tensor: never run, never loaded
        what = next((ln.strip() for ln in str(exc).splitlines() if "unsupported GLOBAL" in ln), "non-tensor objects")
        raise SpecdiagError(f"{file} holds more than tensors ({what}); specdiag reads torch .bin files with "
                            "weights_only and runs no pickled code: convert a trusted copy to safetensors") from None
    except (RuntimeError, EOFError) as exc:  # not a torch archive, or cut short
        raise SpecdiagError(f"{file} is no readable torch checkpoint: {str(exc).splitlines()[0]}") from None


def read_tensor(fs, ref: TensorRef) -> torch.Tensor:
    """A whole tensor (only for small ones: d2t, t2d, norms)."""
    import torch
    if ref.offset is None:
        return _bin(ref.file)[ref.key].clone()
    count = 1
    for d in ref.shape:
        count *= d
    nbytes = count * torch.empty(0, dtype=ref.torch_dtype).element_size()
    with fs.open(ref.file) as f:
        f.seek(ref.offset)
        data = bytearray(f.read(nbytes))
    return torch.frombuffer(data, dtype=ref.torch_dtype).reshape(ref.shape) if nbytes else \
        torch.empty(ref.shape, dtype=ref.torch_dtype)


NP_FLOATS = {"F32": "<f4", "F16": "<f2", "BF16": "<u2"}  # safetensors float dtypes numpy reads (bf16 as its bits)


def read_block(fs, ref: TensorRef, start: int, count: int):
    """Rows start..start+count of a 2-D float tensor as a float32 numpy array, in one read of a safetensors file:
    numpy only (the static checks of a draft model need no torch), and one request over SSH."""
    import numpy as np
    if ref.offset is None or ref.dtype not in NP_FLOATS:
        return read_rows(fs, ref, list(range(start, start + count))).numpy()
    width, item = ref.shape[1], np.dtype(NP_FLOATS[ref.dtype]).itemsize
    with fs.open(ref.file) as f:
        f.seek(ref.offset + start * width * item)
        raw = np.frombuffer(f.read(count * width * item), dtype=NP_FLOATS[ref.dtype]).reshape(-1, width)
    return (raw.astype(np.uint32) << 16).view(np.float32) if ref.dtype == "BF16" else raw.astype(np.float32)


def read_rows(fs, ref: TensorRef, rows: list[int]) -> torch.Tensor:
    """Rows of a 2-D tensor (sampled vocabulary rows of an lm_head or embedding), reading only those bytes."""
    import torch
    if ref.offset is None:
        return _bin(ref.file)[ref.key][torch.tensor(rows)].float()
    width = ref.shape[1]
    row_bytes = width * torch.empty(0, dtype=ref.torch_dtype).element_size()
    out = []
    with fs.open(ref.file) as f:
        for r in rows:
            f.seek(ref.offset + r * row_bytes)
            out.append(torch.frombuffer(bytearray(f.read(row_bytes)), dtype=ref.torch_dtype))
    return torch.stack(out).float() if out else torch.empty(0, width)


# ---- targets -----------------------------------------------------------------------------------------------------

def text_config(config: dict) -> dict:
    """Multimodal wrappers (Kimi-K2.5 `KimiK25ForConditionalGeneration`, Mistral-3, Qwen2.5-VL...) keep the language
    model's fields under `text_config` (or `language_config` / `llm_config`); the top level may lack them."""
    for key in ("text_config", "language_config", "llm_config"):
        inner = config.get(key)
        if isinstance(inner, dict) and "hidden_size" in inner:
            return {**config, **inner}
    return config


def hf_cache_snapshot(fs, ref: str) -> str:
    """A Hugging Face id (org/name) resolved to its snapshot in the HF cache, as the engine would; paths pass."""
    if ref.count("/") == 1 and not ref.startswith(("/", "~", ".")):
        org, name = ref.split("/")
        found = fs.glob(f"~/.cache/huggingface/hub/models--{org}--{name}/snapshots/*")
        if found:
            return found[-1]
    return ref


def read_target(fs, ref: str) -> TargetSpec:
    path = hf_cache_snapshot(fs, ref)
    raw = read_json(fs, _join(path, "config.json"))
    cfg = text_config(raw)
    missing = [k for k in ("hidden_size", "vocab_size", "num_hidden_layers") if k not in cfg]
    if missing:
        raise SpecdiagError(f"target config {path}/config.json has no {', '.join(missing)} (nor under text_config)")
    wanted = lambda k: k.endswith(("embed_tokens.weight", "lm_head.weight")) and "mtp" not in k  # noqa: E731
    refs = tensor_index(fs, path, wanted) if weight_files(fs, path) else {}
    tensors = {}
    for name in ("embed_tokens.weight", "lm_head.weight"):
        hits = sorted((k for k in refs if k.endswith(name)), key=len)
        if hits:
            tensors[name] = refs[hits[0]]
    index = next(iter(fs.glob(_join(path, "*.index.json"))), None)
    total = (read_json(fs, index).get("metadata") or {}).get("total_size") if index else None
    return TargetSpec(path, raw.get("architectures") or [], cfg.get("model_type", ""), cfg["hidden_size"],
                      cfg["vocab_size"], cfg["num_hidden_layers"], cfg.get("max_position_embeddings"),
                      bool(cfg.get("tie_word_embeddings", False)), tensors, total)


# ---- drafters ----------------------------------------------------------------------------------------------------

def _get(cfg: dict, key: str, *sources: str, default=None):
    """The first non-null value of key at the top level, then in the named nested sections (null = not set)."""
    for src in ("", *sources):
        node = cfg if not src else (cfg.get(src) or {})
        if node.get(key) is not None:
            return node[key]
    return default


def _is_speculators(cfg: dict) -> bool:
    return "speculators_config" in cfg or "speculators_model_type" in cfg


def _is_eagle_repo(cfg: dict) -> bool:
    archs = cfg.get("architectures") or []
    return "draft_vocab_size" in cfg and any(a == "LlamaForCausalLM" for a in archs) and \
        cfg.get("num_hidden_layers", 1) <= 2


def _is_modelopt(cfg: dict) -> bool:
    return "eagle_config" in cfg and any(a.startswith("Eagle3") for a in cfg.get("architectures") or [])


def _is_eagle3(cfg: dict) -> bool:
    archs = set(cfg.get("architectures") or [])
    return bool(archs & EAGLE3_ARCHS) or any("eagle3" in a.lower() for a in archs) or \
        "eagle_aux_hidden_state_layer_ids" in cfg


# (name, recognise(config), method). Order matters: the first match names the format.
FORMATS = [
    ("speculators", _is_speculators, "eagle3"),
    ("modelopt", _is_modelopt, "eagle3"),
    ("eagle-repo", _is_eagle_repo, "eagle3"),
    ("specforge", _is_eagle3, "eagle3"),
    ("eagle", lambda c: any(a.startswith("Eagle") and "Eagle3" not in a for a in c.get("architectures") or []),
     "eagle"),
    ("draft-model", lambda c: any(a.endswith(("ForCausalLM", "ForConditionalGeneration"))
                                  for a in c.get("architectures") or []), "draft_model"),
]


def detect_format(cfg: dict) -> tuple[str, str]:
    for name, recognise, method in FORMATS:
        if recognise(cfg):
            if name == "speculators":
                algo = str((cfg.get("speculators_config") or {}).get("algorithm")
                           or cfg.get("speculators_model_type", "eagle3"))
                return name, "eagle3" if "eagle3" in algo else algo
            return name, method
    raise SpecdiagError(f"cannot tell the drafter type (architectures={cfg.get('architectures')}): add it to the "
                        f"profile's drafters with an explicit method")


def _engine_names(refs: dict[str, TensorRef]) -> dict[str, TensorRef]:
    """The head's tensors under the names vLLM's EAGLE-3 loader gives them: `midlayer.` -> `layers.0.`, no `model.`."""
    return {k.removeprefix("model.").replace("midlayer.", "layers.0."): v for k, v in refs.items()}


def drafter_config(cfg: dict, fmt: str) -> dict:
    """The flat config the engine builds the head from (speculators: transformer_layer_config plus its own keys)."""
    if fmt != "speculators":
        return cfg
    flat = dict(cfg.get("transformer_layer_config") or {})
    for key in ("draft_vocab_size", "target_hidden_size", "eagle_aux_hidden_state_layer_ids", *NORM_FLAGS):
        if cfg.get(key) is not None:
            flat[key] = cfg[key]
    flat.setdefault("norm_before_residual", True)  # algos.py: update_eagle3's default
    return flat


def read_drafter(fs, path: str, method: str | None = None) -> DrafterSpec:
    raw = read_json(fs, _join(path, "config.json"))
    fmt, detected = detect_format(raw)
    method = method or detected
    cfg = drafter_config(raw, fmt)
    hidden = cfg.get("hidden_size")
    if hidden is None:
        raise SpecdiagError(f"{path}/config.json has no hidden_size (nor under transformer_layer_config)")
    top_ids, nested_ids = cfg.get("eagle_aux_hidden_state_layer_ids"), (cfg.get("eagle_config") or {}).get(
        "eagle_aux_hidden_state_layer_ids")
    ids = top_ids or nested_ids
    source = "top level" if top_ids else "eagle_config" if nested_ids else "engine default"
    fc_inputs = cfg.get("num_aux_hidden_states") or (len(nested_ids) if nested_ids else 3)  # llama_eagle3.py
    archs = cfg.get("architectures") or raw.get("architectures") or ["?"]
    arch = archs[0] if method != "eagle3" or archs[0].startswith("Eagle3") or archs[0].endswith("Eagle3") \
        else f"Eagle3{archs[0]}"
    norms = {k: bool(_get(cfg, k, "eagle_config", default=d)) for k, d in NORM_FLAGS.items()}
    if method in ("eagle3", "eagle"):
        refs = _engine_names(tensor_index(fs, path))
    else:  # a whole model: its input embedding, wherever its wrapper nests it (model., language_model.model., ...)
        hits = tensor_index(fs, path, lambda k: k.endswith("embed_tokens.weight"))
        refs = {"embed_tokens.weight": hits[min(hits, key=len)]} if hits else {}
    return DrafterSpec(path, fmt, method, arch, cfg.get("model_type", ""), hidden,
                       cfg.get("target_hidden_size") or hidden, cfg.get("vocab_size"),
                       cfg.get("draft_vocab_size") or cfg.get("vocab_size"), sorted(set(ids)) if ids else None,
                       source, fc_inputs, norms, cfg.get("max_position_embeddings"), cfg.get("rope_scaling"),
                       refs, {**cfg, **norms})


def mapping(fs, d: DrafterSpec) -> torch.Tensor | None:
    """Draft id -> target id (i + d2t[i], int64), or None when the head has no d2t."""
    import torch
    ref = d.tensors.get("d2t")
    if ref is None:
        return None
    d2t = read_tensor(fs, ref).to(torch.int64)
    return torch.arange(len(d2t)) + d2t
