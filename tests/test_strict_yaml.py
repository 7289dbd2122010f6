"""rollmux.strict_yaml: what a configuration file says, refused where it cannot mean one thing,
and written back so that it reads the same."""
from __future__ import annotations

import pytest
import yaml

from rollmux import strict_yaml
from rollmux.errors import SpecError
from rollmux.runtime.auth import load_tenants

#: strings that StrictLoader (YAML 1.2 style) or PyYAML's YAML 1.1 reader would read as a
#: number, boolean, null, date or merge key if written plain
LOOKALIKES = ["1e3", "1E5", "1e+3", "-1e-3", "5.28e0", "010", "+1", "1.5", "yes", "No", "on", "off", "true",
              "FALSE", "null", "Null", "~", "", "0x10", "0o10", "1_000", "1:30", ".inf", "-.INF", ".nan",
              "2024-01-01", "<<", "plain", "a b"]


def test_dump_quotes_every_string_a_reader_would_take_for_another_type():
    """``rollmux profile --job-id 1e3`` wrote ``job_id: 1e3``, which StrictLoader reads as a float."""
    data = {"job_id": "1e3", "values": LOOKALIKES, "keys": {s: i for i, s in enumerate(LOOKALIKES)},
            "typed": [1, -2, 1.5, 1e20, 0.001, True, False, None]}
    text = strict_yaml.dump(data)
    assert "job_id: '1e3'" in text
    assert strict_yaml.load(text) == data
    assert yaml.safe_load(text) == data  # (a YAML 1.1 reader too)


@pytest.mark.parametrize("text, line", [
    ("? [a, b]\n: 1\n", 1),
    ("x: 1\ny: {{a: 1}: 2}\n", 2),
    ("tenants:\n  ? [a]\n  : {}\n", 2),
])
def test_a_sequence_or_mapping_as_a_key_is_a_yaml_error_with_its_line(text, line):
    """(the duplicate-key check hashed the key first: a bare TypeError came out)"""
    with pytest.raises(yaml.YAMLError) as err:
        strict_yaml.load(text)
    assert err.value.problem_mark.line + 1 == line and "unhashable key" in err.value.problem


@pytest.mark.parametrize("text, line", [
    ("rollout: {<<: {host_mem_gb: 100.0}}\n", 1),
    ("base: {a: 1}\nrollout:\n  <<: {a: 2}\n  b: 3\n", 3),
])
def test_a_merge_key_is_refused_with_its_line(text, line):
    """(the error read "could not determine a constructor for the tag merge")"""
    with pytest.raises(yaml.YAMLError) as err:
        strict_yaml.load(text)
    assert err.value.problem_mark.line + 1 == line
    assert "YAML merge keys (<<) are not supported" in err.value.problem
    assert strict_yaml.load("'<<': 1\n") == {"<<": 1}  # a quoted << is a plain key


def test_a_tenants_file_with_an_unhashable_key_is_a_spec_error_naming_the_file_and_line(tmp_path):
    path = tmp_path / "tenants.yaml"
    path.write_text("tenants:\n  ? [a]\n  : {}\n")
    with pytest.raises(SpecError) as err:
        load_tenants(path)
    assert err.value.field == "--tenants" and "line 2" in str(err.value) and "unhashable key" in str(err.value)
