"""Static checks on a full-size Kimi-K2-shaped EAGLE-3 head against a Kimi-K2.5-shaped target: wall time and peak
memory of `flows/inspect_drafter.py`, locally (and over SFTP with --ssh-port, against a running sshd on 127.0.0.1).

    python benchmarks/inspect_full_size.py
Goal: under 5 s and under 1 GB. The head (3.1 GB with its embedding) and the target's 2.3 GB lm_head shard are sparse
files (tests/fixtures/formats.py: kimi_k2_full_size): only headers, d2t/t2d and sampled rows are read.
"""
from __future__ import annotations

import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.fixtures.formats import kimi_k2_full_size  # noqa: E402


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        head, target = kimi_k2_full_size(Path(tmp))
        size = (head / "model.safetensors").stat().st_size
        start = time.monotonic()
        proc = subprocess.run([sys.executable, "flows/inspect_drafter.py", str(head), "--target", str(target)],
                              cwd=ROOT, capture_output=True, text=True)
        wall = time.monotonic() - start
        peak_mib = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    print(proc.stdout + proc.stderr)
    print(f"head file {size / 2**30:.1f} GiB (sparse); inspect_drafter.py exit {proc.returncode}")
    print(f"wall {wall:.2f} s (goal < 5 s: {wall / 5:.2f} of the goal); "
          f"peak RSS {peak_mib:.0f} MiB (goal < 1024 MiB: {peak_mib / 1024:.2f} of the goal)")


if __name__ == "__main__":
    main()
