"""RollMux's errors pickle as raised: one raised in a Ray task or a Serve replica reaches
its caller as itself (a ``SpecError`` from the reward service's replica arrived as Ray's
``UnserializableException``: its ``__init__`` takes four arguments, not the message)."""
from __future__ import annotations

import inspect
import pickle

import pytest

from rollmux import errors
from rollmux.errors import CapacityError, OutputPathError, RollMuxError, SpecError, TraceFormatError

CASES = [SpecError("slo", 0.5, "a number >= 1", "job a"), TraceFormatError("t.csv", 3, "slo", "not a number"),
         CapacityError("rollmux", ("train",), "no job placed", "a: no nodes"),
         OutputPathError("--json", "/proc/x", "not writable"), RollMuxError("plain")]


@pytest.mark.parametrize("err", CASES, ids=lambda e: type(e).__name__)
def test_an_error_pickles_as_raised(err):
    back = pickle.loads(pickle.dumps(err))
    assert type(back) is type(err) and str(back) == str(err) and back.__dict__ == err.__dict__


def test_every_error_class_of_the_module_is_covered_by_the_base():
    classes = [c for _, c in inspect.getmembers(errors, inspect.isclass) if issubclass(c, Exception)]
    assert all(issubclass(c, RollMuxError) for c in classes), classes
