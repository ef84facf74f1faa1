#!/usr/bin/python3
# SPDX-License-Identifier: Apache-2.0
"""What compression does to learning: each task trained under each wire format for the same
steps, from the same seeds (2 workers, sync mode or --mode bounded with --staleness); test
accuracy and the training loss per epoch. Tasks (--tasks, default digits,teacher):
  digits   the digits example (python/examples/train_digits.py): Adam on the shards, 8x8 images
  digits_momentum  the same with SGD with momentum 0.9 on the shards (lr 0.05)
  teacher  bench/teacher_student.py: labels from a fixed random teacher network, a larger
           student trained by SGD with momentum on the shards; thousands of steps to learn

    bench/compression_accuracy.py --epochs 15 --seeds 0,1,2 --json out.json --plot loss.svg
    bench/compression_accuracy.py --replot out.json --plot loss.svg   # redraw, no training

Formats (the deployment's compression: section, min_bytes 0 so every tensor is compressed):
  none     full width both ways (the baseline)
  bf16     pushes and values in bf16
  fp16     pushes and values in fp16
  topk     pushes: the largest 1% of each partition, with error feedback; values in bf16
  onebit   pushes: signs and the mean magnitude, with error feedback; values in bf16
  topk10   topk of 10%
  topk_warmup  topk 1% after 110 full-width steps (5 epochs): Adam's variance frozen then
  onebit_warmup  onebit after the same warm-up
  deltas   top-k both ways: pushes as topk, values as top-k deltas from the shard (1% of each
           partition, the rest kept on the shard), full values at full width
  deltas_bf16  the same with full values in bf16 (for a worker without a version)
  deltas10  pushes top-k 1%, values as deltas of 10%
  deltas_refresh  top-k 1% both ways, and full values in bf16 every 10 steps
  deltas_refresh_full  the same with full values at full width
  deltas2  pushes top-k 1%, values as deltas of 2%
  deltas_warmup  top-k 1% both ways after 110 steps of full width both ways
Prints, per task and format, the final test accuracy (median and range over the seeds) and its
difference from `none` of the same seed, in points.
"""
import argparse
import json
import os
import pathlib
import re
import statistics
import subprocess
import sys
import tempfile
import threading

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
from free_ports import free_ports  # noqa: E402
TASKS = {"digits": [ROOT / "python" / "examples" / "train_digits.py"],
         "digits_momentum": [ROOT / "python" / "examples" / "train_digits.py", "--optimizer",
                             "momentum"],
         "teacher": [ROOT / "bench" / "teacher_student.py"]}
PYTHON = "/usr/bin/python3"
WORKERS = 2
FORMATS = {"none": "{push: none, pull: none}",
           "bf16": "{push: bf16, pull: bf16, min_bytes: 0}",
           "fp16": "{push: fp16, pull: fp16, min_bytes: 0}",
           "topk": "{push: topk, pull: bf16, topk_fraction: 0.01, min_bytes: 0}",
           "onebit": "{push: onebit, pull: bf16, min_bytes: 0}",
           "topk10": "{push: topk, pull: bf16, topk_fraction: 0.1, min_bytes: 0}",
           "topk_warmup": "{push: topk, pull: bf16, topk_fraction: 0.01, min_bytes: 0, "
                          "warmup_steps: 110}",
           "onebit_warmup": "{push: onebit, pull: bf16, min_bytes: 0, warmup_steps: 110}",
           "deltas": "{push: topk, pull: topk, topk_fraction: 0.01, pull_fraction: 0.01, "
                     "min_bytes: 0}",
           "deltas_bf16": "{push: topk, pull: topk, topk_fraction: 0.01, pull_fraction: 0.01, "
                          "pull_full: bf16, min_bytes: 0}",
           "deltas10": "{push: topk, pull: topk, topk_fraction: 0.01, pull_fraction: 0.1, "
                       "min_bytes: 0}",
           "deltas_refresh": "{push: topk, pull: topk, topk_fraction: 0.01, pull_fraction: 0.01, "
                             "refresh_steps: 10, pull_full: bf16, min_bytes: 0}",
           "deltas_refresh_full": "{push: topk, pull: topk, topk_fraction: 0.01, "
                                  "pull_fraction: 0.01, refresh_steps: 10, min_bytes: 0}",
           "deltas2": "{push: topk, pull: topk, topk_fraction: 0.01, pull_fraction: 0.02, "
                      "min_bytes: 0}",
           "deltas_warmup": "{push: topk, pull: topk, topk_fraction: 0.01, pull_fraction: 0.01, "
                            "warmup_steps: 110, min_bytes: 0}"}


def start_server(args, config):
    server = subprocess.Popen([os.path.join(args.build, "apps", "psched-server"), "--config",
                               str(config), "--threads", "1", "--apply-threads", "1"],
                              stderr=subprocess.PIPE, text=True)
    listening = threading.Event()

    def read_log():
        for line in server.stderr:
            if "listening on" in line:
                listening.set()
        listening.set()

    threading.Thread(target=read_log, daemon=True).start()
    if not listening.wait(30) or server.poll() is not None:
        raise RuntimeError("psched-server did not start")
    return server


def train(args, task, fmt, seed, workdir):
    """Worker 0's (loss, accuracy) per epoch of `task` under `fmt` from `seed`."""
    config = workdir / f"{task}-{fmt}-{seed}.yaml"
    listen, http = free_ports(2)
    mode = "sync" if args.mode == "sync" else f"bounded\nstaleness: {args.staleness}"
    config.write_text(f"mode: {mode}\nworkers: {WORKERS}\n"
                      f"shards:\n  - {{listen: 127.0.0.1:{listen}, "
                      f"http: 127.0.0.1:{http}}}\n"
                      f"compression: {FORMATS[fmt]}\n")
    server = start_server(args, config)
    try:
        env = dict(os.environ, PYTHONPATH=os.path.join(args.build, "python"), WORLD_SIZE="2")
        command = [PYTHON] + [str(a) for a in TASKS[task]]
        workers = [subprocess.Popen(command + ["--config", str(config), "--epochs",
                                               str(args.epochs), "--seed", str(seed)],
                                    env=dict(env, RANK=str(rank)), stdout=subprocess.PIPE,
                                    stderr=subprocess.STDOUT, text=True)
                   for rank in range(WORKERS)]
        outputs = [w.communicate(timeout=args.timeout)[0] for w in workers]
    finally:
        server.terminate()
        server.wait()
    for w, out in zip(workers, outputs):
        if w.returncode != 0:
            raise RuntimeError(f"{task} {fmt} seed {seed}: a worker failed:\n{out}")
    epochs = re.findall(r"worker 0 epoch\s+\d+\s+loss (\S+)\s+test accuracy (\S+)", outputs[0])
    return [float(loss) for loss, _ in epochs], [float(acc) for _, acc in epochs]


def spread(values):
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def plot(results, path, mode="sync", staleness=None):
    """One row per task: training loss and test accuracy per epoch, medians over the seeds;
    the title names the mode the runs trained in."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    figure, axes = plt.subplots(len(results), 2, figsize=(10, 3.8 * len(results)),
                                squeeze=False)
    for (task, formats), (loss_ax, acc_ax) in zip(results.items(), axes):
        for fmt, runs in formats.items():
            epochs = range(1, len(runs[0]["loss"]) + 1)
            loss = [statistics.median(r["loss"][e - 1] for r in runs) for e in epochs]
            acc = [statistics.median(r["accuracy"][e - 1] for r in runs) for e in epochs]
            loss_ax.plot(epochs, loss, marker=".", label=fmt)
            acc_ax.plot(epochs, acc, marker=".", label=fmt)
        loss_ax.set(xlabel="epoch", ylabel="training loss (median over seeds)", yscale="log",
                    title=task)
        acc_ax.set(xlabel="epoch", ylabel="test accuracy (median over seeds)", title=task)
        loss_ax.legend()
    mode = mode if mode == "sync" else f"{mode}, staleness {staleness}"
    figure.suptitle(f"{WORKERS} workers, {mode}: wire formats")
    figure.tight_layout()
    figure.savefig(path)


def summarize(results):
    """Per format: the final accuracy and loss over the seeds, and the points from none."""
    summary = {}
    for fmt, runs in results.items():
        entry = {"accuracy": spread([r["accuracy"][-1] for r in runs]),
                 "loss": spread([r["loss"][-1] for r in runs])}
        if "none" in results and fmt != "none":
            base = {r["seed"]: r["accuracy"][-1] for r in results["none"]}
            entry["points_from_none"] = spread([100 * (r["accuracy"][-1] - base[r["seed"]])
                                                for r in runs if r["seed"] in base])
        summary[fmt] = entry
    return summary


def main(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--formats", default="none,bf16,fp16,topk,onebit",
                        help=f"of: {', '.join(FORMATS)}")
    parser.add_argument("--tasks", default="digits,teacher", help=f"of: {', '.join(TASKS)}")
    parser.add_argument("--epochs", type=int, default=15)
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--mode", choices=("sync", "bounded"), default="sync")
    parser.add_argument("--staleness", type=int, default=2, help="bounded mode's")
    parser.add_argument("--build", default=str(ROOT / "build"))
    parser.add_argument("--timeout", type=float, default=600, help="seconds per training run")
    parser.add_argument("--json", help="write the results here")
    parser.add_argument("--plot", help="draw the loss and accuracy curves here (.svg, .png)")
    parser.add_argument("--replot", metavar="JSON",
                        help="train nothing: draw --plot from a results file --json wrote")
    args = parser.parse_args(argv)
    if args.replot:
        if not args.plot:
            parser.error("--replot needs --plot")
        saved = json.loads(pathlib.Path(args.replot).read_text())
        runs = saved["runs"]
        if all(isinstance(r, list) for r in runs.values()):  # a file from before --tasks
            runs = {"digits": runs}
        plot(runs, args.plot, saved.get("mode", "sync"), saved.get("staleness"))
        return
    formats, seeds = args.formats.split(","), [int(s) for s in args.seeds.split(",")]
    tasks = args.tasks.split(",")
    for task in tasks:
        if task not in TASKS:
            parser.error(f"no task {task!r} (tasks: {', '.join(TASKS)})")
    results = {}
    with tempfile.TemporaryDirectory(prefix="compression_accuracy-") as workdir:
        for task in tasks:
            for fmt in formats:
                for seed in seeds:
                    loss, accuracy = train(args, task, fmt, seed, pathlib.Path(workdir))
                    results.setdefault(task, {}).setdefault(fmt, []).append(
                        {"seed": seed, "loss": loss, "accuracy": accuracy})
                    print(f"{task} {fmt:7} seed {seed}: loss {loss[-1]:.4f}, test accuracy "
                          f"{accuracy[-1]:.3f}", file=sys.stderr, flush=True)
    summary = {task: summarize(runs) for task, runs in results.items()}
    print("| task | format | test accuracy, median (range) | points from none, median (range) "
          "| final loss |\n|---|---|---|---|---|")
    for task, formats_summary in summary.items():
        for fmt, e in formats_summary.items():
            a, d = e["accuracy"], e.get("points_from_none")
            points = f"{d['median']:+.1f} ({d['min']:+.1f} to {d['max']:+.1f})" if d else ""
            print(f"| {task} | {fmt} | {a['median']:.3f} ({a['min']:.3f}–{a['max']:.3f}) | "
                  f"{points} | {e['loss']['median']:.4f} |")
    out = {"command": " ".join(["bench/compression_accuracy.py"] + argv), "epochs": args.epochs,
           "mode": args.mode, "staleness": args.staleness if args.mode == "bounded" else None,
           "seeds": seeds, "formats": FORMATS, "runs": results, "summary": summary}
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps(out, indent=1))
    if args.plot:
        plot(results, args.plot, args.mode, args.staleness)


if __name__ == "__main__":
    main(sys.argv[1:])
