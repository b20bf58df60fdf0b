"""How long the static checks take to flag a scrambled d2t, next to a server launch on the same machine.

    python benchmarks/static_checks_vs_launch.py
Both measured in this one run: the demo EAGLE-3 drafter for SmolLM2 (trained by the project) with its d2t
scrambled is checked statically, then the embedded vLLM CPU server is launched with that drafter and timed to
healthy (and stopped): the launch the static checks save.
"""
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from infra import embedded, vllm  # noqa: E402
from infra.executor import LocalExecutor  # noqa: E402
from tasks.health import wait_healthy  # noqa: E402
from tasks.inspect import inspect_drafter  # noqa: E402
from tasks.launch import Server  # noqa: E402


def main() -> None:
    target = embedded.target_model()
    head = embedded.resolve("embedded:smol-eagle3-scrambled")
    with tempfile.TemporaryDirectory() as tmp:
        start = time.monotonic()
        findings = inspect_drafter.fn(str(head), "eagle3", str(target))
        static_s = time.monotonic() - start
        flagged = [f.code for f in findings if f.severity == "error"]
        assert "d2t_scrambled" in flagged, findings
        start = time.monotonic()
        cli = subprocess.run([sys.executable, str(Path(__file__).resolve().parents[1] / "flows" / "inspect_drafter.py"),
                              str(head), "--target", str(target)], capture_output=True, text=True)
        cli_s = time.monotonic() - start
        assert cli.returncode == 1 and "d2t_scrambled" in cli.stdout, cli.stdout + cli.stderr

        ex = LocalExecutor()
        argv = vllm.server_argv(embedded.engine_python(), str(target), 8099, ["--enforce-eager", "--dtype",
                                "bfloat16", "--max-model-len", "2048", "--distributed-executor-backend", "uni"],
                                {"method": "eagle3", "model": head, "num_speculative_tokens": 3}, None)
        proc = ex.launch(argv, vllm.server_env({"VLLM_CPU_KVCACHE_SPACE": "2", "VLLM_CPU_OMP_THREADS_BIND": "auto"}),
                         str(Path(tmp) / "server.log"))
        try:
            launch_s = wait_healthy.fn(Server("launch", proc, ex.base_url(8099), ex), timeout_s=600)
        finally:
            ex.stop_group(proc.pgid)
    print(f"static checks flagged {flagged} in {static_s:.2f} s")
    print(f"server launch to healthy (SmolLM2-135M, vLLM CPU, eager): {launch_s:.1f} s")
    print(f"whole CLI (python flows/inspect_drafter.py, interpreter and torch import included): {cli_s:.1f} s")
    print(f"ratio launch / static checks: {launch_s / static_s:.0f}x; launch / whole CLI: {launch_s / cli_s:.1f}x")


if __name__ == "__main__":
    main()
