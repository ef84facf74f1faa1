# SPDX-License-Identifier: Apache-2.0
"""One worker process of bench/torch_e2e.py (started by it, one per rank), or its float64
sensitivity probe. Not meant to be run by hand: the argument is a JSON spec that torch_e2e.py
writes; the result is a JSON file at spec["out"].

Modes:
  local      torch.optim.SGD on this worker's data alone: the compute time, no communication
  ddp        DistributedDataParallel (gloo, default buckets) + torch.optim.SGD;
             ddp+fp16 with torch's fp16_compress_hook
  priority   psched.torch.DistributedModel, sync mode, the deployment's scheduler
  fifo       the same; the deployment written for it schedules in arrival order
The same seeds give every mode the same initial weights and, per rank and step, the same data
and dropout masks.
"""
import json
import resource
import sys
import time

import torch
import torch.nn.functional as F

VOCAB, SEQ = 1000, 32  # the Transformer's synthetic tokens
CLASSES = 10
POOL = 4  # distinct batches per rank, cycled (generating data is not what is measured)


class TokenClassifier(torch.nn.Module):
    """A small Transformer encoder on token ids: embedding + learned positions, 4 layers of
    torch.nn.TransformerEncoderLayer (d_model 256, 4 heads, 1024 wide), mean-pooled, linear."""

    def __init__(self, d_model=256, layers=4):
        super().__init__()
        self.embed = torch.nn.Embedding(VOCAB, d_model)
        self.position = torch.nn.Parameter(torch.zeros(SEQ, d_model).normal_(0, 0.02))
        layer = torch.nn.TransformerEncoderLayer(d_model, 4, 4 * d_model, batch_first=True)
        self.encoder = torch.nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.head = torch.nn.Linear(d_model, CLASSES)

    def forward(self, tokens):
        return self.head(self.encoder(self.embed(tokens) + self.position).mean(dim=1))


def tiny():
    """For the smoke test: one conv layer with batch norm and a linear layer."""
    return torch.nn.Sequential(
        torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.BatchNorm2d(8), torch.nn.ReLU(),
        torch.nn.MaxPool2d(4), torch.nn.Flatten(), torch.nn.Linear(8 * 8 * 8, CLASSES))


def make_model(name):
    """An untrained model (no weights are downloaded); its inputs are 32x32 images or tokens."""
    if name == "transformer":
        return TokenClassifier()
    if name == "tiny":
        return tiny()
    import torchvision
    return {"resnet18": torchvision.models.resnet18,
            "vgg11": torchvision.models.vgg11}[name](num_classes=CLASSES)


def make_batches(model, batch, seed, rank, dtype):
    generator = torch.Generator().manual_seed(seed * 1000 + rank)
    batches = []
    for _ in range(POOL):
        if model == "transformer":
            x = torch.randint(VOCAB, (batch, SEQ), generator=generator)
        else:
            x = torch.randn(batch, 3, 32, 32, generator=generator).to(dtype)
        batches.append((x, torch.randint(CLASSES, (batch,), generator=generator)))
    return batches


def seed_step(spec, rank, step):
    """Dropout masks depend only on (seed, rank, step), in every mode and in the probe."""
    torch.manual_seed(spec["seed"] * 7919 + rank * 1009 + step)


def cpu_seconds():
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def build(spec):
    dtype = torch.float64 if spec["float64"] else torch.float32
    torch.manual_seed(spec["seed"])  # the same initial weights in every process
    return make_model(spec["model"]).to(dtype), dtype


def train(spec):
    rank = spec["rank"]
    model, dtype = build(spec)
    batches = make_batches(spec["model"], spec["batch"], spec["seed"], rank, dtype)
    mode, _, variant = spec["mode"].partition("+")  # the deployment file says psched's format
    if mode in ("priority", "fifo"):
        import psched.torch
        model = psched.torch.DistributedModel(model, "sgd", lr=spec["lr"],
                                              momentum=spec["momentum"],
                                              config=spec["config"], worker=rank,
                                              trace=spec.get("trace"),
                                              buffers=spec.get("buffers", "average"))
        optimizer = None
        module = model.module
    else:
        if mode == "ddp":
            import torch.distributed as dist
            dist.init_process_group("gloo", init_method=spec["init_method"], rank=rank,
                                    world_size=spec["workers"])
            model = torch.nn.parallel.DistributedDataParallel(model)
            if variant == "fp16":
                from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
                model.register_comm_hook(None, default_hooks.fp16_compress_hook)
            module = model.module
        else:
            module = model
        optimizer = torch.optim.SGD(model.parameters(), lr=spec["lr"],
                                    momentum=spec["momentum"])
    steps, warmup = spec["steps"], spec["warmup"]
    starts, losses, phases = [], [], []  # phases: (name, step, monotonic start, end)
    window = {}

    def phase(name, step, begin):
        phases.append((name, step, begin, time.monotonic()))
        return phases[-1][3]

    for step in range(steps):
        if step == warmup:
            window["start"] = (time.time(), cpu_seconds())
        starts.append(time.perf_counter())
        x, y = batches[step % POOL]
        seed_step(spec, rank, step)
        model.zero_grad(set_to_none=True)
        now = time.monotonic()
        loss = F.cross_entropy(model(x), y)  # psched: each layer waits for its fresh values
        now = phase("forward", step, now)
        loss.backward()  # psched: pushes each gradient as it is produced
        now = phase("backward", step, now)
        if optimizer is not None:
            optimizer.step()
            phase("optimizer step", step, now)
        losses.append(loss.item())
    if optimizer is None:
        now = time.monotonic()
        model.synchronize()  # the last step's fresh values are in the parameters
        phase("synchronize", steps - 1, now)
    starts.append(time.perf_counter())
    window["end"] = (time.time(), cpu_seconds())
    if spec.get("trace"):
        write_trace(spec, phases)
    result = {"rank": rank, "step_s": [b - a for a, b in zip(starts, starts[1:])],
              "loss": losses, "window_wall": [window["start"][0], window["end"][0]],
              "cpu_s": window["end"][1] - window["start"][1], "cpu_s_total": cpu_seconds()}
    if spec.get("save"):
        torch.save({n: p.detach().clone() for n, p in module.named_parameters()}, spec["save"])
    if mode in ("priority", "fifo"):
        model.client.close()
    elif mode == "ddp":
        torch.distributed.destroy_process_group()
    return result


def write_trace(spec, phases):
    """Adds a lane of the trainer's phases per step to this worker's Chrome trace: the one
    psched.torch wrote at synchronize() (its partitions and waits), or a new one. Times are
    time.monotonic() in microseconds, as psched.torch's."""
    name = f"{spec['mode']} / worker {spec['rank']}"
    if spec["mode"].partition("+")[0] in ("priority", "fifo"):
        with open(spec["trace"]) as f:
            trace = json.load(f)
        for event in trace["traceEvents"]:
            if event["name"] == "process_name":
                event["args"]["name"] = name
    else:
        trace = {"traceEvents": [{"ph": "M", "name": "process_name", "pid": 0,
                                  "args": {"name": name}}], "displayTimeUnit": "ms"}
    trainer_lane = 10000  # below the partitions' lanes (0, 1, ...)
    trace["traceEvents"].append({"ph": "M", "name": "thread_name", "pid": 0,
                                 "tid": trainer_lane, "args": {"name": "trainer"}})
    for phase_name, step, begin, end in phases:
        trace["traceEvents"].append({"ph": "X", "name": phase_name, "pid": 0,
                                     "tid": trainer_lane, "ts": begin * 1e6,
                                     "dur": (end - begin) * 1e6, "args": {"step": step}})
    with open(spec["trace"], "w") as out:
        json.dump(trace, out)


def sensitivity(spec):
    """How much the parameters move after spec["steps"] sync steps when each averaged gradient
    is changed by spec["relative"] (elementwise, random sign and size): what a float32-sized
    rounding difference between two correct implementations grows to on this model."""
    def run(perturb):
        model, dtype = build(spec)
        optimizer = torch.optim.SGD(model.parameters(), lr=spec["lr"], momentum=spec["momentum"])
        data = [make_batches(spec["model"], spec["batch"], spec["seed"], rank, dtype)
                for rank in range(spec["workers"])]
        noise = torch.Generator().manual_seed(12345)
        for step in range(spec["steps"]):
            model.zero_grad(set_to_none=True)
            for rank in range(spec["workers"]):  # each rank's own batch-norm statistics
                x, y = data[rank][step % POOL]
                seed_step(spec, rank, step)
                (F.cross_entropy(model(x), y) / spec["workers"]).backward()
            if perturb:
                for p in model.parameters():
                    p.grad.mul_(1 + spec["relative"] * torch.randn(p.shape, generator=noise,
                                                                   dtype=p.dtype))
            optimizer.step()
        return {n: p.detach() for n, p in model.named_parameters()}

    exact, perturbed = run(False), run(True)
    diffs = {n: (exact[n] - perturbed[n]).abs().max().item() for n in exact}
    worst = max(diffs, key=diffs.get)
    return {"relative": spec["relative"], "steps": spec["steps"], "max_abs_diff": diffs[worst],
            "parameter": worst}


def main():
    spec = json.loads(sys.argv[1])
    torch.set_num_threads(spec.get("threads", 1))
    result = sensitivity(spec) if spec["mode"] == "sensitivity" else train(spec)
    with open(spec["out"], "w") as out:
        json.dump(result, out)


if __name__ == "__main__":
    sys.exit(main())
