"""bench/suite_durations.py: a JUnit XML read into per-tier, per-file and slowest tables."""

import importlib.util
import os

from conftest import REPO

_spec = importlib.util.spec_from_file_location(
    "suite_durations", os.path.join(REPO, "bench", "suite_durations.py"))
sd = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(sd)

XML = """<?xml version="1.0" encoding="utf-8"?><testsuites><testsuite name="pytest">
<testcase classname="tests.test_a" name="test_one" time="30.0"/>
<testcase classname="tests.test_a" name="test_two[x]" time="10.0"><skipped/></testcase>
<testcase classname="tests.test_b.TestC" name="test_three" time="60.0"><failure/></testcase>
</testsuite></testsuites>"""


def test_rows_tiers_and_tables(tmp_path):
    path = tmp_path / "run.xml"
    path.write_text(XML)
    rows = sd.read_rows(str(path), {"tests/test_b.py::TestC::test_three": "e2e"})
    assert rows == [(30.0, "tests/test_a.py::test_one", "unit", "passed"),
                    (10.0, "tests/test_a.py::test_two[x]", "unit", "skipped"),
                    (60.0, "tests/test_b.py::TestC::test_three", "e2e", "failed")]
    lines = sd.report(rows, slowest=2).splitlines()
    assert lines[0] == "3 tests (1 failed, 1 passed, 1 skipped): 100 s summed over the workers"
    assert "| e2e | 1 | 60 | 60.0% |" in lines and "| unit | 2 | 40 | 40.0% |" in lines
    assert "| tests/test_b.py | 1 | 60 | 60.0% |" in lines
    assert lines[-2:] == ["| `tests/test_b.py::TestC::test_three` | e2e | 60.0 |",
                          "| `tests/test_a.py::test_one` | unit | 30.0 |"]
