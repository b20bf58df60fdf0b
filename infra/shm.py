"""/dev/shm leftovers of stopped servers: vLLM's message-queue segments (psm_*), Intel OpenMP registrations
(__KMP_REGISTERED_LIB_<pid>), torch/multiprocessing segments. A killed server never unlinks them.

Only names created while our server ran and no longer mapped or open by any process are removed, and none while
another vLLM server runs on the machine (disjoint GPU sets, or two hosts that are one machine): a starting server's
fresh semaphore is neither mapped nor open until its engine process has unpickled it, seconds later, and removing it
then kills that server's start (seen: FileNotFoundError in SemLock._rebuild).
"""
from __future__ import annotations

import shlex

PATTERNS = ("psm_", "__KMP_REGISTERED_LIB_", "vllm", "torch_", "sem.mp-")
_REMOVE = r"""cd /dev/shm 2>/dev/null || exit 0
pgrep -f "vllm[.]entrypoints[.]openai[.]api_server" >/dev/null 2>&1 && exit 0  # [.]: not this shell itself
for f in "$@"; do
  [ -e "$f" ] || continue
  grep -qsF "/dev/shm/$f" /proc/[0-9]*/maps && continue
  ls -l /proc/[0-9]*/fd 2>/dev/null | grep -qF "/dev/shm/$f" && continue
  rm -f -- "$f" && echo "$f"
done"""


def listing(executor) -> set[str]:
    done = executor.run(["ls", "-1A", "/dev/shm"], 30)
    return {n for n in done.stdout.split() if n.startswith(PATTERNS)} if done.returncode == 0 else set()


def remove_unused(executor, names: set[str]) -> list[str]:
    if not names:
        return []
    done = executor.run(["sh", "-c", _REMOVE, "shm-clean", *sorted(names)], 60)
    return done.stdout.split()
