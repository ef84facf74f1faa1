#!/usr/bin/python3
# SPDX-License-Identifier: Apache-2.0
"""Says what a ctest run did not prove: every test that did not run, with the reason it
printed, read from ctest's JUnit file (ctest --output-junit).

    scripts/test_summary.py build/Testing/ctest-junit.xml [--strict]

--strict (scripts/test under CI=true or --strict): a test that did not run fails the run unless
the machine, not its packages, is why: no GPU (gpu_test), or not root (network namespaces, tc,
slurmd). Everything else a skipped test needs, scripts/setup installs.
"""
import argparse
import re
import sys
import xml.etree.ElementTree as ElementTree

# Reasons a test may give for not running that no package fixes.
MACHINE_REASONS = re.compile(r"no GPU|not root|needs root")


def not_run(junit):
    """(name, reason) of each test the file says did not run."""
    for case in ElementTree.parse(junit).getroot().iter("testcase"):
        if case.get("status") == "run":
            continue
        output = (case.findtext("system-out") or "").strip()
        lines = [line for line in output.splitlines() if "skip" in line.lower()] or \
            output.splitlines()[-1:] or ["(it printed nothing)"]
        yield case.get("name"), lines[0].strip()


def main(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("junit")
    parser.add_argument("--strict", action="store_true")
    args = parser.parse_args(argv)
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
