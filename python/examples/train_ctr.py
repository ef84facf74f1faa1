# SPDX-License-Identifier: Apache-2.0
"""Trains a DLRM-like click model on a synthetic click log through psched: the embedding tables
live on the shards row by row (psched.torch.EmbeddingBag, Adagrad), the MLPs are trained there
too (Adam); one process per worker, each on its share of every batch. Each step prefetches the
next step's rows between its forward and its backward (DistributedModel.prefetch), so they
travel while this step's gradients are computed and pushed.

    scripts/example-ctr         # builds, starts the shards, runs two workers (sync mode)

or by hand, with a psched-server running on the deployment, once per worker:
    PYTHONPATH=build/python PSCHED_CONFIG=configs/sync.yaml RANK=0 WORLD_SIZE=2 \\
        /usr/bin/python3 python/examples/train_ctr.py

and, once the shards have stopped and `psched export` wrote their model to a folder, that model
evaluated in plain torch with no shard running (what scripts/example-ctr ends with):
    PYTHONPATH=build/python /usr/bin/python3 python/examples/train_ctr.py --evaluate-export DIR

or without psched, in one process with plain torch (torch.nn.EmbeddingBag(sparse=True) and
torch.optim.Adagrad for the tables, torch.optim.Adam for the rest), the same run's reference:
    /usr/bin/python3 python/examples/train_ctr.py --local

The model and the data are python/examples/ctr_model.py's: K tables of Zipf-distributed ids,
labels drawn from a hidden random teacher, a held-out test set of the same law. Prints the test
set's logloss and AUC before training, every --eval-every steps and at the end, one
whole line per print. --check: exit status 1 unless the last evaluation's logloss is below the
first's and its AUC above it.
"""
import argparse
import sys

import torch

from ctr_model import ClickLog, ClickModel, logloss_and_auc, psched_bags, torch_bags


def say(line):
    """One write(2) per line (print writes the newline apart when stdout is unbuffered), so
    two workers' lines never interleave."""
    print(line + "\n", end="", flush=True)


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", help="deployment file (default: $PSCHED_CONFIG)")
    parser.add_argument("--local", action="store_true",
                        help="plain torch in this process, no psched (the reference)")
    parser.add_argument("--epochs", type=int, default=1,
                        help="passes over the training set (click logs: one; a second overfits)")
    parser.add_argument("--steps", type=int, help="stop after this many steps (default: all "
                        "epochs)")
    parser.add_argument("--batch", type=int, default=256,
                        help="samples per step, all workers together (each trains on its share)")
    parser.add_argument("--tables", type=int, default=4, help="categorical features")
    parser.add_argument("--rows", type=int, default=5000, help="ids per table")
    parser.add_argument("--dim", type=int, default=16, help="embedding width")
    parser.add_argument("--ids-per-bag", type=int, default=4)
    parser.add_argument("--train", type=int, default=65536, help="training samples")
    parser.add_argument("--test", type=int, default=8192, help="held-out samples")
    parser.add_argument("--lr", type=float, default=1e-3, help="Adam's, for the MLPs")
    parser.add_argument("--row-lr", type=float, default=0.05, help="Adagrad's, for the rows")
    parser.add_argument("--eval-every", type=int, default=32, help="steps between evaluations")
    parser.add_argument("--seed", type=int, default=0, help="data, teacher, weights, order")
    parser.add_argument("--check", action="store_true", help="fail unless the model learned")
    parser.add_argument("--evaluate-export", metavar="FOLDER",
                        help="evaluate the model `psched export` wrote to FOLDER with plain torch "
                        "(psched.torch.to_local) on the held-out set, and stop; give the "
                        "training's --tables, --rows, --dim, --ids-per-bag, --test and --seed")
    return parser.parse_args()


def evaluate_export(args):
    """The exported model, a plain torch module (psched.torch.to_local), on the held-out set."""
    import psched.export
    import psched.torch
    folder = psched.export.load(args.evaluate_export)
    model = psched.torch.to_local(
        ClickModel(args.tables, args.dim, psched_bags(args.rows, args.dim, args.row_lr)), folder)
    log = ClickLog(args.tables, args.rows, args.ids_per_bag, args.seed)
    x_test, ids_test, y_test = log.sample(args.test, torch.Generator().manual_seed(
        args.seed * 1000 + 2))
    with torch.no_grad():
        logloss, auc = logloss_and_auc(model(x_test, ids_test), y_test)
    say(f"exported model, plain torch: step {folder.step:4d}  test logloss {logloss:.4f}  auc "
        f"{auc:.4f}")
    return 0


def main():
    args = parse_args()
    torch.set_num_threads(1)  # small model; leave the cores to the other workers and shards
    torch.manual_seed(args.seed)
    if args.evaluate_export:
        return evaluate_export(args)
    if args.local:
        model = ClickModel(args.tables, args.dim, torch_bags(args.rows, args.dim))
        row_optimizer = torch.optim.Adagrad(model.bags.parameters(), lr=args.row_lr)
        dense = [p for name, p in model.named_parameters() if not name.startswith("bags.")]
        dense_optimizer = torch.optim.Adam(dense, lr=args.lr)
        rank, workers, name, start = 0, 1, "local", 0
    else:
        import psched.torch
        model = ClickModel(args.tables, args.dim, psched_bags(args.rows, args.dim, args.row_lr))
        model = psched.torch.DistributedModel(model, "adam", lr=args.lr, config=args.config)
        rank, workers = model.client.worker, model.client.deployment.workers
        name, start = f"worker {rank}", model.start_step - 1  # a rejoining worker skips ahead

    log = ClickLog(args.tables, args.rows, args.ids_per_bag, args.seed)
    x_train, ids_train, y_train = log.sample(args.train, torch.Generator().manual_seed(
        args.seed * 1000 + 1))
    x_test, ids_test, y_test = log.sample(args.test, torch.Generator().manual_seed(
        args.seed * 1000 + 2))
    if args.batch % workers:
        raise SystemExit(f"train_ctr: --batch {args.batch} is not a multiple of {workers} "
                         "workers")
    steps_per_epoch = args.train // args.batch
    total = args.steps or args.epochs * steps_per_epoch
    say(f"{name}: {args.tables} tables of {args.rows} rows x {args.dim}, {args.ids_per_bag} "
        f"ids a bag; {args.batch // workers} of {args.batch} samples a step, {total} steps, "
        f"{args.test} held out (click rate {y_test.mean().item():.3f})")

    evaluations = []

    def evaluate(step, train_loss):
        with torch.no_grad():
            logloss, auc = logloss_and_auc(model(x_test, ids_test), y_test)
        evaluations.append((logloss, auc))
        train = f"  train loss {train_loss:.4f}" if train_loss is not None else ""
        say(f"{name} step {step:4d} epoch {step / steps_per_epoch:4.2f}{train}  test logloss "
            f"{logloss:.4f}  auc {auc:.4f}")

    evaluate(start, None)
    orders = {}

    def order_of(step):
        """Step `step`'s samples, all workers' (each epoch's order the same in every worker)."""
        epoch, i = divmod(step, steps_per_epoch)
        if epoch not in orders:
            orders.clear()
            orders[epoch] = torch.randperm(
                args.train, generator=torch.Generator().manual_seed(args.seed + epoch))
        return orders[epoch][i * args.batch:(i + 1) * args.batch]

    losses = []
    for step in range(start, total):
        mine = order_of(step)[rank::workers]
        loss = torch.nn.functional.binary_cross_entropy_with_logits(
            model(x_train[mine], ids_train[:, mine]), y_train[mine])
        if not args.local and step + 1 < total:  # the next step's rows travel under backward
            following = order_of(step + 1)[rank::workers]
            model.prefetch(dict(zip(model.module.bags, ids_train[:, following])))
        loss.backward()  # psched: pushes the rows' and the MLPs' gradients
        if args.local:
            row_optimizer.step()
            dense_optimizer.step()
            model.zero_grad(set_to_none=True)
        losses.append(loss.item())
        if (step + 1) % args.eval_every == 0 or step + 1 == total:
            evaluate(step + 1, sum(losses) / len(losses))
            losses = []
    if not args.local:
        model.client.close()

    (first_loss, first_auc), (last_loss, last_auc) = evaluations[0], evaluations[-1]
    if args.check and not (last_loss < first_loss and last_auc > first_auc):
        say(f"{name}: check failed: test logloss {first_loss:.4f} -> {last_loss:.4f}, auc "
            f"{first_auc:.4f} -> {last_auc:.4f} (the logloss must fall and the AUC rise)")
        return 1
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except Exception as error:
        psched = sys.modules.get("psched")  # imported in psched mode only
        if psched is None or not isinstance(error, psched.Error):
            raise
        raise SystemExit(f"train_ctr: {error} ({error.code})")
