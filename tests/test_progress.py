"""Progress lines without a terminal: rate and ETA every few seconds, nothing for a short run."""
import io

from rich.console import Console

from rollmux.report.progress import progress_reporter


class FakeClock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def test_lines_every_few_seconds_with_rate_and_eta():
    out = io.StringIO()
    console = Console(file=out, force_terminal=False, width=200)
    clock = FakeClock()
    with progress_reporter(console, "rollmux", 160, every_s=5.0, clock=clock) as update:
        for done in range(1, 161):
            clock.t += 0.125  # 20 s in all
            update(done)
    lines = out.getvalue().splitlines()
    assert lines[0] == "rollmux: 25.0% in 5.0 s, 5.0%/s, ETA 15.0 s"
    # the last update printed 100% at 20 s; the end does not say it twice
    assert len(lines) == 4 and lines[-1] == "rollmux: 100.0% in 20.0 s"


def test_a_run_that_ends_between_lines_closes_with_one_at_100_percent():
    out = io.StringIO()
    clock = FakeClock()
    with progress_reporter(Console(file=out, force_terminal=False, width=200), "fleet plan", 4, every_s=5.0,
                           clock=clock) as update:
        for done in range(1, 4):
            clock.t += 4.0
            update(done)
        clock.t += 1.0
    assert out.getvalue().splitlines() == ["fleet plan: 50.0% in 8.0 s, 6.2%/s, ETA 8.0 s",
                                           "fleet plan: 100.0% in 13.0 s"]


def test_a_short_run_prints_nothing():
    out = io.StringIO()
    clock = FakeClock()
    with progress_reporter(Console(file=out, force_terminal=False), "solo-d", 10, clock=clock) as update:
        for done in range(10):
            clock.t += 0.01
            update(done)
    assert out.getvalue() == ""


def test_user_text_is_escaped():
    out = io.StringIO()
    clock = FakeClock()
    with progress_reporter(Console(file=out, force_terminal=False, width=200), "[bold]x", 2, every_s=1.0,
                           clock=clock) as update:
        clock.t = 2.0
        update(1)
    assert out.getvalue().startswith("[bold]x: 50.0%")


def _every_update(monkeypatch, module: str) -> None:
    """Make ``module``'s progress print on every update (``every_s=0``), as a long run
    without a terminal would every few seconds."""
    from functools import partial

    import rollmux.report.progress as progress

    monkeypatch.setattr(f"{module}.progress_reporter", partial(progress.progress_reporter, every_s=0.0))


def test_plan_improving_reports_its_solves_without_a_terminal(monkeypatch, tmp_path):
    """``rollmux plan``'s regrouping drew a Rich bar only on a terminal: in a log it said
    nothing for as long as its solves took."""
    from typer.testing import CliRunner

    from rollmux.cli import app
    from rollmux.traces.format import write_trace
    from rollmux.traces.generate import generate

    _every_update(monkeypatch, "rollmux.cli")
    trace = tmp_path / "jobs.csv"
    write_trace(generate(8, seed=3), trace)
    result = CliRunner().invoke(app, ["plan", "--jobs", str(trace), "--no-explain", "--improve-solves", "40"])
    assert result.exit_code == 0, result.output
    shares = [float(line.split()[1].rstrip("%")) for line in result.output.splitlines()
              if line.startswith("improving: ")]
    assert shares and all(0 < s <= 100 for s in shares) and shares == sorted(shares), result.output


def test_fleet_plan_reports_progress_inside_its_own_plan(monkeypatch):
    """``rollmux fleet plan``'s first step (the fleet's own plan and its regrouping, most
    of a minute on 200 jobs) now moves with each solve; it reported nothing until done."""
    from pathlib import Path

    from typer.testing import CliRunner

    from rollmux.cli import app

    _every_update(monkeypatch, "rollmux.report.progress")
    example = Path(__file__).resolve().parents[1] / "examples" / "fleet"
    result = CliRunner().invoke(app, ["fleet", "plan", "--jobs", str(example / "jobs.csv"),
                                      "--cluster", str(example / "three_types.yaml")])
    assert result.exit_code == 0, result.output
    shares = [float(line.split()[2].rstrip("%")) for line in result.output.splitlines()
              if line.startswith("fleet plan: ")]
    steps = 1 + 9  # the fleet's plan, then each of the nine fixed-type ones
    assert any(0 < s < 100 / steps for s in shares), result.output
    assert shares == sorted(shares) and shares[-1] == 100.0
