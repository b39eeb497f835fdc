"""Where a test run's time goes: per tier, per file and the slowest tests, from the JUnit
XML of a run (`python -m pytest ... --junitxml=run.xml`); docs/testing.md quotes it.

    python bench/suite_durations.py run.xml [--slowest 40]

A test's time is its setup, call and teardown (pytest's JUnit default), so a shared
fixture counts in the first test that uses it. Times are summed over the xdist workers:
with `-n 2` the wall time is about half the sum. The tiers are read from the markers
(tests/conftest.py) by collecting the suite once more (no test runs).
"""

import argparse
import collections
import os
import subprocess
import sys
import xml.etree.ElementTree as ET

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# Checked in this order: a test in several tiers counts in the first.
TIERS = (("e2e", "e2e"), ("subprocess", "subprocess and not e2e"),
         ("slow", "slow and not (subprocess or e2e)"))


def collected(expression):
    done = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p",
                           "no:cacheprovider", "-m", expression, "tests"], cwd=REPO,
                          capture_output=True, text=True)
    return {line.strip() for line in done.stdout.splitlines() if "::" in line}


def node_id(case):
    """pytest's node id of a JUnit test case (classname tests.test_x or tests.test_x.TestY)."""
    parts = case.get("classname").split(".")
    if len(parts) > 2 and parts[-1].startswith("Test"):
        return "/".join(parts[:-1]) + f".py::{parts[-1]}::{case.get('name')}"
    return "/".join(parts) + f".py::{case.get('name')}"


def read_rows(junit_xml, tier_of):
    """[(seconds, node id, tier, outcome)] of every test case of a JUnit XML."""
    rows = []
    for case in ET.parse(junit_xml).getroot().iter("testcase"):
        nid = node_id(case)
        outcome = ("skipped" if case.find("skipped") is not None else
                   "failed" if case.find("failure") is not None or
                   case.find("error") is not None else "passed")
        rows.append((float(case.get("time", 0)), nid, tier_of.get(nid, "unit"), outcome))
    return rows


def report(rows, slowest=40):
    """The summary line and the per-tier, per-file and slowest-test tables (Markdown)."""
    total = sum(r[0] for r in rows) or 1.0
    counts = collections.Counter(r[3] for r in rows)
    out = [f"{len(rows)} tests ({', '.join(f'{n} {k}' for k, n in sorted(counts.items()))}): "
           f"{sum(r[0] for r in rows):.0f} s summed over the workers"]
    for title, key in (("tier", lambda r: r[2]), ("file", lambda r: r[1].split("::")[0])):
        groups = collections.defaultdict(lambda: [0.0, 0])
        for r in rows:
            groups[key(r)][0] += r[0]
            groups[key(r)][1] += 1
        out += ["", f"| {title} | tests | seconds (summed) | share |", "|---|---:|---:|---:|"]
        out += [f"| {name} | {n} | {seconds:.0f} | {100 * seconds / total:.1f}% |"
                for name, (seconds, n) in sorted(groups.items(), key=lambda kv: -kv[1][0])]
    out += ["", "| slowest | tier | seconds |", "|---|---|---:|"]
    out += [f"| `{nid}` | {tier} | {seconds:.1f} |"
            for seconds, nid, tier, _ in sorted(rows, reverse=True)[:slowest]]
    return "\n".join(out)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("junit_xml")
    parser.add_argument("--slowest", type=int, default=40)
    args = parser.parse_args()
    tier_of = {}
    for tier, expression in TIERS:
        for nid in collected(expression):
            tier_of.setdefault(nid, tier)
    print(report(read_rows(args.junit_xml, tier_of), args.slowest))


if __name__ == "__main__":
    main()
