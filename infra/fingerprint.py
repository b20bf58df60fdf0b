"""An arm's fingerprint: everything that decides what its measurement would be. Two arms with equal fingerprints
measure the same thing, so the newest successful one recorded can stand for a fresh one (tasks/reuse.py).

Files are identified on the host that serves them, without reading large files whole: every file's relative path,
size and modification time, a safetensors file's header (names, shapes, dtypes, offsets), small files' bytes and
the first MiB of large ones. A rewritten drafter file (new mtime) is a new measurement; a moved folder is not.
"""
from __future__ import annotations

import hashlib
import json

from infra import secrets
from infra.config import Profile, SpecdiagError

IDENTIFY = r'''
import hashlib, json, os, struct, sys
def ident(root):
    h = hashlib.sha256()
    if not os.path.exists(root):
        return "id:" + root
    files = [root] if os.path.isfile(root) else sorted(
        os.path.join(d, n) for d, _, names in os.walk(root) for n in names)
    for p in files:
        st = os.stat(p)
        h.update(f"{os.path.relpath(p, root)}\0{st.st_size}\0{st.st_mtime_ns}\0".encode())
        with open(p, "rb") as f:
            if p.endswith(".safetensors") and st.st_size >= 8:
                h.update(f.read(min(struct.unpack("<Q", f.read(8))[0], 1 << 27)))
            else:
                h.update(f.read(1 << 20))
    return h.hexdigest()
try:
    from importlib.metadata import version
    engine = version("vllm")
except Exception:
    engine = "unknown"
print(json.dumps({"engine": engine, "paths": {p: ident(p) for p in sys.argv[1:]}}))
'''


def identify(executor, python: str, paths: list[str], timeout_s: float = 300) -> dict:
    """{"engine": the engine's installed version, "paths": {path: identity}} read on the executor's host."""
    done = executor.run([python, "-c", IDENTIFY, *paths], timeout_s)
    if done.returncode != 0:
        raise SpecdiagError(f"could not identify the checkpoints on host {executor.host}: {done.stderr.strip()[-300:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def fields(cfg: Profile, arm, target: str, prompts: list[str], ids: dict, judges_speed: bool) -> dict:
    """What decides the arm's measurement: target, server arguments, engine, host, prompts, benchmark, drafter."""
    spec = None
    if arm.spec:
        spec = {**arm.spec.model_dump(exclude={"model", "expected_acceptance"}),
                "drafter": ids["paths"].get(arm.spec.model) if arm.spec.model else None}
        spec["engine_env"] = secrets.env(spec["engine_env"])  # a secret's hash: the same token still matches
    bench = arm.bench_config(cfg).model_dump()
    return {
        "target": ids["paths"][target],
        "server_args": arm.server_args(cfg),
        "engine": {"kind": cfg.engine.kind, "version": ids["engine"], "python": cfg.engine_python or "embedded",
                   "env": secrets.env(cfg.engine_env), "per_request_spec_metrics": cfg.engine.per_request_spec_metrics},
        "host": {"name": cfg.host.name, "kind": cfg.host.kind, "address": cfg.host.address, "gpus": cfg.host.gpus,
                 **({"cpus": cfg.host.cpus} if cfg.host.cpus else {})},  # only where set: earlier prints still match
        "prompts": hashlib.sha256("\0".join(prompts).encode()).hexdigest(),
        "bench": bench,
        "speculative": spec,
        # the early stop ends a speed-judged arm on tok/s as well as acceptance: it measures longer
        "early_stop_judges_speed": judges_speed if bench["early_stop"] else None,
        # and asks context_limit's question (acceptance before vs past this position): only where set, as above
        **({"early_stop_position_limit": arm.position_limit} if arm.position_limit and bench["early_stop"] else {}),
        # a control settles its acceptance narrow whatever it is clear of (tasks/verdict/asks.questions): only where set
        **({"early_stop_settles_narrow": True} if arm.role == "control" and bench["early_stop"] else {}),
    }


def digest(fp: dict) -> str:
    return hashlib.sha256(json.dumps(fp, sort_keys=True, default=str).encode()).hexdigest()[:32]
