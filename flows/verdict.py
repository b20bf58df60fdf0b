"""Recompute a verdict from the MLflow record alone: after a rule changed, or over arms gathered across diagnoses.

    python flows/verdict.py DIAGNOSIS_RUN_ID                # the diagnosis's own arms, findings, offline numbers
    python flows/verdict.py BASELINE_RUN CANDIDATE_RUN ...  # arm runs from any diagnoses (roles from their tags;
                                                            # --candidate NAME picks which arm is judged)
No server starts. Exit status 0 when the recomputed cause equals the recorded one (or none was recorded), 3 if not.
"""
import argparse
import json
import sys
import tempfile
from pathlib import Path

if __package__ in (None, ""):  # run as `python flows/verdict.py`
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from mlflow.exceptions import MlflowException  # noqa: E402

from infra.tracking import Tag, Tracker  # noqa: E402
from tasks.inspect import Finding  # noqa: E402
from tasks.offline import OfflineResult  # noqa: E402
from tasks.reuse import arm_result  # noqa: E402
from tasks.verdict import EVIDENCE, assemble  # noqa: E402


def gather(tracker: Tracker, run_ids: list[str], candidate: str | None):
    """(arm results, findings, offline, the recorded cause) from diagnosis and arm runs."""
    runs, findings, offline, recorded = [], {}, OfflineResult(), None
    for rid in run_ids:
        run = tracker.run(rid)
        if run.data.tags.get(Tag.KIND) == "diagnosis":
            recorded = run.data.tags.get(Tag.VERDICT) if len(run_ids) == 1 else None
            arms = tracker.children(run.info.experiment_id, rid)
            plan = run.data.params.get("arms", "").split(",")  # the flow reads its arms in the plan's order, not
            runs += sorted(arms, key=lambda r: plan.index(a) if (a := r.data.tags.get(Tag.ARM)) in plan
                           else len(plan))  # the order they ran in (a control swapped before its candidate)
            if EVIDENCE in tracker.artifact_names(rid):
                with tempfile.TemporaryDirectory() as tmp:
                    saved = json.loads(tracker.download(rid, EVIDENCE, tmp).read_text())
                findings.update({a: [Finding(**f) for f in fs] for a, fs in saved["findings"].items()})
                offline = OfflineResult(**saved["offline"])
        else:
            runs.append(run)
    def role(run) -> str | None:  # with --candidate, that arm is judged; any other candidate becomes an extra arm
        if candidate:
            return "candidate" if run.data.tags[Tag.ARM] == candidate else \
                "extra" if run.data.tags[Tag.ROLE] == "candidate" else None
        return None

    return [arm_result(tracker, r, role(r)) for r in runs], findings, offline, recorded


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="verdict", description=__doc__.splitlines()[0])
    ap.add_argument("runs", nargs="+", metavar="RUN_ID", help="a diagnosis (parent) run, or arm runs")
    ap.add_argument("--candidate", metavar="ARM", help="the arm to judge as the candidate")
    args = ap.parse_args(argv)
    try:
        results, findings, offline, recorded = gather(Tracker(), args.runs, args.candidate)
    except (MlflowException, KeyError) as exc:
        print(f"verdict: error: {args.runs} are not specdiag runs in this store ({exc})", file=sys.stderr)
        return 2
    v, _ = assemble(results, findings, offline)
    print(v.markdown())
    if recorded is None:
        return 0
    print(f"\nrecorded `{recorded}`, recomputed `{v.cause}`: " + ("the same" if recorded == v.cause else
                                                                  "DIFFERENT (a rule or threshold changed)"))
    return 0 if recorded == v.cause else 3


if __name__ == "__main__":
    sys.exit(main())
