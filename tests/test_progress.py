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
