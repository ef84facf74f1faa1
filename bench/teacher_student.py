#!/usr/bin/python3
# SPDX-License-Identifier: Apache-2.0
"""A task harder than the digits for bench/compression_accuracy.py: labels from a fixed random
teacher network, learnt by a larger student through psched (one process per worker, each on
its share of the training set, sync mode), thousands of steps to learn.

    PYTHONPATH=build/python PSCHED_CONFIG=deployment.yaml RANK=0 WORLD_SIZE=2 \\
        /usr/bin/python3 bench/teacher_student.py --epochs 15

The task is the same for every seed (drawn from --task-seed): 44,000 inputs of 16 standard
normal features, 4,000 of them held out; each labelled by the argmax of a teacher 16-32-10
tanh network with N(0, 1/fan-in) weights. The student is a 16-128-128-10 ReLU network trained
with SGD and momentum 0.9 on the shards; --seed sets its initial weights and the batch order.
Trained alone in plain torch (batch 128) it reaches 0.82 held-out accuracy after one epoch of
312 steps and is still climbing at 0.88 after twelve: the formats' differences show.
Prints, like python/examples/train_digits.py, each epoch's training loss and the held-out
accuracy: "worker 0 epoch  3  loss 1.2345  test accuracy 0.678".
"""
import argparse

import torch
import torch.nn.functional as F

import psched
import psched.torch

FEATURES, HIDDEN, CLASSES = 16, 32, 10
SAMPLES, HELD_OUT = 44000, 4000


def say(line):
    print(line + "\n", end="", flush=True)  # one write a line: workers share a terminal


def task(seed):
    """(x_train, y_train, x_test, y_test) of the teacher drawn from `seed`."""
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(SAMPLES, FEATURES, generator=generator)
    first = torch.randn(FEATURES, HIDDEN, generator=generator) / FEATURES ** 0.5
    second = torch.randn(HIDDEN, CLASSES, generator=generator) / HIDDEN ** 0.5
    y = (torch.tanh(x @ first) @ second).argmax(1)
    return x[HELD_OUT:], y[HELD_OUT:], x[:HELD_OUT], y[:HELD_OUT]


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", help="deployment file (default: $PSCHED_CONFIG)")
    parser.add_argument("--epochs", type=int, default=15)
    parser.add_argument("--batch", type=int, default=64, help="samples per step and worker")
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--seed", type=int, default=0, help="initial weights and batch order")
    parser.add_argument("--task-seed", type=int, default=12345, help="the teacher and inputs")
    args = parser.parse_args()

    torch.set_num_threads(1)
    torch.manual_seed(args.seed)
    model = torch.nn.Sequential(
        torch.nn.Linear(FEATURES, 128), torch.nn.ReLU(), torch.nn.Linear(128, 128),
        torch.nn.ReLU(), torch.nn.Linear(128, CLASSES))
    model = psched.torch.DistributedModel(model, "sgd", lr=args.lr, momentum=0.9,
                                          config=args.config)
    rank, workers = model.client.worker, model.client.deployment.workers
    x_train, y_train, x_test, y_test = task(args.task_seed)
    x_mine, y_mine = x_train[rank::workers], y_train[rank::workers]
    steps = len(y_train) // workers // args.batch  # equal in every worker (sync mode)
    for epoch in range(1, args.epochs + 1):
        order = torch.randperm(len(y_mine),
                               generator=torch.Generator().manual_seed(args.seed * 1000 + epoch))
        total = 0.0
        for step in range(steps):
            batch = order[step * args.batch:(step + 1) * args.batch]
            loss = F.cross_entropy(model(x_mine[batch]), y_mine[batch])
            loss.backward()
            total += loss.item()
        with torch.no_grad():
            accuracy = (model(x_test).argmax(1) == y_test).float().mean().item()
        say(f"worker {rank} epoch {epoch:2d}  loss {total / steps:.4f}  "
            f"test accuracy {accuracy:.3f}")
    model.client.close()


if __name__ == "__main__":
    main()
