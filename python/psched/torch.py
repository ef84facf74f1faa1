# SPDX-License-Identifier: Apache-2.0
"""psched.torch: train a PyTorch model through psched with a few added lines.

    import psched.torch
    model = psched.torch.DistributedModel(Net(), optimizer="adam", lr=1e-3)
    for x, y in batches:
        loss = F.cross_entropy(model(x), y)
        loss.backward()       # pushes each gradient as soon as backward produces it
    model.synchronize()       # before reading the parameters outside forward (saving, ...)

The shards run the optimizer; there is no torch.optim optimizer and no optimizer.step(). The
deployment comes from `config` (default: $PSCHED_CONFIG) and the worker id from `worker`
(default: $RANK, as torchrun sets it), or pass a connected psched.Client. Without an optimizer,
DistributedModel(Net()) trains with the deployment's (its `optimizer:` section), the dense
parameters and the embedding tables alike (psched/embedding.py: where that optimizer has a row
formula).

How the overlap works: every parameter is a psched variable whose memory is the parameter's
own storage. A hook on each parameter copies its gradient into the parameter's gradient buffer
(one per parameter, reused every step) and pushes it the moment backward has produced it (the
last layers first); a forward pre-hook on each module waits only for that module's own
parameters, so the next forward starts on the first layer while later layers' updates are
still in flight. The parameters are registered during the first forward, each module's own as
the module starts, so priority is the order in which the modules run: the first layer's
update, needed first, goes first. A parameter of a module that did not run (one its parent
uses directly, such as MultiheadAttention's out_proj, or an unused one) is registered as the
closest module around it that ran ends, in definition order, and waited for as that module
starts.

Rules that follow from it:
- The parameters must be contiguous float32 or float64 CPU tensors (checked when wrapped) and
  must not be replaced afterwards (`p.data = ...`, `.double()`, a new nn.Parameter or module:
  the next forward raises psched.Error naming the parameter).
- Gradients are pushed from inside backward: changes to p.grad after backward (clipping, ...)
  are not seen. p.grad itself is left to torch as usual.
- Each backward() is one step of every parameter it reaches: there is no accumulation of
  gradients over several backward calls before an update.
- In sync mode every worker must produce a gradient for every parameter each iteration (as with
  DistributedDataParallel), or the others wait for it; and every worker's first forward must
  run the modules in the same order (the first registration's priority wins on the shards).

Embedding tables: psched.torch.EmbeddingBag and psched.torch.Embedding (psched/embedding.py)
keep their rows on the shards, each row updated by a row optimizer (sgd, adagrad,
rowwise_adagrad, sparse_adam) from the rows a step touched; a worker pulls only its batch's
rows. They hold no nn.Parameter, so the rules above are about the dense parameters around them.
DistributedModel finds them among the module's modules, names each table after its module name,
gives it the model's client and start_step, and synchronize() waits for their pushes too. Each
training forward of a table (grad enabled, model.train()) is one step of it; a forward under
model.eval() or torch.no_grad() reads the rows after the last step and is no step, so one
worker may evaluate while the others train (psched/embedding.py has the rules).
model.prefetch({table: next_input, ...}) between a step's forward and backward starts the pulls
of the next step's rows, so they travel while this step computes (docs/embeddings.md).

Trace: `trace="trace-{worker}.json"` (default: $PSCHED_TRACE) writes a Chrome trace (Perfetto,
chrome://tracing) at every synchronize(): each partition as in `psched-bench --trace`, with the
parameter it belongs to (the newest 65536 partitions between two calls), and each wait of this
process for a fresh value. Times are time.monotonic() in microseconds, so the files of several
workers line up; "{worker}" in the name is replaced by the worker id.
"""
import functools
import json
import os
import time

import torch

import psched
from .embedding import Embedding, EmbeddingBag, _Rows

__all__ = ["DistributedModel", "Embedding", "EmbeddingBag", "optimizer_settings"]

_WAIT_LANE = 10001  # the trace's lane of waits, below the partitions' lanes (0, 1, ...)


def optimizer_settings(name="sgd", **settings):
    """A psched.Optimizer from torch.optim's name and settings: optimizer_settings("adam",
    lr=1e-3, betas=(0.9, 0.999)) is torch.optim.Adam's formula with those settings. "sgd" with
    momentum is torch.optim.SGD's momentum (psched kind "momentum"). What is left out takes
    torch.optim's default (psched.Optimizer); sgd requires lr, as torch.optim.SGD does."""
    if "betas" in settings:
        settings["beta1"], settings["beta2"] = settings.pop("betas")
    if name == "sgd" and settings.get("momentum", 0) != 0:
        name = "momentum"
    return psched.Optimizer(name, **settings)


def _unsupported(parameter):
    """Why psched cannot train `parameter` in its own memory, or None."""
    if parameter.device.type != "cpu":
        return f"on {parameter.device}"
    if parameter.dtype not in (torch.float32, torch.float64):
        return f"{parameter.dtype}"
    if not parameter.is_contiguous():
        return f"not contiguous (strides {parameter.stride()})"
    return None


class _Parameter:
    """One trained parameter: its variable (once registered), the gradient buffer its pushes
    send, and the step of its push not yet waited for (0: none)."""

    def __init__(self, name, parameter):
        self.name = name
        self.parameter = parameter
        self.memory = parameter.detach()  # the storage registered, whatever happens to `parameter`
        self.gradient = torch.empty_like(self.memory)
        self.variable = None
        self.pushed = 0
        self.in_flight = 0

    def check(self, root):
        """Raises psched.Error when `root` no longer trains the memory that was wrapped."""
        try:
            current = root.get_parameter(self.name)
        except AttributeError:
            current = None
        if current is not self.parameter:
            replaced = "another Parameter or module"
        elif not self.parameter.is_set_to(self.memory):
            replaced = "new memory (p.data = ..., .to(), ...)"
        else:
            return
        raise psched.Error(f"parameter '{self.name}' was replaced by {replaced} after "
                           "DistributedModel wrapped it; psched trains the memory it wrapped")


class _Trace:
    """The Chrome trace file that synchronize() writes (the module docstring)."""

    def __init__(self, path, worker):
        self.path = os.fspath(path).replace("{worker}", str(worker))
        self.events = [
            {"ph": "M", "name": "process_name", "pid": 0,
             "args": {"name": f"psched.torch worker {worker}"}},
            {"ph": "M", "name": "thread_name", "pid": 0, "tid": _WAIT_LANE,
             "args": {"name": "waits for fresh values"}}]

    def waited(self, entry, step, begin, end):
        self.events.append({"ph": "X", "name": f"wait {entry.name}", "pid": 0, "tid": _WAIT_LANE,
                            "ts": begin * 1e6, "dur": (end - begin) * 1e6,
                            "args": {"step": step}})

    def write(self, client, entries):
        """Adds the partitions finished since the last write and rewrites the file."""
        names = {entry.variable.priority: entry.name for entry in entries if entry.variable}
        for event in json.loads(client.chrome_trace("", 0.0))["traceEvents"]:
            if event["ph"] == "M":
                continue
            if event.get("args", {}).get("priority") in names:
                event["args"]["parameter"] = names[event["args"]["priority"]]
            self.events.append(event)
        with open(self.path, "w") as out:
            json.dump({"traceEvents": self.events, "displayTimeUnit": "ms"}, out)


class DistributedModel(torch.nn.Module):
    """Wraps `module` so that its parameters are trained by psched's shards.

    optimizer: a torch.optim name ("sgd", "adam", "adamw", "adagrad", "rmsprop") or psched-only
    "adam_tf", with torch.optim's keyword settings (lr, momentum, betas, weight_decay, ...;
    those left out take torch.optim's defaults, and "sgd" requires lr), or a psched.Optimizer;
    None (the default): the deployment's optimizer: section, which the shards run for a variable
    registered without one (settings without an optimizer are refused). The embedding tables
    among the modules take their own optimizer= or, without one, the deployment's where it has a
    row formula (psched/embedding.py). trace: a Chrome trace file (the module docstring);
    default $PSCHED_TRACE, none when unset. compression: a psched.Compression for every
    parameter and embedding table (default: the deployment's compression: section); a table
    given its own compression= keeps it, and the others take this one as rows can
    (psched.Compression.for_rows: a topk or onebit push goes whole, a topk pull in pull_full).
    The parameters are registered
    under their named_parameters() names during the first forward; the first registration of a
    name wins and every worker adopts the shards' value before the module uses it, so all
    workers start from the same parameters. start_step: the first step this process pushes, 1 in
    a fresh job; a worker that joins a job under way (a restarted one, under torchrun say)
    starts there, from the values the job had after the step before (psched.Client.start_step),
    and the training loop skips the steps done (python/examples/train_digits.py).
    embedding_staleness: how many steps more than the mode allows a prefetched row may lag
    (prefetch(); default 0: the rows the next forward would pull).
    """

    def __init__(self, module, optimizer=None, *, config=None, worker=None, client=None,
                 trace=None, compression=None, embedding_staleness=None, **settings):
        super().__init__()
        self.module = module
        if optimizer is None:
            if settings:
                raise psched.Error(
                    f"settings {sorted(settings)} given without an optimizer; name the one "
                    "they are for (DistributedModel(model, 'sgd', lr=0.1)), or give neither to "
                    "train with the deployment's optimizer")
        elif not isinstance(optimizer, psched.Optimizer):
            optimizer = optimizer_settings(optimizer, **settings)
        elif settings:
            raise psched.Error(f"settings {sorted(settings)} given beside a psched.Optimizer")
        self._optimizer = optimizer
        self._compression = compression
        self._parameters_by_id = {}
        for name, parameter in module.named_parameters():
            if not parameter.requires_grad:
                continue
            why = _unsupported(parameter)
            if why:
                raise psched.Error(f"parameter '{name}' is {why}; psched.torch trains "
                                   "contiguous float32 or float64 CPU tensors")
            self._parameters_by_id[id(parameter)] = _Parameter(name, parameter)
        self.client = client if client is not None else psched.connect(config, worker)
        # A worker that joins a job under way (a restarted one) pushes from the job's step on.
        self.start_step = self.client.start_step
        self._tables = []  # the embedding tables among the modules (psched/embedding.py)
        try:
            for name, table in module.named_modules():
                if isinstance(table, _Rows):
                    # Refuses a bad optimizer; takes the model's compression unless it has one.
                    table.join(self.client, name, self.start_step, compression)
                    if embedding_staleness is not None:
                        table.staleness = embedding_staleness
                    self._tables.append(table)
        except psched.Error:
            if client is None:  # the connection made here
                self.client.close()
            raise
        trace = trace if trace is not None else os.environ.get("PSCHED_TRACE")
        self._trace = _Trace(trace, self.client.worker) if trace else None
        for entry in self._parameters_by_id.values():
            entry.pushed = self.start_step - 1
            entry.parameter.register_hook(functools.partial(self._push, entry))
        self._waits = {}  # module -> the entries it registered, which it waits for
        self._observers = [hook for m in module.modules() for hook in (
            m.register_forward_pre_hook(self._register_own),
            m.register_forward_hook(self._register_rest))]

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)

    def prefetch(self, inputs):
        """Starts the pulls of the next step's rows of every table in `inputs`, a mapping from
        a table (the module, or its name in the model) to the input its next forward takes, or
        to (input, offsets): psched.torch.EmbeddingBag.prefetch, with the model's
        embedding_staleness. Call it between a step's forward and the next step's."""
        by_name = {table.name: table for table in self._tables}
        for key, value in inputs.items():
            table = by_name.get(key) if isinstance(key, str) else key
            if not any(table is mine for mine in self._tables):
                raise psched.Error(f"prefetch: {key!r} is not an embedding table of this model "
                                   f"(its tables: {', '.join(sorted(by_name))})")
            table.prefetch(*(value if isinstance(value, tuple) else (value,)))

    def synchronize(self):
        """Waits until every pushed gradient's update is in the parameters, and until the shards
        have received every embedding table's last push; writes the trace."""
        self._wait(self._parameters_by_id.values())
        for table in self._tables:
            table.synchronize()
        if self._trace:
            self._trace.write(self.client, self._parameters_by_id.values())

    def _register_own(self, module, inputs):
        # First forward, as `module` starts: its own parameters, in the order modules run.
        self._register(module, module.parameters(recurse=False))

    def _register_rest(self, module, inputs, output):
        # First forward, as `module` ends: its submodules' parameters that no hook saw.
        self._register(module, module.parameters())
        if module is self.module:
            for entry in self._parameters_by_id.values():
                if entry.variable is None:  # no longer in the module
                    entry.check(module)
            for hook in self._observers:
                hook.remove()
            module.register_forward_pre_hook(self._check)  # first: before any wait
            for waiter, entries in self._waits.items():
                waiter.register_forward_pre_hook(functools.partial(self._wait_hook, entries))

    def _register(self, module, parameters):
        for parameter in parameters:
            entry = self._parameters_by_id.get(id(parameter))
            if entry is None or entry.variable is not None:
                continue
            entry.check(self.module)
            entry.variable = self.client.register(entry.name, entry.memory,
                                                  optimizer=self._optimizer,
                                                  compression=self._compression)
            self.client.pull(entry.variable, after=self.start_step - 1)
            self._waits.setdefault(module, []).append(entry)

    def _push(self, entry, grad):
        # The client reads entry.gradient until the push's wait returns, so the previous push
        # is waited for (if no forward has) before the buffer is overwritten; autograd may
        # reuse or accumulate into `grad` itself. One buffer keeps the overlap: a forward
        # waits for step k before backward produces step k + 1.
        self._wait([entry])
        entry.gradient.copy_(grad)
        entry.pushed += 1
        self.client.push(entry.variable, entry.pushed, entry.gradient)
        entry.in_flight = entry.pushed

    def _check(self, module, inputs):
        # Every forward after the first, as the model starts.
        for entry in self._parameters_by_id.values():
            entry.check(module)

    def _wait_hook(self, entries, module, inputs):
        self._wait(entries)

    def _wait(self, entries):
        for entry in entries:
            if entry.in_flight:
                step, entry.in_flight = entry.in_flight, 0
                begin = time.monotonic()
                self.client.wait(entry.variable, step)
                if self._trace:
                    self._trace.waited(entry, step, begin, time.monotonic())
