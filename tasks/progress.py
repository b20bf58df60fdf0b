"""Progress of an arm's benchmark while it runs: a line in the console every few seconds (requests, tokens,
acceptance so far, elapsed) and a Prefect progress artifact on the flow run, so a long arm is visibly alive."""
from __future__ import annotations

import time
from collections.abc import Callable

from prefect.artifacts import create_progress_artifact, update_progress_artifact
from prefect.context import TaskRunContext


class BenchProgress:
    def __init__(self, arm: str, total: int, spec_so_far: Callable[[], tuple[float, ...]] | None,
                 every_s: float = 10.0):
        self.arm, self.total, self.spec_so_far, self.every_s = arm, total, spec_so_far, every_s
        self.next_print = time.monotonic() + every_s
        self.artifact = create_progress_artifact(0.0, description=f"{arm}: benchmark requests done") \
            if TaskRunContext.get() else None

    def update(self, done: int, tokens: int, elapsed: float) -> None:
        if self.artifact:
            update_progress_artifact(self.artifact, 100.0 * done / max(1, self.total))
        if time.monotonic() < self.next_print and done < self.total:
            return
        self.next_print = time.monotonic() + self.every_s
        spec = ""
        if self.spec_so_far:
            drafts, rate = self.spec_so_far()[:2]
            spec = f", acceptance so far {rate:.3f} over {drafts:.0f} drafts" if drafts else ", no drafts yet"
        print(f"[{self.arm}] benchmark: {done}/{self.total} requests, {tokens} tokens{spec}, {elapsed:.0f} s")
