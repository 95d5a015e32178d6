"""One self-contained HTML page of a run: `python -m coevo_jax.reporting.report WORKDIR --html OUT.html`.

The page (`html_template.html`, plain HTML, CSS and JavaScript: no network, opens from disk) holds Table 1,
the run's figures as embedded PNGs (`reporting.figures`), the pairs by kind and hard negatives per method,
iteration and agent, what the co-evolution had to work with and its warnings (`reporting.mechanism`), and
three browsers over the data (`html_data.page_data`, embedded as JSON and drawn a page of 20 at a time):
the pairs each pair phase trained on, two trajectories side by side turn by turn with the first diverging
turn marked; two evaluated policies' test-set episodes side by side per task; a GRPO
step's K episodes of a task side by side. Works on any finished or partial workdir.
"""

from __future__ import annotations

import base64
import html
import json
import os
from collections.abc import Mapping
from importlib import resources
from pathlib import Path

from coevo_jax.atomic_files import atomic_path
from coevo_jax.reporting import run_files
from coevo_jax.reporting.figures import (
    failure_analysis_figure,
    grpo_step_rewards,
    grpo_steps_figure,
    png_bytes,
    pool_makeup_figure,
    reward_curves_figure,
)
from coevo_jax.reporting.html_data import page_data, pair_counts
from coevo_jax.reporting.mechanism import HEADERS as MECHANISM_HEADERS
from coevo_jax.reporting.mechanism import NOTE as MECHANISM_NOTE
from coevo_jax.reporting.mechanism import mechanism_cells, warnings
from coevo_jax.reporting.results import coevolve_rounds, final_scores, score_row
from coevo_jax.reporting.tables import LEGEND, MISSING, table_columns

TEMPLATE = "html_template.html"


def figures_html(results: Mapping) -> str:
    """The run's figures as <figure>s with embedded PNGs: Figure 3, Figure 2, and where the run has them the
    CoEvolve pool and GRPO steps figures."""
    figures = [
        ("Figure 3: average reward across iterations", reward_curves_figure(results)),
        ("Figure 2: failures produced and their reward", failure_analysis_figure(results)),
    ]
    if any(coevolve_rounds(method) for method in results["methods"].values()):
        figures.append(("CoEvolve's task pool by provenance", pool_makeup_figure(results)))
    if any(grpo_step_rewards(method) for method in results["methods"].values()):
        figures.append(("Reward of each GRPO step's episodes", grpo_steps_figure(results)))
    out = []
    for caption, figure in figures:
        data = base64.b64encode(png_bytes(figure)).decode("ascii")
        out.append(
            f'<figure><img alt="{html.escape(caption)}" src="data:image/png;base64,{data}">'
            f"<figcaption>{html.escape(caption)}</figcaption></figure>"
        )
    return "\n".join(out)


def _table(headers, rows, table_id: str) -> str:
    head = "".join(f"<th>{html.escape(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in row) + "</tr>" for row in rows)
    return f'<table class="grid" id="{table_id}"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>'


def results_table_html(results: Mapping) -> str:
    """Table 1 (each method's last evaluated iteration) as an HTML table with its legend."""
    columns = table_columns(results["splits"])
    rows = []
    for name, evals in final_scores(results).items():
        row = score_row(evals, results["splits"])
        rows.append([name, *(MISSING if (v := get(row)) is None else f"{v:.1f}" for _, get in columns)])
    table = _table(["Method", *(header for header, _ in columns)], rows, "results-table")
    return f'<p class="note">{html.escape(LEGEND)}</p>{table}'


def pair_counts_html(results: Mapping) -> str:
    """Per method, iteration and agent that trained on pairs: the pairs by kind and the hard negatives."""
    counts = pair_counts(results)
    if not counts:
        return '<p class="note">No method of this run trained on pairs (yet).</p>'
    kinds = sorted({kind for row in counts for kind in row["by_kind"]})
    rows = [
        [
            row["method"],
            str(row["iteration"]),
            row["agent"],
            str(row["pairs"]),
            *(str(row["by_kind"].get(kind, 0)) for kind in kinds),
            str(row["hard_negatives"]),
        ]
        for row in counts
    ]
    headers = ["Method", "Iteration", "Agent", "Pairs", *kinds, "Hard negatives"]
    return _table(headers, rows, "pair-counts")


def mechanism_html(results: Mapping) -> str:
    """What the co-evolution had to work with per method and iteration (`reporting.mechanism`), each
    warning first."""
    cells = mechanism_cells(results)
    if not cells:
        return '<p class="note">No method of this run trained on pairs (yet).</p>'
    found = "".join(f'<p class="warning">{html.escape(line)}</p>' for line in warnings(results))
    note = f'<p class="note">{html.escape(MECHANISM_NOTE)}</p>'
    return found + note + _table(MECHANISM_HEADERS, cells, "mechanism")


def _json_for_script(data: Mapping) -> str:
    """`data` as JSON safe inside a <script> element (no '<' can close it)."""
    return json.dumps(data, ensure_ascii=False, separators=(",", ":")).replace("<", "\\u003c")


def render_page(results: Mapping, data: Mapping, title: str) -> str:
    """The page: the template with its title, its static sections and the browsers' JSON filled in."""
    template = resources.files("coevo_jax.reporting").joinpath(TEMPLATE).read_text(encoding="utf-8")
    static = (
        '<section id="results"><h2>Results (Table 1)</h2>'
        + results_table_html(results)
        + '</section><section id="figures"><h2>Figures</h2><div class="figures">'
        + figures_html(results)
        + '</div></section><section id="counts"><h2>Pairs by kind and hard negatives</h2>'
        + pair_counts_html(results)
        + '</section><section id="worked-with"><h2>What the co-evolution had to work with</h2>'
        + mechanism_html(results)
        + "</section>"
    )
    before, after = template.split("__DATA__")
    before = before.replace("__TITLE__", html.escape(title)).replace("__STATIC__", static)
    return before + _json_for_script(data) + after


def write_html_report(workdir: str | os.PathLike, results: Mapping, out: str | os.PathLike) -> int:
    """Write the run's page to `out` (atomically); returns its size in bytes."""
    workdir = os.fspath(workdir)
    names = run_files.method_names(results, run_files.run_config(workdir, results))
    data = page_data(
        results,
        names,
        run_files.pair_phases(workdir),
        lambda policy, split: run_files.eval_episodes(workdir, policy, split),
        run_files.grpo_steps(workdir, list(names.values())),
    )
    title = f"{results.get('env', '?')}, seed {results.get('seed', '?')}: {Path(workdir).resolve().name}"
    page = render_page(results, data, title).encode("utf-8")
    with atomic_path(out) as tmp, open(tmp, "wb") as file:
        file.write(page)
    return len(page)
