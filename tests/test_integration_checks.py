"""The recorded-phase checks (rollmux.integrations.checks) on incomplete and malformed input."""
from __future__ import annotations

import pytest

from rollmux.errors import SpecError
from rollmux.integrations.checks import history_spans, phase_checks, phases_wall, span_report

HISTORY = [("rollout", ("R0",), 1, 0.0, 1.0), ("train", ("T0",), 2, 1.0, 3.0),
           ("rollout", ("R0",), 3, 3.0, 4.0), ("train", ("T0",), 4, 4.0, 5.0)]


def test_a_complete_history_reports_both_phases():
    spans = history_spans(HISTORY)
    assert [s["iteration"] for s in spans] == [0, 0, 1, 1] and spans[0]["nodes"] == ["R0"]
    report = span_report(spans)
    assert (report["mean_rollout_s"], report["mean_train_s"]) == (1.0, 1.5)
    assert report["phase_spans"][1] == {"node": "T0", "pool": "train", "iteration": 0, "start": 1.0, "end": 3.0}
    assert phases_wall({"a": spans}) == 5.0 and phase_checks({"a": spans}, {"a": 2})["ok"]


def test_a_job_that_failed_before_training_reports_no_train_time():
    """A job with only a rollout span raised StatisticsError from span_report."""
    spans = history_spans([("rollout", ["R0"], 1, 0.0, 1.0)])
    report = span_report(spans)
    assert (report["mean_rollout_s"], report["mean_train_s"]) == (1.0, None)
    assert span_report([]) == {"mean_rollout_s": None, "mean_train_s": None, "phase_spans": []}
    assert phase_checks({"a": spans}, {"a": 1})["alternates"] == {"a": False}


def test_no_phase_at_all_is_a_wall_of_zero():
    """phases_wall({}) and phases_wall({"a": []}) raised ValueError from max()."""
    assert phases_wall({}) == 0.0 and phases_wall({"a": []}) == 0.0
    assert phase_checks({"a": []}, {"a": 0}) == {"alternates": {"a": True}, "overlaps": [], "ok": True}


@pytest.mark.parametrize("history, field", [
    (None, "history"),
    ([("rollout", ("R0",), 1, 0.0)], "history[0]"),                  # 4-tuple
    (["rollout"], "history[0]"),
    ([("rollout", "R0", 1, 0.0, 1.0)], "history[0].nodes"),          # was split into ['R', '0']
    ([("rollout", None, 1, 0.0, 1.0)], "history[0].nodes"),
    ([("rollout", (), 1, 0.0, 1.0)], "history[0].nodes"),
    ([("rollout", ("R0", 7), 1, 0.0, 1.0)], "history[0].nodes"),
    ([("reward", ("R0",), 1, 0.0, 1.0)], "history[0].pool"),
    ([("rollout", ("R0",), 1, "0", 1.0)], "history[0].start"),
    ([("rollout", ("R0",), 1, 0.0, float("nan"))], "history[0].end"),
    ([("rollout", ("R0",), 1, 0.0, 10 ** 400)], "history[0].end"),
    ([("rollout", ("R0",), 1, True, 1.0)], "history[0].start"),
    (HISTORY[:1] + [("train", ("T0",), 2, 3.0, 2.0)], "history[1].end"),  # ends before it starts
])
def test_a_malformed_history_is_refused_naming_the_field(history, field):
    with pytest.raises(SpecError) as info:
        history_spans(history)
    assert info.value.field == field, str(info.value)


def test_malformed_spans_and_counts_are_refused_naming_the_field():
    spans = history_spans(HISTORY)
    backwards = [{"pool": "rollout", "nodes": ["R0"], "start": 2.0, "end": 1.0}]
    cases = [
        (lambda: phase_checks({"a": spans}, {}), "iterations['a']"),                # was KeyError
        (lambda: phase_checks({"a": spans}, {"a": "2"}), "iterations['a']"),
        (lambda: phase_checks({"a": spans}, None), "iterations"),
        (lambda: phase_checks({"a": backwards}, {"a": 1}), "spans_by_job['a'][0].end"),  # was "ok"
        (lambda: phase_checks(None, {}), "spans_by_job"),
        (lambda: phases_wall({"a": None}), "spans_by_job['a']"),
        (lambda: phases_wall({"a": [None]}), "spans_by_job['a'][0]"),
        (lambda: span_report([{k: v for k, v in spans[0].items() if k != "iteration"}]), "spans[0].iteration"),
        (lambda: span_report([{**spans[0], "nodes": None}]), "spans[0].nodes"),
        (lambda: span_report(None), "spans"),
    ]
    for call, field in cases:
        with pytest.raises(SpecError) as info:
            call()
        assert info.value.field == field, str(info.value)
