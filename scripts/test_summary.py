#!/usr/bin/python3
# SPDX-License-Identifier: Apache-2.0
"""Says what a ctest run did not prove: every test that did not run, with the reason it
printed, and every test that ran but printed that it skipped a part (a line with "skipped:"),
read from ctest's JUnit file (ctest --output-junit).

    scripts/test_summary.py build/Testing/ctest-junit.xml [--strict]

--strict (scripts/test under CI=true or --strict): a test that did not run fails the run unless
the machine, not its packages, is why: no GPU (gpu_test), or not root (network namespaces, tc,
slurmd). Everything else a registered test needs, scripts/setup's default profile installs,
and scripts/test runs it first. (Checks that need more than packages, such as the images of
scripts/container, are commands of their own, not registered tests.)
"""
import argparse
import re
import sys
import xml.etree.ElementTree as ElementTree

# Reasons a test may give for not running that no package fixes.
MACHINE_REASONS = re.compile(r"no GPU|not root|needs root")


def skip_lines(case):
    output = (case.findtext("system-out") or "").strip()
    return [line.strip() for line in output.splitlines() if "skipped:" in line]


def not_run(junit):
    """(name, reason) of each test the file says did not run (a failed test ran: ctest
    reports it)."""
    for case in ElementTree.parse(junit).getroot().iter("testcase"):
        if case.get("status") in ("notrun", "disabled"):
            output = (case.findtext("system-out") or "").strip()
            reason = (skip_lines(case) or output.splitlines()[-1:] or ["(it printed nothing)"])
            yield case.get("name"), reason[0]


def partly_run(junit):
    """(name, what it skipped) of each test that ran and printed that it skipped a part."""
    for case in ElementTree.parse(junit).getroot().iter("testcase"):
        if case.get("status") == "run" and skip_lines(case):
            yield case.get("name"), skip_lines(case)[0]


def main(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("junit")
    parser.add_argument("--strict", action="store_true")
    args = parser.parse_args(argv)
    for name, part in partly_run(args.junit):
        print(f"{name} ran, but {part}")
    skipped = list(not_run(args.junit))
    if not skipped:
        print("every registered test ran")
        return 0
    print(f"{len(skipped)} test(s) did not run:")
    refused = []
    for name, reason in skipped:
        allowed = MACHINE_REASONS.search(reason) is not None
        print(f"  {name}: {reason}")
        if args.strict and not allowed:
            refused.append(name)
    if refused:
        print(f"strict: {', '.join(refused)} did not run for want of something scripts/setup "
              "installs: failing the run")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
