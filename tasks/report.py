"""One page per diagnosis, `report.html` on the parent run: the verdict and its evidence, every arm's own cause and
figures, the plots, the static findings, each arm's server command and a link to its run. Self-contained (plots
inline as data URIs, no script, no network): it renders in MLflow's artifact viewer and opens from the file system.
The figures are read back from the arms' MLflow runs, so the page and MLflow agree to the digit."""
from __future__ import annotations

import base64
import html

from prefect import task
from prefect.artifacts import create_link_artifact
from prefect.cache_policies import NO_CACHE

from infra.tracking import Tag, Tracker, metric_key, run_path
from tasks.compare import COLUMNS, METRIC_COLUMNS, measured
from tasks.record import ArmResult

STYLE = """body{font-family:system-ui,sans-serif;margin:2em;max-width:1500px;color:#222}
table{border-collapse:collapse;margin:1em 0}td,th{border:1px solid #ccc;padding:4px 8px;text-align:right}
td:first-child,th:first-child,td.text{text-align:left}th{background:#f3f3f3}.cause{font-family:monospace;
background:#eef;padding:2px 6px;border-radius:4px}.FAILED{color:#b00;font-weight:bold}img{max-width:32%;margin:4px}
pre{background:#f7f7f7;padding:8px;white-space:pre-wrap}code{font-size:90%}"""


def _cell(value) -> str:
    if value is None:
        return "<td>-</td>"
    if isinstance(value, float):
        return f"<td>{value:.3f}</td>"
    return f'<td class="text {html.escape(str(value))}">{html.escape(str(value))}</td>'


def _arms_table(runs: dict[str, object], results: list[ArmResult], experiment_id: str) -> str:
    head = "".join(f"<th>{html.escape(c)}</th>" for c in [*COLUMNS, "cause", "run"])
    rows = []
    for r in results:
        data = runs[r.arm].data
        values = [r.arm, r.role, "ok" if r.ok else "FAILED", *[data.metrics.get(metric_key(c)) for c in METRIC_COLUMNS],
                  measured(r)]
        cause = data.tags.get(Tag.ARM_VERDICT, "-" if r.role != "baseline" else "")
        link = f'<a href="/{run_path(experiment_id, r.run_id)}" target="_top">{r.run_id[:8]}</a>'
        rows.append(f'<tr data-arm="{html.escape(r.arm)}">' + "".join(_cell(v) for v in values)
                    + f'<td class="text"><span class="cause">{html.escape(cause)}</span></td><td>{link}</td></tr>')
    return f'<table id="arms"><tr>{head}</tr>' + "".join(rows) + "</table>"


def _commands(runs: dict[str, object], results: list[ArmResult]) -> str:
    items = []
    for r in results:
        data = runs[r.arm].data
        error = data.tags.get(Tag.ERROR)
        items.append(f"<h3>{html.escape(r.arm)}</h3><pre>{html.escape(data.params.get('server_cmd', 'not launched'))}"
                     "</pre>" + (f'<p class="FAILED">{html.escape(error)}</p>' if error else ""))
    return "".join(items)


def render(decision, results: list[ArmResult], runs: dict[str, object], experiment_id: str, findings_md: str,
           images: dict[str, bytes], title: str) -> str:
    evidence = "".join(f"<li>{html.escape(e)}</li>" for e in decision.evidence)
    plots = "".join(f'<img alt="{html.escape(name)}" src="data:image/png;base64,{base64.b64encode(png).decode()}">'
                    for name, png in images.items())
    nxt = f"<p><b>Next:</b> {html.escape(decision.next_step)}</p>" if decision.next_step else ""
    return (f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
            f"<style>{STYLE}</style></head><body><h1>{html.escape(title)}</h1>"
            f'<h2>Verdict: <span class="cause" id="verdict">{html.escape(decision.cause)}</span></h2>'
            f'<ul id="evidence">{evidence}</ul>{nxt}<h2>Arms</h2>{_arms_table(runs, results, experiment_id)}'
            f'<h2>Plots</h2><div id="plots">{plots}</div><h2>Static checks</h2><pre id="static">'
            f"{html.escape(findings_md)}</pre><h2>Server commands</h2>{_commands(runs, results)}</body></html>")


@task(name="report", cache_policy=NO_CACHE)
def report(tracker: Tracker, parent_run_id: str, experiment_id: str, results: list[ArmResult], decision,
           findings_md: str, images: dict[str, bytes], title: str) -> str:
    runs = {r.arm: tracker.run(r.run_id) for r in results}  # the record, not the in-memory copy
    page = render(decision, results, runs, experiment_id, findings_md, images, title)
    tracker.text(parent_run_id, page, "report.html")
    create_link_artifact(tracker.run_link(experiment_id, parent_run_id), link_text=f"MLflow: {title}",
                         key="specdiag-mlflow-run", description=f"the diagnosis in MLflow ({tracker.uri}): verdict, "
                         "comparison, report.html, one child run per arm")
    return page
