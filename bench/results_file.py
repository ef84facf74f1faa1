# SPDX-License-Identifier: Apache-2.0
"""How the benchmarks write their results for bench/results/: one JSON document, indented one
space a level, ending with a newline."""
import json


def write_json(path, result):
    with open(path, "w") as out:
        json.dump(result, out, indent=1)
        out.write("\n")
