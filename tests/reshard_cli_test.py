#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""`psched reshard`'s and `psched import`'s command lines refusing what they cannot act on: each case exits 2 with one
line on stderr naming what is wrong, and writes nothing (neither the new directory nor its
partial one). What reshard() itself refuses in a checkpoint set is actors/shard/reshard_test.cc's;
these are the arguments: no destination, no shard count, --shards 0, a folder of no checkpoint,
a --to-config without a checkpoint directory or of another shard count or split_bytes, and
--accept-log-loss with nothing to replay under; for import the same placement arguments and a
folder that is no export (what import_model() refuses in an export is
actors/shard/model_import_test.cc's).
Usage: reshard_cli_test.py BUILD_DIR
Standard library only."""
import pathlib
import subprocess
import sys
import tempfile

from process_checks import check

DEPLOYMENT = """mode: sync
workers: 2
shards:
  - listen: 127.0.0.1:7410
  - listen: 127.0.0.1:7411
{more}"""


def refused(psched, tool, source, new, cases):
    """`psched TOOL --from SOURCE ARGUMENTS...` for each case: exit 2, one line on stderr that is
    the case's, and neither `new` nor its partial directory written."""
    for arguments, expected in cases:
        result = subprocess.run([psched, tool, "--from", source, *arguments],
                                capture_output=True, text=True, timeout=30)
        what = f"{tool} " + (" ".join(str(a) for a in arguments) or "(no destination)")
        check(result.returncode == 2 and result.stderr == f"psched {expected}\n",
              f"{what}: exit {result.returncode}, stderr {result.stderr!r}; expected exit 2, "
              f"{expected!r}")
        partial = new.with_name(f"{new.name}.{tool}-partial")
        check(not new.exists() and not partial.exists(), f"{what}: wrote {new}")
        print(f"refused {what}: {result.stderr.strip()}")


def main():
    psched = pathlib.Path(sys.argv[1]) / "apps" / "psched"
    with tempfile.TemporaryDirectory() as folder:
        folder = pathlib.Path(folder)
        empty = folder / "empty"
        empty.mkdir()
        (empty / "notes.txt").write_text("not a checkpoint\n")
        new = folder / "new"
        bare = folder / "bare.yaml"
        bare.write_text(DEPLOYMENT.format(more=""))
        grown = folder / "grown.yaml"
        grown.write_text(DEPLOYMENT.format(
            more=f"split_bytes: 1KiB\ncheckpoint: {{directory: {new}}}\n"))
        cases = [
            ([], "reshard: give the new shards' checkpoint directory (--to DIR) or their "
                 "deployment file (--to-config FILE), one of them"),
            (["--to", new], "reshard: give the new number of shards (--shards M) or the new "
                            "deployment file (--to-config FILE)"),
            (["--to", new, "--shards", "0"],
             "reshard: --shards 0: a job runs on 1 to 4096 shards"),
            (["--to", new, "--shards", "3"],
             f"reshard: {empty} holds no shard checkpoint (no shard-<id>.<generation>.ckpt file): "
             "name the job's checkpoint directory"),
            (["--to-config", bare], f"reshard: --to-config {bare} has no checkpoint.directory for "
                                    "the new shards to start from"),
            (["--to-config", grown, "--shards", "3"],
             f"reshard: --shards 3, but --to-config {grown} names 2 shards"),
            (["--to-config", grown, "--split-bytes", "2048"],
             f"reshard: --split-bytes 2048, but --to-config {grown} has split_bytes 1024"),
            (["--to", new, "--shards", "3", "--accept-log-loss"],
             "reshard: --accept-log-loss without --from-config: the logs are replayed under the "
             "deployment file the job ran with"),
        ]
        refused(psched, "reshard", empty, new, cases)
        # psched import: the same placement arguments, and a folder that is no export.
        cases = [
            ([], "import: give the new shards' checkpoint directory (--to DIR) or their "
                 "deployment file (--to-config FILE), one of them"),
            (["--to", new], "import: give the new number of shards (--shards M) or the new "
                            "deployment file (--to-config FILE)"),
            (["--to", new, "--shards", "0"], "import: --shards 0: a job runs on 1 to 4096 shards"),
            (["--to", new, "--shards", "3"],
             f"import: {empty} has no manifest.json: name a folder psched export wrote"),
            (["--to-config", grown, "--shards", "3"],
             f"import: --shards 3, but --to-config {grown} names 2 shards"),
        ]
        refused(psched, "import", empty, new, cases)
    return 0


if __name__ == "__main__":
    sys.exit(main())
