#!/usr/bin/python3
# SPDX-License-Identifier: Apache-2.0
"""Real PyTorch training through psched against DistributedDataParallel, over shaped links.

    flock /work/bench.lock bench/torch_e2e.py --models resnet18 --json out.json
    bench/torch_e2e.py --models tiny --steps 4 --warmup 1 --rates unshaped --check tiny
    bench/torch_e2e.py --table bench/results/torch_e2e-*.json   # a Markdown table of runs

For each model, 2 worker processes (one torch thread each) train with the same batch, the same
SGD with momentum and the same number of steps, in each mode:
  priority  psched.torch, sync mode, the priority scheduler (partitions, credit window:
            --partition-bytes, --credit-bytes, default today's 256KiB and 2MiB)
  fifo      psched.torch, sync mode, no scheduling: arrival order, whole tensors up to 64 MiB,
            no credit window (psched-bench's fifo)
  ddp       torch DistributedDataParallel, gloo, its default buckets, torch.optim.SGD
  MODE+FORMAT  the same with compressed communication: priority+bf16 (pushes and values in
            bf16), priority+fp16, priority+topk (pushes: the largest 1% per partition with
            error feedback; values in bf16), priority+onebit (signs and a scale, values in
            bf16), priority+deltas (top-k both ways: pushes as priority+topk, values as
            top-k deltas from the shard, 1% of each partition, with the shard's error
            feedback; full values in bf16); ddp+fp16 (DDP with torch's own fp16_compress_hook)
Each worker runs in its own network namespace, joined by a veth pair with `tc tbf` both ways to
a hub namespace where the psched shards run (one psched-server process, 2 shards); DDP's
workers reach each other through the hub (bench/torch_e2e_links.py). Without root the same runs
go over loopback, unshaped, and the output says so.

Rates: "unshaped" (veth without tbf), "equal" (communication per direction = the measured
compute time), "exceed" (communication = 2.5 x compute), or a rate like "2.5gbit". The compute
time is measured first, in the same run, with both workers training alone (mode "local").

Reported per mode: median iteration time after the warm-up steps (the slower worker's), its
samples/s, the CPU seconds per step of every process (workers, and the shard server for psched),
the ratio DDP time / mode time (above 1: faster than DDP), and for psched the payload bytes the
shards counted each way, as sent and as float32 would carry them (their /status). --repeats runs every mode again,
in rotated order; the summary gives the median and range.

--check MODELS: psched sync SGD+momentum against DDP with torch.optim.SGD in float64, same
initial weights and data, a few steps: the parameters must agree within 1e-9 (exit status 1 if
not). Beside it, what a 1e-7 relative change of each averaged gradient grows to over the same
steps (float64, one process): how far two correct float32 implementations may drift.

JSON goes to --json (or stdout); progress and a summary table go to stderr.
"""
import argparse
import json
import os
import pathlib
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "tests"))
import torch_e2e_links as links_lib  # noqa: E402
from free_ports import free_ports  # noqa: E402
from torch_e2e_report import plot, table  # noqa: E402

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parent
WORKER = HERE / "torch_e2e_worker.py"
PYTHON = "/usr/bin/python3"  # Debian's, with python3-torch
WORKERS = 2
SHARDS = 2
SHARD_PORT = 7410  # inside the hub namespace nothing else listens
DDP_PORT = 29500
CHECK_TOLERANCE = 1e-9
EXCEED_FACTOR = 2.5
SKIPPED = 77  # ctest's SKIP_RETURN_CODE: torch or torchvision missing
FIFO_SCHEDULER = "{policy: fifo, partition_bytes: 64MiB, credit_bytes: 1TiB}"
# The deployment's compression: section for each psched mode's +FORMAT.
COMPRESSION = {"bf16": "{push: bf16, pull: bf16}",
               "fp16": "{push: fp16, pull: fp16}",
               "topk": "{push: topk, pull: bf16, topk_fraction: 0.01}",
               "onebit": "{push: onebit, pull: bf16}",
               "deltas": "{push: topk, pull: topk, topk_fraction: 0.01, pull_fraction: 0.01, "
                         "pull_full: bf16}"}
DDP_HOOKS = ("fp16",)


def base_mode(mode):
    """priority, fifo, ddp or local: the mode without its +FORMAT."""
    return mode.partition("+")[0]


def is_psched(mode):
    return base_mode(mode) in ("priority", "fifo")


def check_mode(mode):
    base, _, variant = mode.partition("+")
    known = COMPRESSION if base in ("priority", "fifo") else DDP_HOOKS if base == "ddp" else ()
    if base not in ("priority", "fifo", "ddp") or (variant and variant not in known):
        raise SystemExit(f"unknown mode '{mode}' (priority, fifo, ddp, each optionally +"
                         f"{'|'.join(COMPRESSION)} for psched, +fp16 for ddp)")


def log(message):
    print(message, file=sys.stderr, flush=True)


def parse_rate(text):
    """"2.5gbit", "400mbit", "8000bit" or bits per second -> bits per second."""
    for suffix, scale in (("gbit", 1e9), ("mbit", 1e6), ("kbit", 1e3), ("bit", 1)):
        if text.endswith(suffix):
            return float(text[:-len(suffix)]) * scale
    return float(text)


def rate_name(bits):
    if bits is None:
        return "unshaped"
    return f"{bits / 1e9:.3g}gbit" if bits >= 1e9 else f"{bits / 1e6:.3g}mbit"


def round_rate(bits):
    """Two significant digits: a rate one can type again."""
    digits = len(str(int(bits))) - 2
    return round(bits / 10 ** digits) * 10 ** digits


def process_cpu_seconds(pid):
    """utime + stime of a live process, from /proc (clock ticks, 10 ms)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class CpuSampler:
    """Samples a process's CPU seconds every 50 ms, so that the CPU it spent between two wall
    times (the workers' measured window) can be read afterwards."""

    def __init__(self, pid):
        self.pid, self.samples, self._stop = pid, [], threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self):
        while not self._stop.is_set():
            try:
                self.samples.append((time.time(), process_cpu_seconds(self.pid)))
            except (OSError, IndexError, ValueError):
                return
            self._stop.wait(0.05)

    def stop(self):
        self._stop.set()
        self._thread.join()

    def between(self, start, end):
        def at(t):  # linear between the samples around t
            before = [s for s in self.samples if s[0] <= t] or self.samples[:1]
            after = [s for s in self.samples if s[0] >= t] or self.samples[-1:]
            (t0, c0), (t1, c1) = before[-1], after[0]
            return c0 if t1 == t0 else c0 + (c1 - c0) * (t - t0) / (t1 - t0)
        return at(end) - at(start)


class Network:
    """Where the processes run: namespaces joined by shaped veth links, or loopback."""

    def __init__(self, use_netns, bits_per_s):
        self.links = links_lib.Links(WORKERS, bits_per_s) if use_netns else None
        self.ports = None if use_netns else free_ports(2 * SHARDS + 1)

    def close(self):
        if self.links:
            self.links.close()

    def prefix(self, worker=None):
        if not self.links:
            return []
        return self.links.exec_prefix(self.links.hub if worker is None else
                                      self.links.workers[worker])

    def shard_listen(self, shard):
        return f"0.0.0.0:{SHARD_PORT + shard}" if self.links else f"127.0.0.1:{self.ports[shard]}"

    def shard_http(self, shard):
        return (f"127.0.0.1:{SHARD_PORT + 1000 + shard}" if self.links
                else f"127.0.0.1:{self.ports[SHARDS + shard]}")

    def shard_address(self, worker, shard):
        return (f"{self.links.hub_address(worker)}:{SHARD_PORT + shard}" if self.links
                else f"127.0.0.1:{self.ports[shard]}")

    def ddp_init_method(self):
        # A port of its own for each run: a run's store on the port of the one before it hung
        # (ddp then ddp+fp16: the second run's rank 1 never got past its first step).
        self.ddp_runs = getattr(self, "ddp_runs", 0) + 1
        return (f"tcp://{self.links.worker_address(0)}:{DDP_PORT + self.ddp_runs}" if self.links
                else f"tcp://127.0.0.1:{self.ports[-1]}")

    def name(self):
        if not self.links:
            return "loopback"
        return rate_name(self.links.bits_per_s)

    def interface(self):
        return "eth0" if self.links else "lo"


def scheduler_yaml(args, mode):
    if base_mode(mode) == "fifo":
        return FIFO_SCHEDULER
    return (f"{{policy: priority, partition_bytes: {args.partition_bytes}, "
            f"credit_bytes: {args.credit_bytes}}}")


def deployment_yaml(args, network, mode, worker):
    """The deployment a worker (worker >= 0) or the shard server (None) reads. The message
    limit must hold a variable's part on one shard (register, pull): VGG-11's 25088x4096
    layer in float64 puts 411 MB on each of the 2 shards."""
    shards = "".join(
        f"  - listen: {network.shard_listen(s) if worker is None else network.shard_address(worker, s)}\n"
        f"    http: {network.shard_http(s)}\n" for s in range(SHARDS))
    variant = mode.partition("+")[2]
    compression = f"compression: {COMPRESSION[variant]}\n" if variant else ""
    return (f"mode: sync\nworkers: {WORKERS}\nshards:\n{shards}"
            f"scheduler: {scheduler_yaml(args, mode)}\nlimits: {{max_message_bytes: 512MiB}}\n"
            + compression)


class ShardServer:
    """psched-server hosting every shard, in the hub namespace."""

    def __init__(self, args, network, mode, workdir, config_text=None):
        """config_text: the deployment to run (default: deployment_yaml's for `mode`)."""
        config = workdir / "shards.yaml"
        config.write_text(config_text or deployment_yaml(args, network, mode, None))
        self.log = []
        self.trace = workdir / "shards.trace.json" if args.trace else None
        trace = ["--trace", str(self.trace)] if self.trace else []
        self.process = subprocess.Popen(
            network.prefix() + [args.server, "--config", str(config)] + trace,
            stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True)
        listening = threading.Event()
        threading.Thread(target=self._read_log, args=(listening,), daemon=True).start()
        if not listening.wait(60) or self.process.poll() is not None:
            self.stop()
            raise RuntimeError("psched-server did not start:\n" + "".join(self.log))
        self.cpu = CpuSampler(self.process.pid)

    def _read_log(self, listening):
        for line in self.process.stderr:
            self.log.append(line)
            if sum("listening on" in entry for entry in self.log) == SHARDS:
                listening.set()
        listening.set()

    def wire_bytes(self, network):
        """The shards' payload bytes each way, as sent and raw, summed (their /status)."""
        total = {d: {"raw": 0, "sent": 0} for d in ("push", "pull")}
        for s in range(SHARDS):
            read = ("import urllib.request; "
                    f"print(urllib.request.urlopen('http://{network.shard_http(s)}/status')"
                    ".read().decode())")
            status = json.loads(subprocess.run(network.prefix() + [PYTHON, "-c", read],
                                               check=True, capture_output=True, text=True).stdout)
            for direction, counts in status["wire_bytes"].items():
                for form, value in counts.items():
                    total[direction][form] += value
        return total

    def stop(self):
        if hasattr(self, "cpu"):
            self.cpu.stop()
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


def worker_env(args, interface):
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [args.python_path,
                                                      env.get("PYTHONPATH")]))
    env.update(OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1",
               GLOO_SOCKET_IFNAME=interface)
    return env


def run_workers(args, network, spec, workdir, timeout):
    """Starts one worker per rank with `spec`, waits for all, returns their results."""
    processes = []
    for rank in range(WORKERS):
        worker_spec = dict(spec, rank=rank, workers=WORKERS, out=str(workdir / f"w{rank}.json"))
        if is_psched(spec["mode"]):
            config = workdir / f"w{rank}.yaml"
            config.write_text(deployment_yaml(args, network, spec["mode"], rank))
            worker_spec["config"] = str(config)
        if spec.get("save"):
            worker_spec["save"] = str(workdir / f"w{rank}.pt")
        if args.trace:
            worker_spec["trace"] = str(workdir / f"w{rank}.trace.json")
        with open(workdir / f"w{rank}.err", "w") as errors:
            processes.append(subprocess.Popen(
                network.prefix(rank) + [PYTHON, str(WORKER), json.dumps(worker_spec)],
                env=worker_env(args, network.interface()), stdout=errors, stderr=errors))
    deadline = time.monotonic() + timeout
    failed = []
    for rank, process in enumerate(processes):
        try:
            process.wait(timeout=max(1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        if process.returncode != 0:
            failed.append(rank)
    if failed:
        for process in processes:
            if process.poll() is None:
                process.kill()
        tails = "".join(f"\n--- worker {r} (exit {processes[r].returncode}):\n" +
                        (workdir / f"w{r}.err").read_text()[-3000:] for r in failed)
        raise RuntimeError(f"{spec['model']} {spec['mode']}: workers {failed} failed{tails}")
    return [json.loads((workdir / f"w{r}.json").read_text()) for r in range(WORKERS)]


def run_mode(args, network, model, mode, *, steps, warmup, float64=False, save=False):
    """One run of `mode` on `model`: shards (psched modes), workers; the measured figures."""
    workdir = pathlib.Path(tempfile.mkdtemp(prefix=f"torch_e2e-{model}-{mode}-"))
    spec = {"model": model, "mode": mode, "batch": args.batch, "lr": args.lr,
            "momentum": args.momentum, "seed": args.seed, "steps": steps, "warmup": warmup,
            "float64": float64, "save": save, "init_method": network.ddp_init_method(),
            "buffers": args.buffers}
    server = ShardServer(args, network, mode, workdir) if is_psched(mode) else None
    wire = None
    try:
        workers = run_workers(args, network, spec, workdir, args.timeout)
        if server:
            wire = server.wire_bytes(network)
    finally:
        if server:
            server.stop()
    iteration_s = max(statistics.median(w["step_s"][warmup:]) for w in workers)
    window = (max(w["window_wall"][0] for w in workers), min(w["window_wall"][1] for w in workers))
    measured = steps - warmup
    cpu = {f"worker{w['rank']}": w["cpu_s"] / measured for w in workers}
    if server:
        cpu["shards"] = server.cpu.between(*window) / measured
    result = {"mode": mode, "iteration_s": iteration_s,
              "samples_per_s": WORKERS * args.batch / iteration_s,
              "cpu_s_per_step": cpu, "cpu_s_per_step_total": sum(cpu.values()),
              "step_s": [w["step_s"] for w in workers],
              "loss_last": [w["loss"][-1] for w in workers]}
    if wire:
        result["wire_bytes"] = wire
    if args.trace:
        add_trace(args, workers, workdir, f"{model} {network.name()}",
                  server.trace if server else None)
    if save:
        import torch
        result["parameters"] = [torch.load(workdir / f"w{r}.pt") for r in range(WORKERS)]
    shutil.rmtree(workdir)
    return result


TRACE_EVENTS = []  # every run's workers, for --trace


def add_trace(args, workers, workdir, label, shard_trace):
    """Appends the workers' traces, and the shards' (psched-server --trace) when given, to
    --trace's document, each worker and shard a process of its own, the run starting at time 0
    (the workers' times are time.monotonic(), the shards' CLOCK_MONOTONIC: one axis)."""
    files = [workdir / f"w{rank}.trace.json" for rank in range(len(workers))]
    traces = [json.loads(f.read_text())["traceEvents"]
              for f in files + [shard_trace] if f and f.exists()]
    start = min(e["ts"] for events in traces for e in events if "ts" in e)
    for events in traces:
        first, pids = len({e["pid"] for e in TRACE_EVENTS}), {}  # this file's pids -> ours
        for event in events:
            event["pid"] = pids.setdefault(event["pid"], first + len(pids))
            if "ts" in event:
                event["ts"] -= start
            if event.get("name") == "process_name":
                event["args"]["name"] = f"{label} {event['args']['name']}"
            TRACE_EVENTS.append(event)
    pathlib.Path(args.trace).write_text(json.dumps({"traceEvents": TRACE_EVENTS,
                                                    "displayTimeUnit": "ms"}))


def model_bytes(model):
    sys.path.insert(0, str(HERE))
    import torch_e2e_worker
    return sum(p.numel() * 4 for p in torch_e2e_worker.make_model(model).parameters())


def choose_rates(args, model, compute_s, param_bytes):
    """The rates to run: each of --rates, "equal" and "exceed" from the measured compute."""
    rates = []
    for name in args.rates.split(","):
        if name == "unshaped":
            rates.append(None)
        elif name == "equal":
            rates.append(round_rate(8 * param_bytes / compute_s))
        elif name == "exceed":
            rates.append(round_rate(8 * param_bytes / (EXCEED_FACTOR * compute_s)))
        else:
            rates.append(parse_rate(name))
    log(f"{model}: {param_bytes / 1e6:.1f} MB of parameters per step each way, compute "
        f"{compute_s:.3f} s/step; rates: " + ", ".join(rate_name(r) for r in rates) +
        f" (equal: {param_bytes / 1e6:.1f} MB in {compute_s:.3f} s; exceed: "
        f"{EXCEED_FACTOR} x that)")
    return rates


def summarize(runs, modes):
    """Per mode: median and range of the iteration time and of the ratio to DDP (per repeat,
    DDP's time of the same repeat / the mode's)."""
    summary = {}
    by_repeat = {}
    for run in runs:
        by_repeat.setdefault(run["repeat"], {})[run["mode"]] = run
    for mode in modes:
        mine = [r for r in runs if r["mode"] == mode]
        times = [r["iteration_s"] for r in mine]
        cpu = [r["cpu_s_per_step_total"] for r in mine]
        entry = {"iteration_s": spread(times), "samples_per_s": spread(
            [r["samples_per_s"] for r in mine]), "cpu_s_per_step_total": spread(cpu),
            "cpu_s_per_step": {k: statistics.median(r["cpu_s_per_step"][k] for r in mine)
                               for k in mine[0]["cpu_s_per_step"]}}
        ratios = [rep["ddp"]["iteration_s"] / rep[mode]["iteration_s"]
                  for rep in by_repeat.values() if "ddp" in rep and mode in rep]
        if ratios:
            entry["ratio_to_ddp"] = spread(ratios)
        fifo = [rep["fifo"]["iteration_s"] / rep[mode]["iteration_s"]
                for rep in by_repeat.values() if "fifo" in rep and mode in rep]
        if fifo and mode == "priority":
            entry["ratio_to_fifo"] = spread(fifo)
        # Every other mode's time / this mode's, per repeat (above 1: this mode is faster).
        entry["speedup_over"] = {
            other: spread([rep[other]["iteration_s"] / rep[mode]["iteration_s"]
                           for rep in by_repeat.values() if other in rep and mode in rep])
            for other in modes if other != mode}
        if "wire_bytes" in mine[0]:
            entry["wire_sent_of_raw"] = {
                d: spread([r["wire_bytes"][d]["sent"] / r["wire_bytes"][d]["raw"] for r in mine])
                for d in ("push", "pull")}
        summary[mode] = entry
    return summary


def spread(values):
    return {"median": statistics.median(values), "min": min(values), "max": max(values),
            "n": len(values)}


def benchmark_model(args, use_netns, model):
    log(f"{model}: measuring compute (both workers, no communication)")
    network = Network(False, None)
    try:
        local = run_mode(args, network, model, "local", steps=args.steps, warmup=args.warmup)
    finally:
        network.close()
    param_bytes = model_bytes(model)
    out = {"model": model, "param_bytes": param_bytes, "compute": local, "rates": []}
    modes = args.modes.split(",")
    for mode in modes:
        check_mode(mode)
    for bits in choose_rates(args, model, local["iteration_s"], param_bytes):
        network = Network(use_netns, bits)
        runs = []
        try:
            for repeat in range(args.repeats):
                order = modes[repeat % len(modes):] + modes[:repeat % len(modes)]
                for mode in order:
                    run = run_mode(args, network, model, mode, steps=args.steps,
                                   warmup=args.warmup)
                    run["repeat"] = repeat
                    runs.append(run)
                    log(f"  {model} {rate_name(bits)} repeat {repeat + 1}/{args.repeats} "
                        f"{mode:8}: {run['iteration_s']:.3f} s/step, CPU "
                        f"{run['cpu_s_per_step_total']:.3f} s/step "
                        f"({', '.join(f'{k} {v:.3f}' for k, v in run['cpu_s_per_step'].items())})")
            drops = network.links.tbf_drops() if network.links else 0
        finally:
            network.close()
        out["rates"].append({"name": rate_name(bits), "bits_per_s": bits, "tbf_drops": drops,
                             "runs": runs, "summary": summarize(runs, modes)})
    return out


def cross_check(args, use_netns, model):
    """psched priority vs DDP in float64: the largest parameter difference after the steps."""
    network = Network(use_netns, None)
    try:
        results = {mode: run_mode(args, network, model, mode, steps=args.check_steps, warmup=0,
                                  float64=True, save=True) for mode in ("priority", "ddp")}
    finally:
        network.close()
    psched_p, ddp_p = results["priority"]["parameters"], results["ddp"]["parameters"]
    diff, where = 0.0, ""
    for rank in range(WORKERS):
        for name, value in ddp_p[rank].items():
            d = (psched_p[rank][name] - value).abs().max().item()
            if d > diff:
                diff, where = d, name
    moved = max((ddp_p[0][n] - v).abs().max().item()
                for n, v in initial_parameters(args, model).items())
    sensitivity = run_sensitivity(args, model)
    ok = diff <= CHECK_TOLERANCE
    log(f"check {model}: psched vs DDP after {args.check_steps} float64 steps: max |diff| "
        f"{diff:.3g} ({where}) {'<=' if ok else '>'} {CHECK_TOLERANCE:g}; the parameters moved "
        f"up to {moved:.3g}; a {sensitivity['relative']:g} relative change of each averaged "
        f"gradient moves them by {sensitivity['max_abs_diff']:.3g} "
        f"({sensitivity['parameter']})")
    return {"model": model, "steps": args.check_steps, "max_abs_diff": diff, "parameter": where,
            "tolerance": CHECK_TOLERANCE, "passed": ok, "max_update": moved,
            "sensitivity": sensitivity}


def initial_parameters(args, model):
    import torch
    import torch_e2e_worker
    torch.manual_seed(args.seed)  # as the workers build it
    return {n: p.detach().double() for n, p in
            torch_e2e_worker.make_model(model).double().named_parameters()}


def run_sensitivity(args, model):
    workdir = pathlib.Path(tempfile.mkdtemp(prefix=f"torch_e2e-{model}-sensitivity-"))
    spec = {"model": model, "mode": "sensitivity", "batch": args.batch, "lr": args.lr,
            "momentum": args.momentum, "seed": args.seed, "steps": args.check_steps,
            "float64": True, "workers": WORKERS, "relative": 1e-7,
            "out": str(workdir / "out.json")}
    subprocess.run([PYTHON, str(WORKER), json.dumps(spec)], check=True,
                   env=worker_env(args, "lo"))
    result = json.loads((workdir / "out.json").read_text())
    shutil.rmtree(workdir)
    return result


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", default="resnet18,vgg11,transformer",
                        help="resnet18, vgg11, transformer, tiny (comma-separated; '' for none)")
    parser.add_argument("--modes", default="priority,fifo,ddp")
    parser.add_argument("--rates", default="unshaped,equal,exceed",
                        help="unshaped, equal, exceed, or rates like 2.5gbit, 400mbit")
    parser.add_argument("--steps", type=int, default=20, help="steps per run, warm-up included")
    parser.add_argument("--warmup", type=int, default=3, help="steps not measured")
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--partition-bytes", default="256KiB", help="the priority mode's")
    parser.add_argument("--credit-bytes", default="2MiB", help="the priority mode's")
    parser.add_argument("--batch", type=int, default=16, help="samples per worker and step")
    parser.add_argument("--buffers", choices=("average", "local"), default="average",
                        help="psched.torch's buffers= (BatchNorm's statistics averaged over the "
                             "workers each step, or each worker's own)")
    parser.add_argument("--lr", type=float, default=0.01)
    parser.add_argument("--momentum", type=float, default=0.9)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--check", default="", help="models to cross-check in float64")
    parser.add_argument("--check-steps", type=int, default=3)
    parser.add_argument("--links", choices=("auto", "netns", "loopback"), default="auto",
                        help="auto: namespaces with tbf where root can make them, else loopback")
    parser.add_argument("--timeout", type=float, default=600, help="seconds per run")
    parser.add_argument("--build", default=str(ROOT / "build"), help="psched's build folder")
    parser.add_argument("--json", help="write the results here (default: stdout)")
    parser.add_argument("--trace", help="write every run's Chrome trace here (psched.torch's "
                        "partitions and waits, each worker's forward/backward/step phases, "
                        "and each shard's receive/apply/wait/answer per partition)")
    parser.add_argument("--table", nargs="+", metavar="JSON",
                        help="print a Markdown table of these result files and exit")
    parser.add_argument("--plot", metavar="FILE", help="with --table: also draw step time "
                        "per mode against link rate, one panel per model (.svg, .png)")
    args = parser.parse_args(argv)
    args.server = str(pathlib.Path(args.build) / "apps" / "psched-server")
    args.python_path = str(pathlib.Path(args.build) / "python")
    return args


def choose_links(requested):
    """Whether to use namespaces, and why not when not."""
    if requested == "loopback":
        return False, "--links loopback"
    why = links_lib.unavailable_reason()
    if why and requested == "netns":
        raise SystemExit(f"torch_e2e: --links netns unavailable: {why}")
    return why is None, why


def missing_packages(args):
    """What the requested models need and this interpreter lacks, or None."""
    import importlib.util
    needed = ["torch"]
    if {"resnet18", "vgg11"} & set(args.models.split(",") + args.check.split(",")):
        needed.append("torchvision")
    missing = [name for name in needed if importlib.util.find_spec(name) is None]
    return " and ".join(f"no {name}" for name in missing) or None


def main(argv):
    args = parse_args(argv)
    if args.table:
        results = [json.loads(pathlib.Path(p).read_text()) for p in args.table]
        print(table(results))
        if args.plot:
            plot(results, args.plot)
        return 0
    for path in (args.server, pathlib.Path(args.python_path) / "psched"):
        if not os.path.exists(path):
            raise SystemExit(f"torch_e2e: {path} missing: build psched first (scripts/build)")
    missing = missing_packages(args)
    if missing:
        log(f"torch_e2e: skipped: {missing} (scripts/setup installs Debian's python3-torch and "
            "python3-torchvision)")
        return SKIPPED
    use_netns, why = choose_links(args.links)
    if not use_netns:
        log(f"torch_e2e: running over loopback, unshaped ({why})")
    import torch
    output = {"command": " ".join(["bench/torch_e2e.py", *argv]),
              "links": "netns" if use_netns else f"loopback ({why})",
              "cores": os.cpu_count(), "torch": torch.__version__,
              "workers": WORKERS, "shards": SHARDS, "batch": args.batch,
              "steps": args.steps, "warmup": args.warmup, "repeats": args.repeats,
              "priority_scheduler": scheduler_yaml(args, "priority"),
              "loadavg_start": os.getloadavg(), "check": [], "models": []}
    if not use_netns and args.rates != "unshaped":
        log("torch_e2e: without namespaces only the unshaped rate runs")
        args.rates = "unshaped"
    for model in filter(None, args.check.split(",")):
        output["check"].append(cross_check(args, use_netns, model))
    for model in filter(None, args.models.split(",")):
        output["models"].append(benchmark_model(args, use_netns, model))
    output["loadavg_end"] = os.getloadavg()
    if output["models"]:
        log(table([output]))
    text = json.dumps(output, indent=1)
    if args.json:
        pathlib.Path(args.json).write_text(text + "\n")
    else:
        print(text)
    return 0 if all(c["passed"] for c in output["check"]) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
