#!/usr/bin/python3
# SPDX-License-Identifier: Apache-2.0
"""Embedding tables through psched against DistributedDataParallel: a DLRM-like click model.

    flock /work/bench.lock bench/embedding_bench.py --json out.json
    bench/embedding_bench.py --workers 4 --modes ddp-sparse,psched,psched+prefetch --memory-rows 0
    bench/embedding_bench.py --rates unshaped --modes psched+prefetch,ddp-sparse --repeats 1 \
        --memory-rows 0 --sweep-rows 250000,2500000,10000000
    bench/embedding_bench.py --rows 20000 --steps 5 --warmup 1 --repeats 1 --rates unshaped

The model and data are python/examples/ctr_model.py's (the example train_ctr.py's): 8 tables of
250,000 rows x 64 (--tables, --rows, --dim), 20 ids a bag, Zipf-distributed, 13 dense features,
DLRM's Criteo MLPs (bottom 512-256-64, top 512-256-1) and dot interaction; a batch of 2048
samples a step, 1024 per worker, fresh samples every step (generated before the run). 2 worker
processes (--workers; one torch thread each), 2 psched shards. After the run worker 0 scores
--test-samples held-out samples (their logloss, the same samples in every mode). Modes, each
run the same steps:
  local        compute only: each worker trains its half alone, plain torch (the "equal" rate)
  ddp-sparse   DDP (gloo), torch.nn.EmbeddingBag(sparse=True), torch.optim.Adagrad on the
               tables, Adam on the MLPs. torch 1.13's DDP takes sparse gradients with gloo (not
               NCCL): a sparse parameter gets a bucket of its own and gloo's sparse allreduce
               allgathers every rank's coalesced (indices, rows) and sums them; DDP divides by
               the world size. Checked: both ranks end with the mean, coalesced.
  ddp-dense    the same with sparse=False: every step all-reduces whole tables (rows x dim x 4
               bytes each) and Adagrad updates every row (those without a gradient by zero)
  psched       psched.torch.DistributedModel (sync mode, Adam on the shards for the MLPs) with
               psched.torch.EmbeddingBag tables (rows on the shards, Adagrad there), float32 on
               the wire both ways
  psched+bf16  the same with bf16 pushes and pulls (tables and MLPs)
  +prefetch    psched's modes with DistributedModel.prefetch: between step k's forward and
               backward each worker starts the pulls of step k + 1's rows (its next batch's ids)
  bounded      psched in bounded mode, staleness 1: a worker waits for its own updates only,
               the others' may lag a step (dense values and rows, prefetched or not)
  hybrid       psched with the dense part in sync mode and the tables bounded, staleness 1
               (`table_mode: {mode: bounded, staleness: 1}`: Persia's hybrid)
  +stale       prefetch with embedding_staleness 1: the rows of step k + 1 as step k - 1 left
               them, so their pull never waits for step k, nor the next forward for step k's
               row pushes to arrive (Persia's embedding_staleness); in sync and hybrid modes
               (psched+prefetch+stale, hybrid+prefetch+stale(+bf16), not run by default) the
               dense part stays sync
  +late        prefetch after backward instead of before it: the request leaves once this
               step's pushes are received, so other workers' pushes are more often in
The psched and bounded modes run only where psched.torch.EmbeddingBag exists (else: skipped,
said so).

Links as bench/torch_e2e.py's (its Network, shard server and CPU sampler are used here): as root
each worker in a network namespace behind a veth pair with tc tbf both ways to a hub where the
shards run (DDP's workers reach each other through it); else loopback, unshaped only. Rates:
"unshaped", a rate ("400mbit"), "equal" (ddp-sparse's bytes a step per worker, the larger
direction, as measured unshaped in this run, take the compute time) or "exceed" (2.5 x that);
default: unshaped and 1gbit.

Accuracy is judged at convergence: each run trains --steps (300) steps and worker 0 scores
--test-samples held-out samples every --eval-every (25) steps and at the end (logloss and AUC;
a scoring is no step, and its time falls in one step in 25, which the median step time leaves
out); every mode runs once for each of --seeds (1,2,3), DDP among them, and the table gives
each mode's final logloss and AUC as the mean over the seeds with its gap to ddp-sparse's.
--plot draws the curves (mean and range over the seeds) as an SVG. Beside each speed ratio, in
brackets, its ceiling: ddp-sparse's step time over the least the mode's step could take here,
the larger of its CPU seconds a step over the cores and its busier direction's bytes a step at
the link's rate.

Measured per run, over the steps after --warmup: the step time (the slower worker's median),
each worker's CPU seconds a step (getrusage) and the shards' (sampled from /proc), the bytes on
the wire a step per worker each way (TCP payload of the worker's own sockets, from `ss -tinp`:
bytes_acked sent, bytes_received), each worker's peak memory (VmHWM, the RSS high-water mark of
the training steps, before the held-out pass). --repeats runs every mode again in rotated
order; the summary gives medians and ranges and ratios against ddp-sparse of the same repeat.
Memory check (--memory-rows, at the first rate): the psched trainer's peak memory with
--memory-rows rows (10 million) must stay within 10% + 16 MiB of its peak with --rows (the
trainer holds no table); DDP's tables alone would take tables x rows x dim x 4 bytes a worker,
Adagrad's state as much again.

JSON goes to --json (or stdout); progress and the table go to stderr. Exit status 1 when the
memory check fails.
"""
import argparse
import json
import os
import pathlib
import re
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT / "python" / "examples"))
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(ROOT / "tests"))
import torch_e2e as e2e  # noqa: E402
from torch_e2e_report import cpu_cell  # noqa: E402
from free_ports import free_ports  # noqa: E402

MODES = ("ddp-sparse", "ddp-dense", "psched", "psched+bf16", "psched+prefetch",
         "psched+prefetch+bf16", "psched+prefetch+stale", "bounded", "bounded+prefetch",
         "bounded+prefetch+bf16", "bounded+prefetch+stale", "bounded+prefetch+late",
         "hybrid+prefetch", "hybrid+prefetch+bf16", "hybrid+prefetch+stale",
         "hybrid+prefetch+stale+bf16")
DEFAULT_MODES = tuple(m for m in MODES if m not in ("ddp-dense", "psched+prefetch+stale",
                                                    "bounded+prefetch+late",
                                                    "hybrid+prefetch+stale",
                                                    "hybrid+prefetch+stale+bf16"))
PSCHED_MODES = ("psched", "bounded", "hybrid")  # a mode's first part: psched's shards train it
BASELINE = "ddp-sparse"
MEMORY_SLACK = (1.10, 16 << 20)  # the memory check's allowance: 10% + 16 MiB
MIB = 1 << 20


# One worker process: bench/embedding_bench.py --worker SPEC (the driver starts it).

def peak_rss_bytes(pid="self"):
    """VmHWM of a process: its resident memory's high-water mark."""
    with open(f"/proc/{pid}/status") as f:
        return int(re.search(r"VmHWM:\s+(\d+) kB", f.read()).group(1)) * 1024


def socket_counters():
    """{(local, peer): [sent, received]}: TCP payload bytes of this process's sockets so far
    (`ss -tinp`: bytes_acked, bytes_received). The union of three dumps, keeping the larger
    counts: a dump can miss a socket while other sockets open or close."""
    counters = {}
    for _ in range(3):
        listing = subprocess.run([shutil.which("ss") or "/usr/bin/ss", "-tinpH"],
                                 capture_output=True, text=True, check=True).stdout
        key = None
        for line in listing.splitlines():
            if not line[:1].isspace():  # a socket's line; its details follow, indented
                fields = line.split()
                key = (fields[3], fields[4]) if f"pid={os.getpid()}," in line else None
            elif key:
                values = dict(re.findall(r"\b(bytes_acked|bytes_received):(\d+)", line))
                seen = counters.setdefault(key, [0, 0])
                for i, name in enumerate(("bytes_acked", "bytes_received")):
                    seen[i] = max(seen[i], int(values.get(name, 0)))
    return counters


def traffic(start, end):
    """(sent, received) between two socket_counters(): sockets opened between count whole,
    sockets closed between are lost."""
    return tuple(sum(counts[i] - start.get(key, [0, 0])[i] for key, counts in end.items())
                 for i in (0, 1))


def is_psched(mode):
    return mode.split("+")[0] in PSCHED_MODES


def build_model(spec):
    """The ClickModel of `spec`'s mode and its torch optimizers (none for psched: the shards
    run them)."""
    import torch
    from ctr_model import ClickModel, psched_bags, torch_bags
    mode, *variants = spec["mode"].split("+")
    torch.manual_seed(spec["seed"])  # the same MLPs (and torch tables) in every worker
    shape = dict(bottom=(512, 256), top=(512, 256))
    if mode in PSCHED_MODES:
        import psched
        import psched.torch
        fmt = "bf16" if "bf16" in variants else "none"
        compression = psched.Compression(push=fmt, pull=fmt, min_bytes=0)
        model = ClickModel(spec["tables"], spec["dim"], psched_bags(
            spec["rows"], spec["dim"], spec["row_lr"], compression), **shape)
        return psched.torch.DistributedModel(model, "adam", lr=spec["lr"],
                                             config=spec["config"], worker=spec["rank"],
                                             compression=compression,
                                             embedding_staleness=int("stale" in variants)), []
    model = ClickModel(spec["tables"], spec["dim"],
                       torch_bags(spec["rows"], spec["dim"], sparse=mode != "ddp-dense"), **shape)
    optimizers = [torch.optim.Adagrad(model.bags.parameters(), lr=spec["row_lr"]),
                  torch.optim.Adam([p for n, p in model.named_parameters()
                                    if not n.startswith("bags.")], lr=spec["lr"])]
    if mode.startswith("ddp"):
        import torch.distributed as dist
        dist.init_process_group("gloo", init_method=spec["init_method"], rank=spec["rank"],
                                world_size=spec["workers"])
        model = torch.nn.parallel.DistributedDataParallel(model)
    return model, optimizers


def evaluate(spec, model, held_out, share):
    """Held-out logloss and AUC of `model` now (rank 0; no step, no collective)."""
    import torch
    from ctr_model import logloss_and_auc
    dense, ids, labels = held_out
    evaluated = model.module if spec["mode"].startswith("ddp") else model
    with torch.no_grad():  # a batch at a time
        logits = torch.cat([evaluated(dense[at:at + share], ids[:, at:at + share])
                            for at in range(0, len(labels), share)])
    return logloss_and_auc(logits, labels)


def run_worker(spec):
    import torch
    from ctr_model import ClickLog
    torch.set_num_threads(1)
    rank, steps, warmup = spec["rank"], spec["steps"], spec["warmup"]
    log = ClickLog(spec["tables"], spec["rows"], spec["ids_per_bag"], spec["seed"])
    share = spec["batch"] // spec["workers"]
    batches = [log.sample(share, torch.Generator().manual_seed(
        spec["seed"] * 100003 + step * spec["workers"] + rank)) for step in range(steps)]
    model, optimizers = build_model(spec)
    starts, walls, losses, window = [], [], [], {}

    def cpu_seconds():
        usage = resource.getrusage(resource.RUSAGE_SELF)
        return usage.ru_utime + usage.ru_stime

    variants = spec["mode"].split("+")[1:]
    late = "late" in variants  # the prefetch after backward, not before it
    held_out = log.sample(spec["test_samples"], torch.Generator().manual_seed(spec["seed"] + 7))
    curve = []  # rank 0: (step, held-out logloss, AUC) every eval_every steps
    for step, (dense, ids, labels) in enumerate(batches):
        if step == warmup:
            window["start"] = (time.time(), cpu_seconds(), socket_counters())
        starts.append(time.perf_counter())
        walls.append(time.time())
        model.zero_grad(set_to_none=True)
        loss = torch.nn.functional.binary_cross_entropy_with_logits(model(dense, ids), labels)
        following = dict(zip(model.module.bags, batches[step + 1][1])) if (
            "prefetch" in variants and step + 1 < len(batches)) else None
        if following and not late:  # the next step's rows travel under backward
            model.prefetch(following)
        loss.backward()  # DDP: all-reduces; psched: pushes rows and MLP gradients
        if following and late:  # asked for once this step's pushes are on their way
            model.prefetch(following)
        for optimizer in optimizers:
            optimizer.step()
        losses.append(loss.item())
        if rank == 0 and spec["eval_every"] and (step + 1) % spec["eval_every"] == 0 and (
                step + 1 < steps):  # the last one after synchronize(), below
            curve.append((step + 1, *evaluate(spec, model, held_out, share)))
    if is_psched(spec["mode"]):
        model.synchronize()  # the last step's updates are in
    starts.append(time.perf_counter())
    end = (time.time(), cpu_seconds(), socket_counters())
    peak_rss = peak_rss_bytes()  # training's, before the held-out pass pulls its rows
    test_logloss = test_auc = None
    if rank == 0:  # after the window: the held-out samples, the same in every mode
        test_logloss, test_auc = evaluate(spec, model, held_out, share)
        curve.append((steps, test_logloss, test_auc))
    start = window["start"]
    sent, received = traffic(start[2], end[2])
    result = {"rank": rank, "step_s": [b - a for a, b in zip(starts, starts[1:])],
              "step_start_wall": walls,
              "loss": losses, "window_wall": [start[0], end[0]], "cpu_s": end[1] - start[1],
              "sent": sent, "received": received,
              "peak_rss": peak_rss, "test_logloss": test_logloss, "test_auc": test_auc,
              "curve": curve}
    if is_psched(spec["mode"]):
        model.client.close()
    elif spec["mode"].startswith("ddp"):  # the other worker may still be counting its bytes
        torch.distributed.barrier()
        torch.distributed.destroy_process_group()
    with open(spec["out"], "w") as out:
        json.dump(result, out)


# The driver.

def deployment_yaml(args, network, mode, worker):
    """torch_e2e's deployment (the priority scheduler) for a worker (worker >= 0) or the shard
    server (None); bounded modes: mode bounded, staleness 1; hybrid modes: sync, the tables
    bounded with staleness 1."""
    text = e2e.deployment_yaml(args, network, "priority", worker)
    if mode.split("+")[0] == "bounded":
        text = text.replace("mode: sync\n", "mode: bounded\nstaleness: 1\n", 1)
    if mode.split("+")[0] == "hybrid":
        text = text.replace("mode: sync\n",
                            "mode: sync\ntable_mode: {mode: bounded, staleness: 1}\n", 1)
    return text


def run_mode(args, network, mode, rows, seed=None):
    """One run of `mode` with `rows` rows a table and `seed` (the first of --seeds when none):
    the shards (psched), both workers; the figures."""
    workdir = pathlib.Path(tempfile.mkdtemp(prefix=f"embedding_bench-{mode}-"))
    spec = {"mode": mode, "tables": args.tables, "rows": rows, "dim": args.dim,
            "ids_per_bag": args.ids_per_bag, "batch": args.batch, "lr": args.lr,
            "row_lr": args.row_lr, "seed": args.seeds[0] if seed is None else seed,
            "eval_every": args.eval_every, "steps": args.steps,
            "warmup": args.warmup, "workers": e2e.WORKERS, "test_samples": args.test_samples,
            "init_method": network.ddp_init_method() if network.links
            else f"tcp://127.0.0.1:{free_ports(1)[0]}"}
    psched_mode = is_psched(mode)
    server = e2e.ShardServer(args, network, "priority", workdir,
                             deployment_yaml(args, network, mode, None)) if psched_mode else None
    processes, shards_peak_rss = [], None
    try:
        for rank in range(e2e.WORKERS):
            worker_spec = dict(spec, rank=rank, out=str(workdir / f"w{rank}.json"))
            if psched_mode:
                config = workdir / f"w{rank}.yaml"
                config.write_text(deployment_yaml(args, network, mode, rank))
                worker_spec["config"] = str(config)
            with open(workdir / f"w{rank}.err", "w") as errors:
                processes.append(subprocess.Popen(
                    network.prefix(rank) + [e2e.PYTHON, str(pathlib.Path(__file__).resolve()),
                                            "--worker", json.dumps(worker_spec)],
                    env=e2e.worker_env(args, network.interface()), stdout=errors,
                    stderr=errors))
        deadline = time.monotonic() + args.timeout
        for process in processes:
            try:
                process.wait(timeout=max(1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
        failed = [r for r, p in enumerate(processes) if p.poll() != 0]
        if failed:
            tails = "".join(f"\n--- worker {r} (exit {processes[r].poll()}):\n" +
                            (workdir / f"w{r}.err").read_text()[-3000:] for r in failed)
            raise RuntimeError(f"{mode}: workers {failed} failed{tails}")
        workers = [json.loads((workdir / f"w{r}.json").read_text())
                   for r in range(e2e.WORKERS)]
    finally:
        for process in processes:
            if process.poll() is None:
                process.kill()
                process.wait()
        if server:
            try:
                shards_peak_rss = peak_rss_bytes(server.process.pid)
            except (OSError, AttributeError):
                pass
            server.stop()
    measured = args.steps - args.warmup
    step_s = max(statistics.median(w["step_s"][args.warmup:]) for w in workers)
    cpu = {f"worker{w['rank']}": w["cpu_s"] / measured for w in workers}
    if server:
        window = (max(w["window_wall"][0] for w in workers),
                  min(w["window_wall"][1] for w in workers))
        cpu["shards"] = server.cpu.between(*window) / measured
    shutil.rmtree(workdir)
    return {"mode": mode, "rows": rows, "step_s": step_s,
            "samples_per_s": args.batch / step_s, "cpu_s_per_step": cpu,
            "cpu_s_per_step_total": sum(cpu.values()),
            "sent_per_step": statistics.mean(w["sent"] for w in workers) / measured,
            "received_per_step": statistics.mean(w["received"] for w in workers) / measured,
            "peak_rss": [w["peak_rss"] for w in workers], "shards_peak_rss": shards_peak_rss,
            "seed": spec["seed"], "test_logloss": workers[0]["test_logloss"],
            "test_auc": workers[0]["test_auc"], "curve": workers[0]["curve"], "workers": workers}


def floor_s(run, bits_per_s):
    """The least a step of `run` could take here: the larger of its CPU seconds a step over the
    machine's cores (every process shares them) and its busier direction's wire time a step
    at `bits_per_s` (None: unshaped, no wire floor)."""
    cpu = run["cpu_s_per_step_total"] / os.cpu_count()
    if not bits_per_s:
        return cpu
    return max(cpu, max(run["sent_per_step"], run["received_per_step"]) * 8 / bits_per_s)


def summarize(runs, modes, bits_per_s=None):
    """Per mode: medians and ranges over the repeats, and ratios against ddp-sparse of the same
    repeat (time: its / the mode's, above 1 faster; bytes, memory: the mode's / its). The
    ceiling: ddp-sparse's step time over the mode's floor (floor_s), what the mode could reach
    against it with no waiting left."""
    by_repeat = {}
    for run in runs:
        by_repeat.setdefault(run["repeat"], {})[run["mode"]] = run
    figures = {"step_s": lambda r: r["step_s"],
               "cpu_s_per_step_total": lambda r: r["cpu_s_per_step_total"],
               "sent_per_step": lambda r: r["sent_per_step"],
               "received_per_step": lambda r: r["received_per_step"],
               "peak_rss": lambda r: max(r["peak_rss"])}
    summary = {}
    for mode in modes:
        mine = [r for r in runs if r["mode"] == mode]
        entry = {name: e2e.spread([get(r) for r in mine]) for name, get in figures.items()}
        if mine[0]["shards_peak_rss"]:
            entry["shards_peak_rss"] = e2e.spread([r["shards_peak_rss"] for r in mine])
        entry["cpu_s_per_step"] = {k: statistics.median(r["cpu_s_per_step"][k] for r in mine)
                                   for k in mine[0]["cpu_s_per_step"]}
        entry["test_logloss"] = e2e.spread([r["test_logloss"] for r in mine])
        entry["test_auc"] = e2e.spread([r["test_auc"] for r in mine])
        entry["final"] = {"logloss": statistics.mean(r["test_logloss"] for r in mine),
                          "auc": statistics.mean(r["test_auc"] for r in mine),
                          "seeds": sorted({r["seed"] for r in mine})}
        pairs = [(rep[BASELINE], rep[mode]) for rep in by_repeat.values()
                 if BASELINE in rep and mode in rep]
        if pairs:
            wire = [(m["sent_per_step"] + m["received_per_step"]) /
                    (b["sent_per_step"] + b["received_per_step"]) for b, m in pairs
                    if b["sent_per_step"] + b["received_per_step"]]
            entry["vs_" + BASELINE] = {
                "speed": e2e.spread([b["step_s"] / m["step_s"] for b, m in pairs]),
                "ceiling": e2e.spread([b["step_s"] / floor_s(m, bits_per_s) for b, m in pairs]),
                "wire_bytes": e2e.spread(wire) if wire else None,
                "peak_rss": e2e.spread([max(m["peak_rss"]) / max(b["peak_rss"])
                                        for b, m in pairs]),
                "test_logloss": e2e.spread([m["test_logloss"] - b["test_logloss"]
                                            for b, m in pairs]),
                "test_auc": e2e.spread([m["test_auc"] - b["test_auc"] for b, m in pairs]),
                # at convergence: the means over the seeds, the mode's less the baseline's
                "final_gap": {k: statistics.mean(m["test_" + k] - b["test_" + k]
                                                 for b, m in pairs) for k in ("logloss", "auc")}}
        summary[mode] = entry
    return summary


def fmt(entry, digits=3, scale=1.0):
    if entry is None:
        return ""
    median, low, high = (entry[k] / scale for k in ("median", "min", "max"))
    if entry["n"] > 1:
        return f"{median:.{digits}f} ({low:.{digits}f}–{high:.{digits}f})"
    return f"{median:.{digits}f}"


def table(output):
    """Markdown: a row per link and mode, medians over the repeats (time and ratios: with
    their range), ratios against ddp-sparse of the same repeat."""
    lines = ["| link | mode | s/step | x ddp-sparse speed (ceiling) | CPU s/step: workers + shards | "
             "MiB/step per worker sent / received | x ddp-sparse bytes | peak RSS MiB, worst "
             "worker (shard server) | x ddp-sparse memory | held-out logloss, mean of the seeds "
             "(- ddp-sparse's) | AUC (- ddp-sparse's) |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    compute = output.get("compute")
    if compute:
        lines.append(f"| compute only | local | {compute['step_s']:.3f} | | "
                     f"{compute['cpu_s_per_step_total']:.3f} | | | "
                     f"{max(compute['peak_rss']) / MIB:.0f} | | | |")
    for rate in output["rates"]:
        for mode, s in rate["summary"].items():
            vs = s.get("vs_" + BASELINE, {})
            server = (f" (shards {s['shards_peak_rss']['median'] / MIB:.0f})"
                      if "shards_peak_rss" in s else "")
            gap = vs.get("final_gap")
            final = s["final"]
            loss = f"{final['logloss']:.4f}" + (f" ({gap['logloss']:+.4f})" if gap else "")
            auc = f"{final['auc']:.4f}" + (f" ({gap['auc']:+.4f})" if gap else "")
            lines.append(
                f"| {rate['name']} | {mode} | {fmt(s['step_s'])} | {fmt(vs.get('speed'), 2)}"
                f"{' (%.2f)' % vs['ceiling']['median'] if vs.get('ceiling') else ''} | "
                f"{cpu_cell(s['cpu_s_per_step'])} | {s['sent_per_step']['median'] / MIB:.2f} / "
                f"{s['received_per_step']['median'] / MIB:.2f} | "
                f"{fmt(vs.get('wire_bytes'), 3)} | {s['peak_rss']['median'] / MIB:.0f}{server} | "
                f"{fmt(vs.get('peak_rss'), 2)} | {loss} | {auc} |")
    check = output.get("memory_check")
    if check and "passed" in check:
        lines.append("")
        lines.append(f"memory check ({check['mode']}): peak RSS {check['small'] / MIB:.0f} MiB at "
                     f"{check['small_rows']:,} rows, {check['large'] / MIB:.0f} MiB at "
                     f"{check['large_rows']:,} rows: {'passed' if check['passed'] else 'FAILED'} "
                     f"(DDP's tables alone at {check['large_rows']:,} rows: "
                     f"{check['ddp_table_bytes'] / 2**30:.1f} GiB a worker, plus Adagrad's state)")
    elif check:
        lines += ["", f"memory check: {check['skipped']}"]
    if output.get("sweep"):
        lines += ["", "| rows a table | mode | s/step | peak RSS MiB, worst trainer | shard server |",
                  "|---|---|---|---|---|"]
        for run in output["sweep"]:
            if "skipped" in run:
                lines.append(f"| {run['rows']:,} | {run['mode']} | skipped: {run['skipped']} | | |")
                continue
            shards = f"{run['shards_peak_rss'] / MIB:.0f}" if run["shards_peak_rss"] else ""
            lines.append(f"| {run['rows']:,} | {run['mode']} | {run['step_s']:.3f} | "
                         f"{max(run['peak_rss']) / MIB:.0f} | {shards} |")
    return "\n".join(lines)


def plot(output, path):
    """The held-out curves of the first rate's runs as an SVG at `path`: logloss and AUC
    against the step, each mode's mean over its seeds as a line and their range as a band."""
    import matplotlib
    matplotlib.use("svg")
    import matplotlib.pyplot as plt
    rate = output["rates"][0]
    figure, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    for mode in rate["summary"]:
        curves = [run["curve"] for run in rate["runs"] if run["mode"] == mode and run["curve"]]
        if not curves:
            continue
        steps = [point[0] for point in curves[0]]
        for axis, column in zip(axes, (1, 2)):
            values = [[point[column] for point in curve[:len(steps)]] for curve in curves]
            by_step = list(zip(*values))
            axis.plot(steps, [statistics.mean(v) for v in by_step], label=mode, linewidth=1.2)
            axis.fill_between(steps, [min(v) for v in by_step], [max(v) for v in by_step],
                              alpha=0.15)
    seeds = sorted({run["seed"] for run in rate["runs"]})
    for axis, name in zip(axes, ("held-out logloss", "held-out AUC")):
        axis.set_xlabel("step")
        axis.set_ylabel(name)
        axis.grid(alpha=0.3)
    axes[0].legend(fontsize=7)
    figure.suptitle(f"{rate['name']}, {output['workers']} workers: mean of seeds {seeds} "
                    "(band: their range)", fontsize=9)
    figure.text(0.01, 0.01, output["command"], fontsize=6)
    figure.tight_layout(rect=(0, 0.03, 1, 0.95))
    figure.savefig(path)


def psched_missing(args):
    """Why the psched modes cannot run here, or None."""
    if not os.path.exists(args.server):
        return f"{args.server} missing (scripts/build)"
    probe = subprocess.run([e2e.PYTHON, "-c", "import psched.torch; psched.torch.EmbeddingBag"],
                           env=e2e.worker_env(args, "lo"), capture_output=True, text=True)
    if probe.returncode != 0:
        return "psched.torch.EmbeddingBag not available: " + (
            probe.stderr.strip().splitlines() or ["?"])[-1]
    return None


def choose_rate(name, compute_s, measured):
    """Bits per second (None: unshaped) for --rates' `name`; "equal" and "exceed" from
    ddp-sparse's unshaped bytes (`measured`, per worker and step, the larger direction)."""
    if name == "unshaped":
        return None
    if name in ("equal", "exceed"):
        if measured is None:
            raise SystemExit(f"embedding_bench: rate {name} needs ddp-sparse run unshaped first "
                             "(--rates unshaped,... and ddp-sparse in --modes)")
        factor = 1 if name == "equal" else e2e.EXCEED_FACTOR
        return e2e.round_rate(8 * measured / (factor * compute_s))
    return e2e.parse_rate(name)


def memory_check(args, network, modes, small_runs):
    """The psched trainer's peak memory at --memory-rows rows against --rows (`small_runs`),
    on `network`."""
    mode = next((m for m in modes if is_psched(m)), None)
    if not args.memory_rows or mode is None:
        return {"skipped": "no psched mode ran" if args.memory_rows else "--memory-rows 0"}
    small = statistics.median(max(r["peak_rss"]) for r in small_runs if r["mode"] == mode)
    e2e.log(f"memory check: {mode} with {args.memory_rows:,} rows a table")
    large = max(run_mode(args, network, mode, args.memory_rows)["peak_rss"])
    return {"mode": mode, "small_rows": args.rows, "large_rows": args.memory_rows,
            "small": small, "large": large,
            "passed": large <= small * MEMORY_SLACK[0] + MEMORY_SLACK[1],
            "ddp_table_bytes": args.tables * args.memory_rows * args.dim * 4}


def fits_in_memory(args, mode, rows):
    """None, or why `mode` cannot run with `rows` rows a table here: DDP's trainers hold the
    whole tables and Adagrad's state, each; refused beyond half of MemAvailable."""
    if is_psched(mode):
        return None
    need = e2e.WORKERS * 2 * args.tables * rows * args.dim * 4
    with open("/proc/meminfo") as f:
        available = int(re.search(r"MemAvailable:\s+(\d+) kB", f.read()).group(1)) * 1024
    if need > available // 2:
        return (f"its {e2e.WORKERS} trainers would hold {need / 2**30:.1f} GiB of tables and "
                f"Adagrad state, over half of this machine's {available / 2**30:.1f} GiB")
    return None


def sweep(args, network):
    """--sweep-modes at each of --sweep-rows: step time, each trainer's and the shard server's
    peak memory."""
    results = []
    for rows in (int(r) for r in args.sweep_rows.split(",")):
        for mode in args.sweep_modes.split(","):
            why = fits_in_memory(args, mode, rows)
            if why:
                e2e.log(f"sweep: {mode} at {rows:,} rows skipped: {why}")
                results.append({"mode": mode, "rows": rows, "skipped": why})
                continue
            run = run_mode(args, network, mode, rows)
            e2e.log(f"sweep: {mode} at {rows:,} rows: {run['step_s']:.3f} s/step, trainers' "
                    f"peak {max(run['peak_rss']) / MIB:.0f} MiB, shards' "
                    f"{(run['shards_peak_rss'] or 0) / MIB:.0f} MiB")
            results.append({k: run[k] for k in ("mode", "rows", "step_s", "peak_rss",
                                                "shards_peak_rss", "test_logloss")})
    return results


def benchmark(args, use_netns, modes):
    output = {"rates": []}
    e2e.log("compute only (both workers, no communication)")
    network = e2e.Network(False, None)
    try:
        output["compute"] = run_mode(args, network, "local", args.rows)
    finally:
        network.close()
    measured = None  # ddp-sparse's bytes a step per worker, unshaped
    for name in args.rates.split(","):
        bits = choose_rate(name, output["compute"]["step_s"], measured)
        network = e2e.Network(use_netns, bits)
        runs = []
        try:
            for repeat in range(args.repeats):
                seed = args.seeds[repeat % len(args.seeds)]
                for mode in modes[repeat % len(modes):] + modes[:repeat % len(modes)]:
                    run = dict(run_mode(args, network, mode, args.rows, seed), repeat=repeat)
                    runs.append(run)
                    e2e.log(f"  {e2e.rate_name(bits)} repeat {repeat + 1}/{args.repeats} "
                            f"{mode:11}: {run['step_s']:.3f} s/step, CPU "
                            f"{run['cpu_s_per_step_total']:.3f} s/step, sent "
                            f"{run['sent_per_step'] / MIB:.2f} MiB/step, received "
                            f"{run['received_per_step'] / MIB:.2f}, peak RSS "
                            f"{max(run['peak_rss']) / MIB:.0f} MiB")
            if bits is None:
                baseline = [max(r["sent_per_step"], r["received_per_step"]) for r in runs
                            if r["mode"] == BASELINE]
                measured = statistics.median(baseline) if baseline else None
            if "memory_check" not in output:  # at the first rate
                output["memory_check"] = memory_check(args, network, modes, runs)
                if args.sweep_rows:
                    output["sweep"] = sweep(args, network)
            drops = network.links.tbf_drops() if network.links else 0
        finally:
            network.close()
        output["rates"].append({"name": e2e.rate_name(bits), "bits_per_s": bits,
                                "tbf_drops": drops, "runs": runs,
                                "summary": summarize(runs, modes, bits)})
    return output


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--modes", default=",".join(DEFAULT_MODES),
                        help="of " + ", ".join(MODES) + " (default: " + ", ".join(DEFAULT_MODES)
                        + ")")
    parser.add_argument("--rates", default="unshaped,1gbit",
                        help="unshaped, equal, exceed, or rates like 400mbit (in this order)")
    parser.add_argument("--tables", type=int, default=8)
    parser.add_argument("--rows", type=int, default=250_000, help="rows a table")
    parser.add_argument("--dim", type=int, default=64)
    parser.add_argument("--ids-per-bag", type=int, default=20)
    parser.add_argument("--batch", type=int, default=2048, help="samples a step, both workers")
    parser.add_argument("--steps", type=int, default=300,
                        help="steps a run, warm-up included (accuracy is judged at convergence: "
                             "at 300 steps every mode's held-out logloss has levelled)")
    parser.add_argument("--warmup", type=int, default=10, help="steps not measured")
    parser.add_argument("--eval-every", type=int, default=25,
                        help="worker 0 scores the held-out samples every this many steps (0: "
                             "at the end only); the curve goes in the JSON and --plot")
    parser.add_argument("--seeds", default="1,2,3",
                        help="the data's and models' seeds: repeat r runs every mode with the "
                             "r-th (cycling)")
    parser.add_argument("--repeats", type=int, help="default: one a seed")
    parser.add_argument("--plot", help="an SVG of the held-out logloss and AUC curves, each "
                                       "mode's mean over the seeds with their range")
    parser.add_argument("--replot", help="a JSON this benchmark wrote: draw --plot from it, run "
                                         "nothing")
    parser.add_argument("--lr", type=float, default=1e-3, help="Adam's, for the MLPs")
    parser.add_argument("--row-lr", type=float, default=0.05, help="Adagrad's, for the rows")
    parser.add_argument("--memory-rows", type=int, default=10_000_000,
                        help="rows a table for the psched memory check (0: none)")
    parser.add_argument("--sweep-rows", default="",
                        help="rows a table for the scale sweep, e.g. 250000,2500000,10000000 "
                             "(default: none): --sweep-modes at each, at the first rate")
    parser.add_argument("--sweep-modes", default="psched+prefetch,ddp-sparse")
    parser.add_argument("--workers", type=int, default=e2e.WORKERS,
                        help="trainer processes (the batch is split between them)")
    parser.add_argument("--test-samples", type=int, default=16384,
                        help="held-out samples worker 0 scores after the run")
    parser.add_argument("--links", choices=("auto", "netns", "loopback"), default="auto",
                        help="auto: namespaces with tbf where root can make them, else loopback")
    parser.add_argument("--timeout", type=float, default=900, help="seconds a run")
    parser.add_argument("--build", default=str(ROOT / "build"), help="psched's build folder")
    parser.add_argument("--credit-bytes", default="2MiB",
                        help="the workers' scheduler.credit_bytes (bytes in flight, both ways)")
    parser.add_argument("--shards", type=int, default=e2e.SHARDS,
                        help="psched shards, all in one psched-server process (more shards than "
                             "processes: what over-partitioning a job would cost a step)")
    parser.add_argument("--json", help="write the results here (default: stdout)")
    args = parser.parse_args(argv)
    args.seeds = [int(s) for s in args.seeds.split(",")]
    if args.repeats is None:
        args.repeats = len(args.seeds)
    e2e.WORKERS = args.workers  # torch_e2e's Network and deployment_yaml read it at each call
    e2e.SHARDS = args.shards  # and this
    args.server = str(pathlib.Path(args.build) / "apps" / "psched-server")
    args.python_path = str(pathlib.Path(args.build) / "python")
    # What torch_e2e's ShardServer and deployment_yaml read: today's priority scheduler (its
    # credit from --credit-bytes).
    args.partition_bytes, args.trace = "256KiB", None
    if args.batch % e2e.WORKERS or not 0 < args.warmup < args.steps:
        parser.error(f"--batch must be a multiple of {e2e.WORKERS} and 0 < --warmup < --steps")
    return args


def main(argv):
    if argv[:1] == ["--worker"]:
        run_worker(json.loads(argv[1]))
        return 0
    args = parse_args(argv)
    if args.replot:
        if not args.plot:
            raise SystemExit("embedding_bench: --replot needs --plot")
        plot(json.loads(pathlib.Path(args.replot).read_text()), args.plot)
        return 0
    modes = args.modes.split(",")
    unknown = set(modes) - set(MODES)
    if unknown:
        raise SystemExit(f"embedding_bench: unknown modes {sorted(unknown)} (of {MODES})")
    skipped = psched_missing(args) if any(is_psched(m) for m in modes) else None
    if skipped:
        e2e.log(f"embedding_bench: psched modes skipped: {skipped}")
        modes = [m for m in modes if not is_psched(m)]
    use_netns, why = e2e.choose_links(args.links)
    if not use_netns:
        e2e.log(f"embedding_bench: running over loopback, unshaped ({why})")
        args.rates = "unshaped"
    import torch
    output = {"command": " ".join(["bench/embedding_bench.py", *argv]),
              "links": "netns" if use_netns else f"loopback ({why})",
              "cores": os.cpu_count(), "torch": torch.__version__, "workers": e2e.WORKERS,
              "shards": e2e.SHARDS, "tables": args.tables, "rows": args.rows, "dim": args.dim,
              "ids_per_bag": args.ids_per_bag, "batch": args.batch, "steps": args.steps,
              "warmup": args.warmup, "repeats": args.repeats, "psched_skipped": skipped,
              "loadavg_start": os.getloadavg()}
    output.update(benchmark(args, use_netns, modes))
    output["loadavg_end"] = os.getloadavg()
    e2e.log(table(output))
    if args.plot:
        plot(output, args.plot)
    text = json.dumps(output, indent=1)
    if args.json:
        pathlib.Path(args.json).write_text(text + "\n")
    else:
        print(text)
    return 0 if output.get("memory_check", {}).get("passed", True) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
