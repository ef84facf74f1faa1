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

The trained model leaves psched (docs/embeddings.md, "Export and serve"): once the job's shards
have stopped, `psched export` (or export(model, folder, checkpoint_dirs) from the trainer, which
adds the module's state no shard holds) writes it as .npy files and a JSON manifest, and
to_local(model, folder) makes a plain torch.nn.Module of it, each psched table a
torch.nn.EmbeddingBag or Embedding holding every row, predicting bit for bit what the
distributed model predicts. A
DistributedModel's state_dict() synchronizes first and names each table (its rows are on the
shards); load_state_dict on it or its module, a torch table's weight loaded into a psched table,
and torch.save or copy.deepcopy of a connected model are refused, saying what to use instead.
The module's float buffers (BatchNorm's running statistics) are averaged over the workers each
training step unless DistributedModel(..., buffers="local").

Trace: `trace="trace-{worker}.json"` (default: $PSCHED_TRACE) writes a Chrome trace (Perfetto,
chrome://tracing) at every synchronize(): each partition as in `psched-bench --trace`, with the
parameter it belongs to (the newest 65536 partitions between two calls), and each wait of this
process for a fresh value. Times are time.monotonic() in microseconds, so the files of several
workers line up; "{worker}" in the name is replaced by the worker id.
"""
import collections
import copy
import functools
import json
import os
import shutil
import time

import numpy as np
import torch

import psched
import psched.export
from .embedding import Embedding, EmbeddingBag, _Rows

__all__ = ["DistributedModel", "Embedding", "EmbeddingBag", "export", "optimizer_settings",
           "to_local"]

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


class _Buffer:
    """One buffer averaged over the workers (BatchNorm's running statistics, ...): its variable,
    whose memory is the buffer's own, its value before the training forward that changes it,
    the change pushed, and the step of its push not yet waited for (0: none)."""

    def __init__(self, name, own_name, buffer):
        self.name = name  # in the model's state_dict
        self.own_name = own_name  # in its module
        self.memory = buffer
        self.before = torch.empty_like(buffer)
        self.change = torch.empty_like(buffer)
        self.variable = None
        self.pushed = 0
        self.in_flight = 0


# What the shards apply to a buffer's pushed change (before - after): value - mean of the
# workers' changes, the mean of their new values in sync mode.
_BUFFER_OPTIMIZER = psched.Optimizer("sgd", lr=1.0)


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
    buffers: "average" (the default) keeps every persistent float buffer of the module
    (BatchNorm's running_mean and running_var, ...) as DistributedDataParallel's
    broadcast_buffers keeps them the same on every worker, but from every worker's batches: each
    is a psched variable whose update is the mean of the workers' changes in a forward of its
    module in training mode (module.training, whatever the grad mode, as BatchNorm updates them:
    one step of it, so in sync mode every worker runs as many), so in sync mode every worker
    holds the mean of the values each computed; in async and bounded modes each worker's change
    is applied as it comes and a worker holds the value after its own last step. The module's
    next forward waits for it. "local": each worker keeps its own, as a module alone does.
    Integer buffers (num_batches_tracked) and non-persistent ones stay each worker's.
    """

    def __init__(self, module, optimizer=None, *, config=None, worker=None, client=None,
                 trace=None, compression=None, embedding_staleness=None, buffers="average",
                 **settings):
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
        if buffers not in ("average", "local"):
            raise psched.Error(f"buffers={buffers!r}: \"average\" (the workers' buffers kept "
                               "the same) or \"local\" (each worker's own)")
        self._optimizer = optimizer
        self._compression = compression
        self._buffers = _averaged_buffers(module) if buffers == "average" else {}
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
        for owner, entries in self._buffers.items():
            for entry in entries:
                entry.pushed = self.start_step - 1
            owner.register_forward_pre_hook(functools.partial(self._buffers_before, entries))
            owner.register_forward_hook(functools.partial(self._buffers_after, entries))
        for part in module.modules():  # model.module.sub.load_state_dict(...) too
            part._register_load_state_dict_pre_hook(self._refuse_load)
        self._waits = {}  # module -> the entries it registered, which it waits for
        self._observers = [hook for m in module.modules() for hook in (
            m.register_forward_pre_hook(self._register_own),
            m.register_forward_hook(self._register_rest))]

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)

    def state_dict(self, *args, **kwargs):
        """torch's state_dict of the model (keys "module.<name>", as DistributedDataParallel's),
        after synchronize(): every pushed step's update is in the parameters. Each embedding
        table's entry ("<name>._extra_state") names the table and its shape; its rows are on the
        shards (`psched export`, psched.torch.to_local). Use model.module.state_dict() for the
        keys without "module." (a plain model's)."""
        self.synchronize()
        return super().state_dict(*args, **kwargs)

    def load_state_dict(self, state_dict, strict=True):
        """Refused, as is the wrapped module's own load_state_dict: the shards hold the
        parameters, so values loaded here would be overwritten by the next step's fresh values
        (the shards never hear of them)."""
        self._refuse_load()

    def _refuse_load(self, *args):
        raise psched.Error(
            "load_state_dict on a DistributedModel or the module it wraps would be undone at its "
            "next step: the shards "
            "hold the parameters and every step's fresh values come from them. To start a job "
            "from a state dict, load it into the module before wrapping it "
            "(module.load_state_dict(...), then DistributedModel(module): a job that starts "
            "with no checkpoint takes the registered values, the first registration of each "
            "name winning); to resume a job, restart its shards from their checkpoints, or from "
            "its export with optimizer state on any number of shards (psched.torch.export(..., "
            "with_optimizer_state=True), then `psched import`)",
            "invalid_argument")

    def __reduce_ex__(self, protocol):
        raise psched.Error(
            "a DistributedModel cannot be pickled or deep-copied (torch.save(model), "
            "copy.deepcopy): it holds a live connection to the shards and its tables' rows are "
            "there. Save model.state_dict() (dense parameters; each table's entry names the "
            "table), or write the job's model with `psched export` and make a plain torch "
            "module of it with psched.torch.to_local(model, folder)", "invalid_argument")

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
        self._wait(self._buffer_entries())
        for table in self._tables:
            table.synchronize()
        if self._trace:
            self._trace.write(self.client,
                              [*self._parameters_by_id.values(), *self._buffer_entries()])

    def refresh(self):
        """Reads every registered dense parameter's current value on the shards into the module,
        once this worker's pushes are applied. An inference client of serving shards
        (psched-server --serve) calls it when they have loaded a newer version: its lookups read
        the new rows at once, its dense parameters only from here."""
        self._wait(self._parameters_by_id.values())
        self._wait(self._buffer_entries())
        for entry in [*self._parameters_by_id.values(), *self._buffer_entries()]:
            if entry.variable is not None:
                self.client.pull(entry.variable)

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
            # Before every wait but the averaged buffers' of the model's own (registered first).
            module.register_forward_pre_hook(self._check)
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

    def _buffer_entries(self):
        return [entry for entries in self._buffers.values() for entry in entries]

    def _buffers_before(self, entries, module, inputs):
        # Every forward of a module with averaged buffers, as it starts: registered at its
        # first (the shards' value adopted), the last step's mean in the memory, and the value
        # a training forward starts from kept.
        for entry in entries:
            if entry.variable is None:
                entry.variable = self._register_buffer(entry)
                self.client.pull(entry.variable, after=self.start_step - 1)
        for entry in entries:
            if getattr(module, entry.own_name, None) is not entry.memory:
                raise psched.Error(f"buffer '{entry.name}' was replaced after DistributedModel "
                                   "wrapped it (module.to(), .double(), an assignment); psched "
                                   "averages the memory it wrapped")
        self._wait(entries)
        if module.training:
            for entry in entries:
                entry.before.copy_(entry.memory)

    def _register_buffer(self, entry):
        try:
            return self.client.register(entry.name, entry.memory, optimizer=_BUFFER_OPTIMIZER,
                                        compression=psched.Compression())
        except psched.Error as error:
            if error.code != "read_only":
                raise
            raise psched.Error(
                f"{error}; buffer '{entry.name}' is not among the served job's variables: a job "
                "trained with buffers=\"local\" (or before psched averaged buffers) is served "
                "with DistributedModel(..., buffers=\"local\")", error.code) from error

    def _buffers_after(self, entries, module, inputs, output):
        # As a forward of the module in training mode ends: its change of each buffer pushed.
        if not module.training:
            return
        for entry in entries:
            torch.sub(entry.before, entry.memory, out=entry.change)
            entry.pushed += 1
            self.client.push(entry.variable, entry.pushed, entry.change)
            entry.in_flight = entry.pushed

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


def _averaged_buffers(module):
    """By module, its own float buffers as _Buffers named as in module.state_dict(); refuses
    one psched cannot keep in its own memory."""
    out = {}
    for prefix, owner in module.named_modules():
        entries = []
        for name, buffer in owner.named_buffers(recurse=False):
            if (buffer is None or not buffer.is_floating_point()
                    or name in owner._non_persistent_buffers_set):
                continue
            full = f"{prefix}.{name}" if prefix else name
            why = _unsupported(buffer)
            if why:
                raise psched.Error(f"buffer '{full}' is {why}; psched.torch averages contiguous "
                                   "float32 or float64 CPU buffers (buffers=\"local\" keeps "
                                   "each worker's own)")
            entries.append(_Buffer(full, name, buffer))
        if entries:
            out[owner] = entries
    return out


def _is_psched_hook(hook):
    """Whether `hook` is one DistributedModel registered (a method of it, or a partial of one,
    or either wrapped by torch)."""
    function = getattr(hook, "hook", hook)  # torch 2's _WrappedHook
    function = function.func if isinstance(function, functools.partial) else function
    return isinstance(getattr(function, "__self__", None), DistributedModel)


def _local_table(table, name, folder):
    """torch.nn.EmbeddingBag or torch.nn.Embedding holding every row of psched table `table`
    (named `name`) from export folder `folder`, with the module's torch arguments. Refuses a
    table the folder lacks or one of another shape or dtype."""
    entry = folder.table_entry(name)
    have = (table.num_embeddings, table.embedding_dim, psched.embedding._DTYPES[table.dtype])
    found = (entry["num_embeddings"], entry["dim"], entry["dtype"])
    if have != found:
        raise psched.Error(
            f"table '{name}' is {have[0]} x {have[1]} {have[2]} in the model but "
            f"{found[0]} x {found[1]} {found[2]} in {folder.path}: the export is of another "
            "model", "shape_mismatch")
    weight = torch.empty(table.num_embeddings, table.embedding_dim, dtype=table.dtype)
    folder.table(name, out=weight.numpy())
    if table.padding_idx is not None:
        weight[table.padding_idx] = 0  # psched's padding row reads as zeros, never stored
    common = dict(padding_idx=table.padding_idx, sparse=table.sparse, _weight=weight)
    if isinstance(table, EmbeddingBag):
        return torch.nn.EmbeddingBag(table.num_embeddings, table.embedding_dim, mode=table.mode,
                                     include_last_offset=table.include_last_offset, **common)
    return torch.nn.Embedding(table.num_embeddings, table.embedding_dim, **common)


def _load_dense(local, tables, folder):
    """Every trainable parameter of `local` but the weights of `tables` (the module names of
    the tables built from the folder) from the folder's dense variable of its name, each buffer
    the workers averaged from its dense variable too, and each other buffer or frozen parameter
    from the folder's buffers where a trainer added it; refuses a parameter the folder lacks, a
    dense variable the model lacks, or another shape or dtype."""
    trained = {name for name, p in local.named_parameters() if p.requires_grad}
    trained -= {f"{name}.weight" if name else "weight" for name in tables}
    averaged = {name for name, b in local.named_buffers() if b.is_floating_point()}
    averaged &= set(folder.dense_names())
    extra = sorted(set(folder.dense_names()) - trained - averaged)
    if extra:
        raise psched.Error(f"{folder.path} holds dense variable(s) {', '.join(extra)} that the "
                           "model has no trainable parameter or buffer of: the export is of "
                           "another model", "unknown_variable")
    buffers = set(folder.buffer_names())
    with torch.no_grad():
        for name, value in local.state_dict(keep_vars=True).items():
            if name in trained or name in averaged:
                source = folder.dense(name)
            elif name in buffers:
                source = folder.buffer(name)
            else:
                continue  # a table's weight (built from the folder), or state no one exported
            _copy_into(value, source, name, folder)


def _copy_into(tensor, array, name, folder):
    """`array` (numpy, from the folder) into `tensor`, refusing another shape or dtype."""
    dtype = torch.from_numpy(np.empty(0, array.dtype)).dtype
    if tuple(tensor.shape) != array.shape or tensor.dtype != dtype:
        raise psched.Error(f"'{name}' is {tuple(tensor.shape)} {tensor.dtype} in the model but "
                           f"{array.shape} {array.dtype} in {folder.path}", "shape_mismatch")
    tensor.copy_(torch.from_numpy(array.copy()))


def to_local(model, folder):
    """A plain torch.nn.Module computing what `model` computes, with no psched: a copy of
    `model` (a DistributedModel's module, or a module holding psched tables, connected or not:
    a freshly built one for inference will do) in which every psched.torch.EmbeddingBag and
    Embedding is a torch.nn.EmbeddingBag and Embedding (same mode, padding_idx,
    include_last_offset, sparse) holding every row of its table, and every trainable parameter
    holds the shards' value, all from export folder `folder` (`psched export`,
    psched.torch.export). A row the table never stored holds its initial value computed as the
    shards compute it (same init, seed and function), so the module predicts bit for bit what
    the distributed model predicts. Buffers and frozen parameters come from the folder where a
    trainer added them (psched.torch.export), else from `model`.

    A table is found in the folder under its psched name (its name=, else its module name), as
    DistributedModel names it. Raises psched.Error, naming it, for a table or parameter the
    folder lacks, one of another shape or dtype, or a dense variable the model does not have.
    The tables are whole tensors in memory (num_embeddings x dim each)."""
    if not isinstance(folder, psched.export.ExportFolder):
        folder = psched.export.load(folder)
    source = model.module if isinstance(model, DistributedModel) else model
    memo, tables = {}, []
    for name, table in source.named_modules():
        if isinstance(table, _Rows):
            memo[id(table)] = _local_table(table, table.name or name, folder)
            tables.append(name)
    for module in source.modules():  # the copy has none of DistributedModel's hooks
        for hooks in (module._forward_pre_hooks, module._forward_hooks,
                      module._load_state_dict_pre_hooks):
            memo[id(hooks)] = collections.OrderedDict(
                (key, hook) for key, hook in hooks.items() if not _is_psched_hook(hook))
    local = copy.deepcopy(source, memo)
    _load_dense(local, tables, folder)
    return local


def export(model, path, checkpoints, *, with_optimizer_state=False):
    """Writes `model`'s job into the new folder `path`: the tables and the dense variables
    from the job's checkpoints in `checkpoints` (a directory or a list of them: `psched
    export`; with them the buffers the workers averaged), and the module's own state the shards
    never held (frozen parameters, integer buffers, a model's buffers="local") from this
    process's `model`. The job's shards
    must have stopped (SIGTERM writes their last checkpoint): psched export reads checkpoints,
    and a shard writes one on its interval or when it stops, never on request. Checks that the
    export fits `model` (to_local's checks) before it is in place; returns the export's report
    (a dict: shards, step, variables, tables, rows, bytes_written). Raises psched.Error naming
    what is wrong, leaving nothing at `path`. With with_optimizer_state the export also holds
    what the job resumes from: `psched import --from path` makes it the checkpoints of any
    number of shards, from which the job goes on bit for bit (averaged buffers included; state
    no shard held is the export's buffers/)."""
    path = os.fspath(path)
    if os.path.exists(path):
        raise psched.Error(f"export: {path} exists; name a new folder for the export",
                           "bad_config")
    if isinstance(checkpoints, (str, os.PathLike)):
        checkpoints = [checkpoints]
    staging = path + ".trainer-partial"
    shutil.rmtree(staging, ignore_errors=True)  # an interrupted export's
    report = psched._core.export_model([os.fspath(c) for c in checkpoints], staging,
                                       with_optimizer_state)
    try:
        _add_module_state(model, staging)
        to_local(model, staging)  # refuses an export of another model
        os.rename(staging, path)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return report


def _add_module_state(model, folder):
    """The module's state that no psched variable holds (frozen parameters, integer buffers,
    the buffers of a model with buffers="local") into export folder
    `folder`: buffers/<name>.npy each, listed in the manifest's "buffers"."""
    source = model.module if isinstance(model, DistributedModel) else model
    trained = {name for name, p in source.named_parameters() if p.requires_grad}
    manifest_path = os.path.join(folder, "manifest.json")
    with open(manifest_path) as manifest_file:
        manifest = json.load(manifest_file)
    manifest["buffers"] = []
    held = trained | {entry["name"] for entry in manifest["dense"]}  # averaged buffers too
    for name, value in source.state_dict().items():
        if name in held or not isinstance(value, torch.Tensor):
            continue
        file = f"buffers/{_file_name(name)}.npy"
        os.makedirs(os.path.join(folder, "buffers"), exist_ok=True)
        np.save(os.path.join(folder, file), value.detach().cpu().numpy())
        manifest["buffers"].append({"name": name, "file": file, "shape": list(value.shape),
                                    "dtype": str(value.dtype).replace("torch.", "")})
    with open(manifest_path, "w") as manifest_file:
        json.dump(manifest, manifest_file, indent=1)
        manifest_file.write("\n")


def _file_name(name):
    """`name` as a file name, as psched export writes one (model_export.h)."""
    return "".join(c if c.isascii() and (c.isalnum() or c in "_-" or (c == "." and i > 0))
                   else "".join(f"%{b:02X}" for b in c.encode()) for i, c in enumerate(name))
