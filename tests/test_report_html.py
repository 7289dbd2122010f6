"""The jobs CSV and the self-contained HTML report of a simulated run."""
import base64
import csv
import io
import re
import shutil
import subprocess

import matplotlib.image
import pytest

from rollmux.errors import ReportError
from rollmux.model import Cluster, Job, PoolSpec
from rollmux.policies import make_policy
from rollmux.report import html as report_html
from rollmux.report import plots
from rollmux.report.html import write_html_report
from rollmux.report.jobs_csv import COLUMNS, NEVER_RAN, write_jobs_csv
from rollmux.report.paths import csv_cell
from rollmux.sim.engine import simulate
from rollmux.sim.optimal_curve import optimal_curve
from rollmux.traces.generate import generate

HOSTILE = "<script>x</script>"  # (a trace's name and title are the user's text; a job id is A-Z a-z 0-9 . _ -)
FORMULA = '=HYPERLINK("http://x","y")'  # a formula to a spreadsheet opening the jobs CSV
CLUSTER = Cluster(rollout=PoolSpec("H200", 6.3), train=PoolSpec("B200", 8.6, nodes=4))


@pytest.fixture(scope="module")
def trace():
    """Fourteen jobs on a 4-node training pool (some wait), and one arriving last that needs
    8 training nodes: it never runs."""
    jobs = generate(14, seed=3)
    last = max(j.arrival_s for j in jobs)
    return jobs + [Job("huge", 100.0, 50.0, train_gpus=64, slo=1.5, arrival_s=last + 1.0, iterations=4)]


@pytest.fixture(scope="module")
def results(trace):
    """rollmux (phases recorded), solo-d, and the optimal curve (skipped: bounded pools)."""
    return [simulate(trace, CLUSTER, make_policy("rollmux"), record_spans=True),
            simulate(trace, CLUSTER, make_policy("solo-d")), optimal_curve(trace, CLUSTER)]


def _report(results, path, **kw):
    args = dict(title="Report <i>of</i> & run", trace_info={"name": "t<b>", "source": HOSTILE, "jobs": 15},
                accounting="ours")
    return write_html_report(results, CLUSTER, path, **{**args, **kw})


@pytest.fixture(scope="module")
def page(results, tmp_path_factory):
    path = _report(results, tmp_path_factory.mktemp("report") / "report.html")
    return path, path.read_text(encoding="utf-8")


def test_csv_has_a_row_per_policy_and_job_agreeing_with_the_outcomes(results, trace, tmp_path):
    path = write_jobs_csv(results, tmp_path / "sub" / "jobs.csv")
    with path.open(newline="", encoding="utf-8") as f:
        reader = csv.DictReader(f)
        assert tuple(reader.fieldnames) == COLUMNS
        rows = list(reader)
    executed = [r for r in results if r.executed]
    assert results[2].executed is False  # the optimal curve has no jobs, so no rows
    assert len(rows) == len(trace) * len(executed)
    by_key = {(row["policy"], row["job_id"]): row for row in rows}
    assert len(by_key) == len(rows)
    for r in executed:
        for j in r.jobs:
            row = by_key[r.policy, csv_cell(j.job_id)]  # (the formula-like id carries its leading ')
            for col, value in (("arrival_s", j.arrival_s), ("placed_s", j.placed_s), ("wait_s", j.wait_s),
                               ("end_s", j.end_s), ("jct_s", j.jct_s), ("t_solo_s", j.t_solo)):
                assert float(row[col]) == pytest.approx(value, abs=1e-3), col
            assert float(row["slowdown"]) == pytest.approx(j.slowdown, abs=1e-4)
            assert float(row["e2e_slowdown"]) == pytest.approx(j.e2e_slowdown, abs=1e-4)
            assert int(row["iterations"]) == j.iterations and float(row["slo"]) == j.slo
            assert (row["slo_met"], row["outcome"], row["group_id"]) == (str(j.slo_met), j.outcome, j.group_id)
            assert row["slo_basis"] == "end-to-end" and row["reason"] == ""
    rollmux = results[0]
    assert rollmux.rejected == ["huge"]
    huge = by_key["rollmux", "huge"]
    assert huge["reason"] == rollmux.reject_reasons["huge"] and "the pool has 4" in huge["reason"]
    assert (huge["outcome"], huge["slo_met"]) == (NEVER_RAN, "False")
    assert all(huge[c] == "" for c in ("arrival_s", "wait_s", "jct_s", "slowdown", "e2e_slowdown", "group_id"))


def test_html_is_one_self_contained_file_with_png_figures(page):
    _, text = page
    assert not re.search(r"""(src|href)\s*=\s*["']?\s*(https?:)?//""", text, re.I)
    assert "<script" not in text.lower() and "<link" not in text.lower() and "url(" not in text
    images = re.findall(r'<img [^>]*src="data:image/png;base64,([^"]+)"', text)
    assert len(images) == 5  # savings, cost, GPUs per pool, queue (a pool is bounded), Gantt
    for data in images:
        png = base64.b64decode(data, validate=True)
        assert png.startswith(b"\x89PNG\r\n\x1a\n")
        assert matplotlib.image.imread(io.BytesIO(png), format="png").shape[0] > 100


def test_html_escapes_every_user_string(page):
    _, text = page
    assert HOSTILE not in text and "&lt;script&gt;x&lt;/script&gt;" in text
    assert "Report &lt;i&gt;of&lt;/i&gt; &amp; run" in text and "t&lt;b&gt;" in text
    assert "<i>" not in text and "<b>" not in text


def test_html_lists_every_job_and_why_it_never_ran(page, results):
    _, text = page
    rows = text.count('<tr class="job">')
    assert rows == sum(len(r.jobs) + len(r.rejected) for r in results if r.executed)
    for r in results[:2]:
        assert f"<summary>{r.policy}: {len(r.jobs)} jobs ran, {len(r.rejected)} never ran</summary>" in text
    assert report_html.escape(results[0].reject_reasons["huge"]) in text
    assert "optimal (not shown)" in text  # skipped, named in the summary


def test_html_labels_pools_by_their_configured_gpu_types(page):
    _, text = page
    assert "rollout (H200) bubble" in text and "train (B200) bubble" in text
    assert "4 nodes x 8 GPUs = 32 GPUs" in text
    assert not re.search(r"\bH20\b|H800", text)


def test_job_tables_are_capped(results, tmp_path, monkeypatch):
    monkeypatch.setattr(report_html, "ROW_CAP", 3)
    text = _report(results, tmp_path / "r.html").read_text(encoding="utf-8")
    assert text.count('<tr class="job">') == 6
    assert text.count("Showing the first 3 of 15 jobs") == 2


def test_an_unknown_gantt_group_is_refused_before_writing(results, tmp_path):
    path = tmp_path / "r.html"
    with pytest.raises(ReportError, match="gantt_group='g999'.*g0") as err:
        _report(results, path, gantt_group="g999")
    assert err.value.field == "gantt_group" and not path.exists()
    with pytest.raises(ReportError, match="gantt_window"):
        _report(results, path, gantt_window=(50.0, 10.0))
    with pytest.raises(ReportError, match="recorded its phases"):
        _report(results[1:], path, gantt_group="g0")


def test_gantt_of_a_chosen_group_and_window_draws_user_names_literally(results, tmp_path):
    math_job = results[0].jobs[5]
    window = (math_job.placed_s, math_job.placed_s + 3 * 3600)
    text = _report(results, tmp_path / "r.html", gantt_group=math_job.group_id,
                   gantt_window=window).read_text(encoding="utf-8")
    assert f"rollmux: group {math_job.group_id}, {window[0] / 3600:,.2f}-{window[1] / 3600:,.2f} h" in text


def test_cost_plot_dashes_policies_that_miss_slos(results, monkeypatch):
    kept = []
    monkeypatch.setattr(plots, "save", lambda fig, path: kept.append(fig) or path)
    meets = simulate(generate(6, seed=1), Cluster(), make_policy("solo-d"))
    plots.cost_over_time([results[0], meets], "unused.png", mark_slo_misses=True)
    plots.gpus_in_use([results[0]], "unused.png", {"rollout": "H200", "train": "B200"},
                      capacity={"rollout": None, "train": 32})
    try:
        missed, met = kept[0].axes[0].get_lines()
        labels = [t.get_text() for t in kept[0].axes[0].get_legend().get_texts()]
        assert missed.get_linestyle() == "--" and labels[0].endswith("(misses SLOs)")
        assert met.get_linestyle() == "-" and "misses" not in labels[1]
        rollout_ax, train_ax = kept[1].axes
        assert [ln.get_label() for ln in train_ax.get_lines()][-1] == "capacity (32 GPUs)"
        assert not any("capacity" in ln.get_label() for ln in rollout_ax.get_lines())
    finally:
        for fig in kept:
            plots.plt.close(fig)


def _browser() -> str | None:
    return next((p for p in map(shutil.which, ("chromium", "chromium-browser", "google-chrome")) if p), None)


@pytest.mark.skipif(_browser() is None, reason="no headless browser (chromium, chromium-browser or google-chrome) "
                                                "on PATH; `make install` adds chromium where apt-get can")
def test_a_headless_browser_renders_the_report(page, tmp_path):
    path, _ = page
    shot = tmp_path / "shot.png"
    subprocess.run([_browser(), "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                    f"--user-data-dir={tmp_path / 'profile'}", f"--screenshot={shot}", "--window-size=1200,2000",
                    path.resolve().as_uri()], capture_output=True, timeout=120, check=False)
    assert shot.exists(), "the browser wrote no screenshot"
    pixels = matplotlib.image.imread(shot)
    assert pixels.shape[:2] == (2000, 1200)
    colours = {tuple(p) for p in (pixels[::4, ::4, :3] * 255).astype(int).reshape(-1, 3)}
    assert len(colours) > 50, "the screenshot is (nearly) blank"


def test_html_splits_rollmux_cost_by_placement(page, results):
    """rollmux's jobs were packed and opened groups here: its row gives each kind's share,
    dollars and jobs; solo-d (one kind) gets no row."""
    _, text = page
    table = text.split("<h3>Cost by placement</h3>", 1)[1].split("</table>", 1)[0]
    split = results[0].cost_by_placement
    assert len(split) > 1
    for kind, k in split.items():
        assert f"<th>{kind}</th>" in table
        assert f"{100 * k['share']:.1f}% (${k['cost']:,.0f}, {k['jobs']} job{'s' * (k['jobs'] != 1)})" in table
    assert "<td class=\"text\">rollmux</td>" in table and "solo-d" not in table


def test_a_csv_cell_a_spreadsheet_would_run_as_a_formula_is_quoted():
    """(A job id can no longer start with = + - @; the CSV's other text cells keep the guard.)"""
    assert csv_cell(FORMULA) == "'" + FORMULA and csv_cell("-1") == "'-1" and csv_cell("gen-0001") == "gen-0001"
    assert csv_cell(1.5) == 1.5
