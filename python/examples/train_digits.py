# SPDX-License-Identifier: Apache-2.0
"""Trains a small network on scikit-learn's bundled digits (8x8 images, 10 classes) through
psched: one process per worker, each on its share of the training set; the shards run Adam.

    scripts/example-torch       # builds, starts the shards, runs two workers (sync mode)

or by hand, with a psched-server running on the deployment, once per worker:
    PYTHONPATH=build/python PSCHED_CONFIG=configs/sync.yaml RANK=0 WORLD_SIZE=2 \\
        /usr/bin/python3 python/examples/train_digits.py

Prints the training loss and the held-out accuracy after each epoch.
"""
import argparse

import torch
import torch.nn.functional as F
from sklearn.datasets import load_digits

import psched
import psched.torch


def say(line):
    """One write(2) per line (print writes the newline apart when stdout is unbuffered), so
    two workers' lines on one terminal never run together."""
    print(line + "\n", end="", flush=True)


def split_digits(seed=0, test_fraction=0.2):
    """(x_train, y_train, x_test, y_test): the digits, pixels scaled to [0, 1], split at
    random (the same split in every worker)."""
    images, labels = load_digits(return_X_y=True)
    x = torch.tensor(images, dtype=torch.float32) / 16
    y = torch.tensor(labels)
    order = torch.randperm(len(y), generator=torch.Generator().manual_seed(seed))
    test = int(len(y) * test_fraction)
    return x[order[test:]], y[order[test:]], x[order[:test]], y[order[:test]]


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", help="deployment file (default: $PSCHED_CONFIG)")
    parser.add_argument("--epochs", type=int, default=15)
    parser.add_argument("--batch", type=int, default=32, help="samples per step and worker")
    parser.add_argument("--optimizer", choices=("adam", "momentum"), default="adam",
                        help="on the shards: adam, or SGD with momentum 0.9")
    parser.add_argument("--lr", type=float, help="default: 3e-3 for adam, 0.05 for momentum")
    parser.add_argument("--seed", type=int, default=0, help="initial weights and batch order")
    args = parser.parse_args()

    torch.set_num_threads(1)  # small model; leave the cores to the other workers and shards
    torch.manual_seed(args.seed)
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 10))
    if args.optimizer == "adam":
        model = psched.torch.DistributedModel(model, "adam", lr=args.lr or 3e-3,
                                              config=args.config)
    else:
        model = psched.torch.DistributedModel(model, "sgd", lr=args.lr or 0.05, momentum=0.9,
                                              config=args.config)
    rank, workers = model.client.worker, model.client.deployment.workers

    x_train, y_train, x_test, y_test = split_digits()
    x_mine, y_mine = x_train[rank::workers], y_train[rank::workers]
    steps = len(y_train) // workers // args.batch  # equal in every worker (sync mode needs it)
    say(f"worker {rank}/{workers}: {len(y_mine)} training samples, {steps} steps per epoch, "
        f"{model.client.deployment.mode} mode")
    # Step s of the job (1, 2, ...) is batch (s - 1) % steps of epoch (s - 1) // steps + 1. A
    # worker restarted while the job runs joins at the job's step and skips what was done.
    done = model.start_step - 1
    if done:
        say(f"worker {rank} joins the job at step {done + 1} (epoch {done // steps + 1})")
    for epoch in range(done // steps + 1, args.epochs + 1):
        shuffle = torch.Generator().manual_seed(args.seed * 1000 + epoch)
        order = torch.randperm(len(y_mine), generator=shuffle)
        first = done - (epoch - 1) * steps if epoch == done // steps + 1 else 0
        total = 0.0
        for step in range(first, steps):
            batch = order[step * args.batch:(step + 1) * args.batch]
            loss = F.cross_entropy(model(x_mine[batch]), y_mine[batch])
            loss.backward()  # pushes the gradients; the next forward waits for fresh values
            total += loss.item()
        with torch.no_grad():
            accuracy = (model(x_test).argmax(1) == y_test).float().mean().item()
        say(f"worker {rank} epoch {epoch:2d}  loss {total / (steps - first):.4f}  "
            f"test accuracy {accuracy:.3f}")
    model.client.close()


if __name__ == "__main__":
    try:
        main()
    except psched.Error as error:
        raise SystemExit(f"train_digits: {error} ({error.code})")
