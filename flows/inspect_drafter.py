"""Static checks of a drafter checkpoint against its target, in seconds, before any server starts.

    python flows/inspect_drafter.py PATH --target TARGET [--control PATH]
Exit status 1 when any check is an error.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from infra import embedded  # noqa: E402
from infra.config import SpecdiagError  # noqa: E402
from tasks.inspect import inspect_drafter  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="inspect_drafter", description=__doc__.split("\n\n")[0])
    p.add_argument("path", help="drafter checkpoint folder (EAGLE-3 head or draft model), or embedded:NAME")
    p.add_argument("--target", required=True, help="target model folder (or embedded:smollm2)")
    p.add_argument("--control", help="a known-good drafter to compare with")
    args = p.parse_args(argv)
    try:
        target, args.path = embedded.resolve(args.target), embedded.resolve(args.path)
        args.control = embedded.resolve(args.control) if args.control else None
        findings = inspect_drafter.fn(args.path, None, target, args.control)
    except SpecdiagError as exc:
        print(f"specdiag: error: {exc}", file=sys.stderr)
        return 2
    print(f"{args.path} vs target {target}:")
    for f in findings:
        print("  " + f.line())
    errors = sum(f.severity == "error" for f in findings)
    print(f"{errors} error(s), {sum(f.severity == 'warning' for f in findings)} warning(s)")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
