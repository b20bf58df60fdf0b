"""Command-line flags for flows/diagnose.py: parse only; the flow does the work."""
from __future__ import annotations

import argparse

from infra.arms import PROBES
from infra.config import known_profiles

EPILOG = """examples:
  python flows/diagnose.py --profile demo --drafter smol-permuted --control smol-self
  python flows/diagnose.py --profile kimi-k25 --drafter aqmedai
  python flows/diagnose.py --drafter /path/to/eagle3-checkpoint --arms ngram --prompts 16
  python flows/diagnose.py --set bench.concurrency=4 --set target.port=8020
  python flows/diagnose.py --drafter smol-eagle3 --control smol-self --probe raw_prompts --probe k_sweep

Each arm is an MLflow child run under one parent run per diagnosis; see them with
  mlflow ui --backend-store-uri sqlite:///mlflow.db"""


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="diagnose", epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Run a controlled speculative-decoding diagnosis: a no-spec baseline, the candidate "
                    "drafter, a known-good control and any extra arms, each on a fresh server with the "
                    "same target, prompts and server arguments; compare them.")
    p.add_argument("--profile", default="demo", help=f"profile name ({', '.join(known_profiles())}) or YAML path")
    p.add_argument("--drafter", help="candidate drafter: a registry name from the profile or a checkpoint folder")
    p.add_argument("--control", help="known-good control drafter (registry name or checkpoint folder)")
    p.add_argument("--no-control", action="store_true", help="run without a control arm")
    p.add_argument("--arms", nargs="*", default=None, metavar="DRAFTER", help="extra arms after the control")
    p.add_argument("--probe", dest="probes", action="append", default=None,
                   choices=list(PROBES),
                   help="add probe arms derived from the candidate (repeatable)")
    p.add_argument("--host", help="run the servers on this host of the profile's inventory (e.g. over SSH)")
    p.add_argument("--hosts", nargs="+", metavar="HOST", help="spread the arms over these hosts of the inventory, "
                   "one arm per host at a time, through Prefect workers (spread.hosts; see the README)")
    p.add_argument("--insecure-services", action="store_true", help="spread over a Prefect or MLflow server that "
                   "answers without credentials (refused by default: see docs/services.md)")
    p.add_argument("--prompt-set", metavar="NAME|PATH", help="chat, math, code, long, or a JSONL / ShareGPT file")
    p.add_argument("--fixed", action="store_true", help="measure every prompt of --prompts in every arm; by default "
                   "an arm ends once its numbers settle what the verdict asks of it, --prompts being the cap")
    p.add_argument("--budget-tokens", type=int, metavar="N", help="end each arm's window after N output tokens, "
                   "settled or not (bench.max_output_tokens)")
    p.add_argument("--budget-s", type=float, metavar="S", help="end each arm's window after S seconds, settled or "
                   "not (bench.max_bench_s)")
    p.add_argument("--confirm", action="store_true", help="run the fix the verdict implies as one more arm and say "
                   "whether it helps (confirmed / not confirmed)")
    p.add_argument("--fresh", action="store_true", help="measure every arm, even where MLflow holds an arm with the "
                   "same fingerprint (target, server args, engine version, host, prompts, benchmark, drafter files)")
    p.add_argument("--max-age", type=float, metavar="HOURS", help="reuse only arms measured this recently "
                   "(default 168)")
    p.add_argument("--rerun", metavar="RUN_ID", help="repeat a recorded diagnosis exactly: its recorded profile and "
                   "prompt texts, every arm measured again")
    p.add_argument("--no-swap", action="store_true", help="give every drafter arm its own server load; by default "
                   "drafters of the same shapes are swapped into one running server (swap.enabled)")
    p.add_argument("--dry-run", action="store_true", help="print the plan (the arms, the server loads and why each "
                   "arm is served as it is) and exit: no server, no MLflow run")
    p.add_argument("--force", action="store_true",
                   help="launch arms whose static checks found a fault that makes the load pointless")
    p.add_argument("--hidden-states", metavar="DIR", help="offline evaluation from these dumps on the host "
                   "(SpecForge data_*.ckpt, speculators hs_*.safetensors) instead of loading the target")
    p.add_argument("--prompts", type=int, metavar="N", help="number of measured prompts per arm")
    p.add_argument("--max-tokens", type=int, metavar="N", help="max output tokens per request")
    p.add_argument("--concurrency", type=int, metavar="N", help="concurrent streams (default 1)")
    p.add_argument("--port", type=int, help="server port")
    p.add_argument("--set", dest="sets", action="append", default=[], metavar="KEY=VALUE",
                   help="override any profile field, e.g. --set bench.temperature=0.7 (repeatable)")
    p.add_argument("--serve", action="store_true", help="serve the flow as the Prefect deployment 'diagnose'")
    return p


def overrides(args: argparse.Namespace) -> dict:
    """CLI flags as dotted profile keys; None means 'keep the profile's value'."""
    out = {"drafter": args.drafter, "control": args.control, "arms": args.arms,
           "bench.num_prompts": args.prompts, "bench.max_tokens": args.max_tokens,
           "bench.concurrency": args.concurrency, "target.port": args.port, "probes": args.probes,
           "host": args.host, "spread.hosts": args.hosts, "bench.prompts": args.prompt_set,
           "bench.early_stop": False if args.fixed else None, "bench.max_output_tokens": args.budget_tokens,
           "bench.max_bench_s": args.budget_s,
           "force": args.force or None, "confirm": args.confirm or None,
           "reuse.enabled": False if args.fresh else None, "swap.enabled": False if args.no_swap else None, "reuse.max_age_h": args.max_age,
           "spread.insecure_services": args.insecure_services or None,
           "offline.hidden_states": args.hidden_states}
    if args.no_control:
        out["control"] = ""
    return out
