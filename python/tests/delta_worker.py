# SPDX-License-Identifier: Apache-2.0
"""One worker of test_delta_pulls.py's process test: trains a variable whose values come back
as deltas (the deployment's compression: pull: topk), from Client.start_step to --steps with
gradients fixed by (worker, step), then --drain steps of zero gradients, during which what the
shard still owes the copy goes out. Prints each step it finished. Finally writes, to --out
(.npy), the copy the deltas left and the shard's values pulled whole after it."""
import argparse
import os
import time

import numpy as np

import psched

N = 6000  # float32: 24,000 bytes, over both shards, 1 KiB partitions


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--config", required=True)
    parser.add_argument("--worker", type=int, required=True)
    parser.add_argument("--steps", type=int, required=True)
    parser.add_argument("--drain", type=int, required=True)
    parser.add_argument("--sleep", type=float, default=0.0, help="seconds after each step")
    parser.add_argument("--hold", help="after its first step, wait until this file exists")
    parser.add_argument("--pause", nargs=2, metavar=("STEP", "FILE"),
                        help="after step STEP, wait until FILE exists")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    with psched.connect(args.config, args.worker) as client:
        w = np.zeros(N, dtype=np.float32)
        client.register("w", w)
        client.pull("w", after=client.start_step - 1)  # a restarted worker: the job's values
        print(f"worker {args.worker} starts at step {client.start_step}", flush=True)
        for step in range(client.start_step, args.steps + args.drain + 1):
            if step <= args.steps:
                rng = np.random.default_rng(1000 * step + args.worker)
                gradient = (rng.standard_normal(N) * rng.random(N) ** 4).astype(np.float32)
            else:
                gradient = np.zeros(N, dtype=np.float32)
            client.push("w", step, gradient)
            client.wait("w", step)
            print(f"worker {args.worker} step {step}", flush=True)
            time.sleep(args.sleep)
            while args.hold and not os.path.exists(args.hold):
                time.sleep(0.01)
            while args.pause and step == int(args.pause[0]) and not os.path.exists(args.pause[1]):
                time.sleep(0.01)
        copy = w.copy()
        client.pull("w")
        np.save(args.out, np.stack([copy, w]))


if __name__ == "__main__":
    main()
