# SPDX-License-Identifier: Apache-2.0
"""psched.torch.EmbeddingBag and psched.torch.Embedding: embedding tables kept on psched's
shards row by row; a worker holds only the rows of the batch in hand.

    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.users = psched.torch.EmbeddingBag(10_000_000, 64, mode="sum",
                                                   optimizer="rowwise_adagrad", lr=0.05)
            self.top = torch.nn.Linear(64, 1)

        def forward(self, ids, offsets):
            return self.top(self.users(ids, offsets))

    model = psched.torch.DistributedModel(Model(), "adam", lr=1e-3)   # the dense part's

Drop-ins: the constructors take torch.nn.EmbeddingBag's and torch.nn.Embedding's arguments in
torch's order with torch's defaults (EmbeddingBag's mode is "mean"), so swapping the class
keeps a model's meaning; psched's own settings (name, optimizer, init, seed, compression,
client, max_rows, admit_after, the row optimizer's settings) are keyword-only. padding_idx is
torch's: the padding id adds nothing to its bag (mode "mean" does not count it), gets no
gradient, and reads as zeros (torch's initial padding row); psched never pulls or pushes it, so
its row on the shards is never touched. sparse is accepted and changes nothing (the pushed
gradient is always the sparse one). What psched cannot honour is refused at construction,
naming the argument: mode "max" (torch has no sparse gradient for it), max_norm and a norm_type
other than 2.0 (torch renormalizes the rows in place at lookup), scale_grad_by_freq,
_weight (rows start on the shards from init and seed), _freeze (a table here is trained), a
device other than the CPU (rows arrive in CPU tensors; move the result) and a dtype other than
float32 or float64 (dtype None: torch's default dtype).

The shards run each table's row optimizer on the rows a step touched: "sgd", "adagrad" (torch's
sparse paths), "rowwise_adagrad" (FBGEMM's EXACT_ROWWISE_ADAGRAD: one accumulator per row) or
"sparse_adam" (torch.optim.SparseAdam), with torch.optim's keyword settings (lr, eps, betas,
lr_decay, initial_accumulator_value; weight_decay and momentum are refused). Without
optimizer=, a table takes the deployment's `optimizer:` section, the one the dense variables
get by default, where it has a row formula: kind sgd becomes row "sgd" with its lr, kind adagrad
row "adagrad" with its lr, eps, lr_decay and initial_accumulator_value (weight_decay must be 0).
Another kind, or a client that was not made from a deployment file (psched.connect(config);
psched.Client.deployment is None), is refused naming what to pass; settings without optimizer=
are refused too. The table learns it when it gets its client (construction or
DistributedModel), from the worker's deployment file, which names the shards' optimizer when
both read the same file.

A forward pulls the rows of its unique ids into a fresh tensor and runs torch's own
embedding_bag (or embedding) on it; backward pushes that tensor's gradient: one row per unique
id, its duplicates summed (torch's coalesced sparse gradient). The module holds no weight tensor
and no nn.Parameter.

Steps: each training forward (grad enabled and the module in training mode) is the table's
next step k. It reads the rows once step k - 1's update of them is applied (sync mode: every
worker's; async: this worker's own), and its backward pushes step k. A step whose backward
never reached the table is pushed empty when the next training forward starts, so that sync
steps close. A forward with grad disabled (torch.no_grad()) or under module.eval() reads the
rows after the last pushed step (it pulls) and is no step: it pushes nothing, opens no step and
its result carries no gradient to the table, so one worker may evaluate while the others do
not. So:
- call each table once per iteration (features that share a table: concatenate their ids); a
  second training forward before the first one's backward closes the first step empty, and
  that backward then raises psched.Error, as does a second backward through one forward;
- in sync mode every worker runs each table's training forward the same number of times.

Prefetch: bag.prefetch(next_input), called between a step's forward and the next one's (after
the forward, before backward, overlaps most), starts the pull of the next step's rows; that
forward, given equal ids, waits only for what has not arrived, and reads the values that
forward would have pulled. staleness s (default 0) lets the rows lack the last s steps'
updates, so the pull need not wait for this step, and that forward need not wait for the last
s pushes to arrive (their errors are raised s steps later; docs/embeddings.md, "Prefetch").

Inside DistributedModel a table takes its module name (named_modules()) unless given `name`,
the model's client, and the model's start_step; DistributedModel.synchronize() waits for its
last push. Standalone, give `client` (a psched.Client) and `name`, and call synchronize(). The
table is registered at its first forward or rows(); the first registration of a name wins, and
a row that was never trained holds its initial value, a function of `init`, `seed` and its id
only, the same on every worker and any number of shards.
"""
import functools

import torch
import torch.nn.functional as F

import psched

_DTYPES = {torch.float32: "float32", torch.float64: "float64"}
# The shards' row optimizers (optim/row_optimizer.h), checked here too so that a wrong name
# fails at construction rather than at the first forward.
_ROW_OPTIMIZERS = ("sgd", "adagrad", "rowwise_adagrad", "sparse_adam")
_SETTINGS = ("lr", "eps", "betas", "lr_decay", "initial_accumulator_value", "weight_decay",
             "momentum")
# The deployment's optimizer kinds that have a row formula, and the settings of theirs the row
# optimizer of the same name reads (optim/optimizer.h beside optim/row_optimizer.h).
_DEPLOYMENT_ROW_SETTINGS = {"sgd": ("lr",),
                            "adagrad": ("lr", "eps", "lr_decay", "initial_accumulator_value")}


def row_settings(optimizer, settings):
    """register_table's settings from torch.optim's keywords (betas -> beta1, beta2). Refuses an
    unknown optimizer or keyword, and "sgd" without lr (torch.optim.SGD has no default); the
    values are checked by the shards' rules at registration."""
    if optimizer not in _ROW_OPTIMIZERS:
        raise psched.Error(f"row optimizer '{optimizer}' is unknown; psched tables run "
                           f"{', '.join(_ROW_OPTIMIZERS)}")
    for setting in settings:
        if setting not in _SETTINGS:
            raise psched.Error(f"setting '{setting}' is unknown; row optimizers take "
                               f"{', '.join(_SETTINGS)}")
    if optimizer == "sgd" and "lr" not in settings:
        raise psched.Error("row optimizer 'sgd' needs lr: torch.optim.SGD has no default "
                           "learning rate")
    settings = dict(settings)
    if "betas" in settings:
        settings["beta1"], settings["beta2"] = settings.pop("betas")
    return settings


def deployment_row_optimizer(client, table):
    """(row optimizer, settings) that table `table` takes when given no optimizer: the
    deployment's optimizer: section (client.deployment.optimizer) where its kind has a row
    formula (_DEPLOYMENT_ROW_SETTINGS), with its settings. Refuses, naming what to pass, a
    client without a deployment, another kind, or a weight_decay (which would change rows a
    step did not touch)."""
    choose = (f"pass optimizer= (one of {', '.join(_ROW_OPTIMIZERS)}) and its settings, e.g. "
              "optimizer='adagrad', lr=0.01")
    deployment = getattr(client, "deployment", None)
    if deployment is None:
        raise psched.Error(f"table '{table}' has no optimizer= and its client was not made from "
                           "a deployment file (psched.connect(config)), so there is no "
                           f"deployment optimizer to take; {choose}")
    spec = deployment.optimizer
    where = f"the deployment's optimizer ({deployment.path}: kind {spec.kind}"
    if spec.kind not in _DEPLOYMENT_ROW_SETTINGS:
        raise psched.Error(f"table '{table}' has no optimizer= and {where}) has no row formula "
                           f"(kinds sgd and adagrad have one); {choose}")
    if spec.weight_decay != 0:
        raise psched.Error(f"table '{table}' has no optimizer= and {where}, weight_decay "
                           f"{spec.weight_decay}) decays every row, which a row optimizer "
                           f"cannot (it changes only the rows a step touched); {choose}")
    return spec.kind, {name: getattr(spec, name) for name in _DEPLOYMENT_ROW_SETTINGS[spec.kind]}


def _refuse_unsupported(kind, max_norm, norm_type, scale_grad_by_freq, _weight, _freeze, device,
                        dtype):
    """Raises psched.Error naming the first torch argument psched.torch.`kind` cannot honour,
    its value and why; returns the rows' dtype (dtype None: torch's default dtype)."""
    why = None
    if max_norm is not None:
        why = ("max_norm", max_norm, "torch renormalizes the looked-up rows in place at each "
               "forward; psched's rows change only by their row optimizer on the shards")
    elif norm_type != 2.0:
        why = ("norm_type", norm_type, "it is max_norm's norm, and max_norm is not supported")
    elif scale_grad_by_freq:
        why = ("scale_grad_by_freq", scale_grad_by_freq, "psched pushes each step's summed "
               "gradient unscaled")
    elif _weight is not None:
        why = ("_weight", f"a tensor of shape {tuple(_weight.shape)}", "the rows live on the "
               "shards and start from init= and seed= (a function of the id)")
    elif _freeze:
        why = ("_freeze", _freeze, "a psched table is trained by its row optimizer; keep a "
               "frozen table in torch.nn.Embedding")
    elif device is not None and torch.device(device).type != "cpu":
        why = ("device", device, "rows are pulled into CPU tensors and the lookup runs there; "
               "move its result with .to()")
    dtype = torch.get_default_dtype() if dtype is None else dtype
    if why is None and dtype not in _DTYPES:
        why = ("dtype", dtype, "rows are torch.float32 or torch.float64")
    if why is not None:
        argument, value, reason = why
        raise psched.Error(f"psched.torch.{kind} does not support {argument}={value!r}: {reason}")
    return dtype


def _padding_index(kind, padding_idx, num_embeddings):
    """torch's padding_idx, a negative one counted from the end (as torch does); refuses one
    outside the table."""
    if padding_idx is None:
        return None
    if not -num_embeddings <= padding_idx < num_embeddings:
        raise psched.Error(f"psched.torch.{kind}: padding_idx={padding_idx} is outside the table "
                           f"of {num_embeddings} rows (expected -{num_embeddings} to "
                           f"{num_embeddings - 1})")
    return padding_idx % num_embeddings


class _Rows(torch.nn.Module):
    """What EmbeddingBag and Embedding share: the table, its steps, its pulls and pushes."""

    def __init__(self, num_embeddings, embedding_dim, *, padding_idx, max_norm, norm_type,
                 scale_grad_by_freq, sparse, _weight, _freeze=False, device, dtype, name,
                 optimizer, init, seed, compression, client, max_rows, admit_after, settings):
        super().__init__()
        kind = type(self).__name__
        self.dtype = _refuse_unsupported(kind, max_norm, norm_type, scale_grad_by_freq, _weight,
                                         _freeze, device, dtype)
        if client is not None and not name:
            raise psched.Error(f"a standalone psched.torch.{kind} (client given) needs a name")
        unknown = sorted(set(settings) - set(_SETTINGS))
        if unknown:
            raise psched.Error(
                f"psched.torch.{kind} got an unknown keyword '{unknown[0]}': it takes "
                f"torch.nn.{kind}'s arguments, psched's (name, optimizer, init, seed, "
                "compression, client, max_rows, admit_after) and the row optimizer's settings "
                f"({', '.join(_SETTINGS)})")
        if optimizer is None and settings:
            raise psched.Error(
                f"psched.torch.{kind}: settings {', '.join(sorted(settings))} given without "
                "optimizer=; name the row optimizer they are for (e.g. optimizer='sgd', "
                "lr=0.1), or give neither to take the deployment's optimizer")
        # torch's attributes, as torch.nn.Embedding and EmbeddingBag have them.
        self.num_embeddings, self.embedding_dim = num_embeddings, embedding_dim
        self.padding_idx = _padding_index(kind, padding_idx, num_embeddings)
        self.max_norm, self.norm_type = max_norm, norm_type
        self.scale_grad_by_freq, self.sparse = scale_grad_by_freq, sparse
        self.name, self.optimizer = name, optimizer
        self.settings = row_settings(optimizer, settings) if optimizer is not None else None
        self.init, self.seed, self.compression = init, seed, compression
        self._model_compression = None  # DistributedModel's compression=, when it gave one
        self.max_rows, self.admit_after = max_rows, admit_after
        self.client = client
        self.table = None  # the psched.Table, once registered
        self.pushed = client.start_step - 1 if client is not None else 0  # the last step pushed
        self._open = 0  # the step whose forward ran and whose gradient is not pushed (0: none)
        self._unwaited = []  # the steps of the pushes not waited for, oldest first
        self.staleness = None  # prefetch()'s default staleness (None: 0)
        self._prefetched = None  # the prefetch under way (_Prefetch), if any
        self.prefetches = self.prefetch_misses = 0  # started; dropped unused (other input)
        if client is not None:
            self._take_deployment_optimizer()

    def join(self, client, name, start_step, compression=None):
        """DistributedModel's: train through `client` from `start_step` on, named `name` unless
        the module was given a name; `compression`, the model's for every variable, is the
        rows' unless the module was given one (as rows take it: psched.Compression.for_rows)."""
        if self.table is not None:
            raise psched.Error(f"table '{self.name}' was used before DistributedModel wrapped it")
        self.client, self.name, self.pushed = client, self.name or name, start_step - 1
        self._model_compression = compression
        self._take_deployment_optimizer()

    def rows(self, ids):
        """The rows of `ids` (an integer tensor, duplicates allowed) as they are after this
        table's last pushed step: a tensor of shape ids.shape + (embedding_dim,). The padding
        id's rows are zeros (psched does not pull it)."""
        unique, inverse = self._unique(ids)
        return self._padded(self._pull(unique, self.pushed))[inverse]

    def prefetch(self, input, offsets=None, *, staleness=None):
        """Starts pulling the rows of `input` that the table's next step (its next training
        forward) reads, and returns at once: they travel while this step computes.
        That forward, given equal ids, waits only for what has not arrived; given other ids it
        pulls as usual (prefetch_misses counts it). Call it between this step's forward and
        the next one's. offsets: as forward takes it (the rows depend on input alone).

        staleness: 0 (default) reads the rows a pull at the next forward would read: once
        this step's update of them is applied (sync: every worker's, the answer leaving as the
        step closes; bounded: this worker's, the others' within the mode's bound; async: this
        worker's), so a prefetch changes when rows travel, not their values. s > 0 reads them
        once step k - s's update is applied for a step k + 1: they may lack the last s steps'
        updates, this worker's too, as Persia's embedding_staleness, and the pull need not wait
        for this step at all. Default: the table's `staleness` attribute (DistributedModel's
        embedding_staleness), else 0."""
        del offsets
        table = self._registered()
        step = (self._open or self.pushed) + 1
        lag = staleness if staleness is not None else self.staleness or 0
        if lag < 0:
            raise psched.Error(f"table '{self.name}': prefetch staleness {lag} is negative")
        self._drop_prefetch()
        ids, inverse = self._unique(input)
        rows = torch.empty(len(ids), self.embedding_dim, dtype=self.dtype)
        pull = None
        if len(ids):
            pull = self.client.start_pull_rows(table, ids.numpy(), rows.numpy(),
                                               after=max(step - 1 - lag, 0), prefetch=True)
        self._prefetched = _Prefetch(step, input.detach().clone(), ids, inverse, rows, pull,
                                     lag)
        self.prefetches += 1

    def synchronize(self):
        """Waits until every shard has received this table's last push; raises its error."""
        self._wait_pushes(self.pushed)

    def _wait_pushes(self, upto):
        """Waits until every shard has received each of this table's pushes of steps up to
        `upto`; raises the first error among them."""
        while self._unwaited and self._unwaited[0] <= upto:
            self.client.wait_rows(self.table, self._unwaited.pop(0))

    def get_extra_state(self):
        """The table's entry in torch's state_dict ("<module>._extra_state"): it names the table
        and its shape, for its rows are on the shards, not in the state dict (they leave
        through `psched export` and psched.torch.to_local)."""
        return {"psched_table": self.name, "num_embeddings": self.num_embeddings,
                "embedding_dim": self.embedding_dim, "dtype": _DTYPES[self.dtype],
                "rows": "on the shards (psched export writes them out)"}

    def set_extra_state(self, state):
        """load_state_dict of an entry get_extra_state() made: checks that it names a table of
        this name, shape and dtype (psched.Error naming the difference); the rows stay as the
        shards hold them."""
        mine = self.get_extra_state()
        if not isinstance(state, dict) or "psched_table" not in state:
            raise psched.Error(f"table '{self.name}': its state dict entry is {state!r}, not a "
                               "psched table's")
        for key in ("num_embeddings", "embedding_dim", "dtype"):
            if state.get(key) != mine[key]:
                raise psched.Error(
                    f"table '{self.name}': the state dict's table '{state['psched_table']}' has "
                    f"{key} {state.get(key)!r} where this one has {mine[key]!r}")
        if self.name is not None and state["psched_table"] != self.name:
            raise psched.Error(f"table '{self.name}': the state dict names table "
                               f"'{state['psched_table']}'")

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys,
                              unexpected_keys, error_msgs):
        weight = state_dict.get(prefix + "weight")
        if weight is not None:  # refused even with strict=False, which would drop it silently
            raise psched.Error(
                f"psched.torch.{type(self).__name__} '{self.name or prefix[:-1]}' cannot load "
                f"'{prefix}weight' (a torch table's rows, shape {tuple(weight.shape)}): its rows "
                "live on the shards, start from init= and seed= and change only by its row "
                "optimizer; nothing sets them from a tensor. Keep a table given from outside in "
                f"torch.nn.{type(self).__name__}; to bring a psched table's rows into torch, "
                "use psched.torch.to_local(model, export)")
        super()._load_from_state_dict(state_dict, prefix, local_metadata, strict, missing_keys,
                                      unexpected_keys, error_msgs)

    def __reduce_ex__(self, protocol):
        if self.client is not None:
            raise psched.Error(
                f"table '{self.name}' cannot be pickled or deep-copied (torch.save, "
                "copy.deepcopy): it holds a live connection to the shards, which hold its rows. "
                "Save the model's state_dict() (it names the table), or write the job's model "
                "with `psched export` and make a plain torch module of it with "
                "psched.torch.to_local(model, folder)")
        return super().__reduce_ex__(protocol)

    def extra_repr(self):
        padding = "" if self.padding_idx is None else f", padding_idx={self.padding_idx}"
        optimizer = self.optimizer or "the deployment's"
        return (f"{self.num_embeddings}, {self.embedding_dim}{padding}, name={self.name!r}, "
                f"optimizer={optimizer!r}, dtype={self.dtype}")

    def _take_deployment_optimizer(self):
        """Once the table has its client: no optimizer given, the deployment's (refused where
        it has no row formula)."""
        if self.optimizer is None:
            self.optimizer, self.settings = deployment_row_optimizer(self.client, self.name)

    def _lookup(self, input):
        """(rows, inverse): the rows of input's unique ids but the padding id, a leaf whose
        gradient is pushed as this step's in a training forward, and input's indices into them
        (input's shape; the padding id's: len(rows), the row _padded adds)."""
        if not torch.is_grad_enabled() or not self.training:
            ids, inverse = self._unique(input)
            return self._pull(ids, self.pushed), inverse
        self._check_ids(input)
        if self._open:  # its backward never reached this table: the step closes empty
            self._push(self._open, torch.empty(0, dtype=torch.int64),
                       torch.empty(0, self.embedding_dim, dtype=self.dtype))
        step = self.pushed + 1
        fetched = self._take_prefetch(input, step)
        if fetched:
            ids, inverse, rows, lag = fetched
        else:
            ids, inverse = self._unique(input)
            rows = self._pull(ids, step - 1)
            lag = 0
        # The rows lack the last `lag` steps' updates, so the pushes of those steps may still
        # be on their way (a stale prefetch's step never waits for the upload of the one
        # before); older ones have arrived: raise their error, if any.
        self._wait_pushes(step - 1 - lag)
        self._open = step
        rows.requires_grad_()
        rows.register_hook(functools.partial(self._push_gradient, step, ids))
        return rows, inverse

    def _take_prefetch(self, input, step):
        """(ids, inverse, rows) of the prefetch for `step` of `input`, arrived; or None (no
        prefetch, or one of other ids or another step: dropped)."""
        prefetched = self._prefetched
        if prefetched is None:
            return None
        if not prefetched.serves(input, step):
            self._drop_prefetch()
            return None
        self._prefetched = None
        if prefetched.pull is not None:
            prefetched.pull.wait()
        return prefetched.ids, prefetched.inverse, prefetched.rows, prefetched.lag

    def _drop_prefetch(self):
        if self._prefetched is not None:
            self._prefetched = None  # its RowsPull waits for the answer as it goes
            self.prefetch_misses += 1

    def _check_ids(self, ids):
        if ids.dtype not in (torch.int64, torch.int32):
            raise psched.Error(f"table '{self.name}': ids must be torch.int64 or torch.int32, "
                               f"not {ids.dtype}")

    def _unique(self, ids):
        """(unique, inverse): the ids to pull (int64, sorted, without the padding id) and each
        id's index into them, the padding id's len(unique)."""
        self._check_ids(ids)
        unique, inverse = torch.unique(ids, return_inverse=True)
        if self.padding_idx is not None:
            kept = unique != self.padding_idx
            if not kept.all():
                unique = unique[kept]
                inverse = torch.where(kept, kept.cumsum(0) - 1, len(unique))[inverse]
        return unique.to(torch.int64), inverse

    def _padded(self, rows):
        """`rows` with the padding id's row (zeros, torch's initial padding row) after them;
        `rows` itself when there is no padding_idx."""
        if self.padding_idx is None:
            return rows
        return torch.cat([rows, rows.new_zeros(1, self.embedding_dim)])

    def _padding_row(self, rows):
        """The index of the padding row in _padded(rows), for torch's padding_idx."""
        return None if self.padding_idx is None else len(rows)

    def _pull(self, ids, after):
        """A fresh tensor holding the rows of `ids` (unique, int64) once step `after`'s update
        of them is applied."""
        table = self._registered()
        rows = torch.empty(len(ids), self.embedding_dim, dtype=self.dtype)
        if len(ids):
            self.client.pull_rows(table, ids.numpy(), rows.numpy(), after=after)
        return rows

    def _push_gradient(self, step, ids, grad):
        # The hook on step `step`'s rows: autograd has summed the gradients of each id's uses.
        if self._open != step:
            raise psched.Error(
                f"table '{self.name}': a gradient for step {step} came after that step was "
                "pushed (a second backward through one forward, or a second forward of the "
                "table before this backward); each forward of a table is one step")
        self._push(step, ids, grad.detach().contiguous())

    def _push(self, step, ids, gradient):
        # The client keeps `ids` and `gradient` (through their numpy views) until the receipts.
        self.client.push_rows(self.table, ids.numpy(), gradient.numpy(), step)
        self.pushed = step
        self._unwaited.append(step)
        self._open = 0

    def _registered(self):
        if self.table is None:
            if self.client is None:
                raise psched.Error(f"psched.torch.{type(self).__name__} needs a client: wrap "
                                   "its model in psched.torch.DistributedModel or give client=")
            self.table = self.client.register_table(
                self.name, self.num_embeddings, self.embedding_dim, dtype=_DTYPES[self.dtype],
                optimizer=self.optimizer, settings=self.settings, init=self.init,
                seed=self.seed, compression=self._compression(), max_rows=self.max_rows,
                admit_after=self.admit_after)
        return self.table

    def _compression(self):
        """The rows' compression: the module's own, else the model's as rows take it, else None
        (the client's default: the deployment's compression: section, as rows take it)."""
        if self.compression is not None:
            return self.compression
        if self._model_compression is not None:
            return self._model_compression.for_rows()
        return None


class _Prefetch:
    """A prefetch under way: the step it is for, its input (a copy), unique ids, inverse
    indices, the rows tensor being filled, its psched.RowsPull (None: no ids) and its
    staleness."""

    def __init__(self, step, input, ids, inverse, rows, pull, lag):
        self.step, self.input, self.ids, self.inverse = step, input, ids, inverse
        self.rows, self.pull, self.lag = rows, pull, lag

    def serves(self, input, step):
        return (step == self.step and input.shape == self.input.shape
                and input.dtype == self.input.dtype and torch.equal(input, self.input))


_PSCHED_KEYWORDS = """psched's keywords: name: the table's name (default inside
    DistributedModel: the module's name). optimizer and settings: the row optimizer and
    torch.optim's keywords for it (default: the deployment's optimizer where it has a row
    formula; the module docstring). init: how a row starts, ("zeros",), ("uniform", low, high)
    or ("normal", mean, std) (torch's default: N(0, 1)), drawn from `seed` and the id.
    compression: a psched.Compression for the rows' traffic, none, bf16 or fp16 each way (topk
    and onebit are refused); default: DistributedModel's compression=, else the deployment's
    compression: section, either as rows take it (psched.Compression.for_rows: a topk or onebit
    push goes whole, a topk pull in pull_full); a table under min_bytes (num_embeddings x
    embedding_dim x the dtype's bytes) travels whole. client: a psched.Client, for a
    table used outside DistributedModel (then name is required). max_rows, admit_after: the
    table's capacity on each shard (0: the deployment's tables: entry, else none): at most
    max_rows rows stored, the least recently updated evicted; a row stored from its
    admit_after-th update (docs/embeddings.md)."""


class EmbeddingBag(_Rows):
    """torch.nn.EmbeddingBag whose table lives on psched's shards (the module docstring).

    EmbeddingBag(num_embeddings, embedding_dim, max_norm=None, norm_type=2.0,
    scale_grad_by_freq=False, mode="mean", sparse=False, _weight=None,
    include_last_offset=False, padding_idx=None, device=None, dtype=None, *, name=None,
    optimizer=None, init=("normal", 0.0, 1.0), seed=0, compression=None, client=None,
    max_rows=0, admit_after=0, **settings)

    torch's arguments, in torch's order with torch's defaults: mode "mean" or "sum" ("max" is
    refused); padding_idx as torch's (the module docstring); sparse accepted; dtype
    torch.float32 or torch.float64 (None: torch's default dtype); max_norm, norm_type,
    scale_grad_by_freq, _weight and device only at their defaults (device "cpu" too).
    {psched}

    prefetch(input, offsets=None, *, staleness=None): starts pulling the rows of the next step.

    forward(input, offsets=None, per_sample_weights=None): torch.nn.EmbeddingBag's, with its
    result: a 2-D input is one bag per row; a 1-D input is cut into bags at `offsets`.
    """

    def __init__(self, num_embeddings, embedding_dim, max_norm=None, norm_type=2.0,
                 scale_grad_by_freq=False, mode="mean", sparse=False, _weight=None,
                 include_last_offset=False, padding_idx=None, device=None, dtype=None, *,
                 name=None, optimizer=None, init=("normal", 0.0, 1.0), seed=0, compression=None,
                 client=None, max_rows=0, admit_after=0, **settings):
        if mode not in ("sum", "mean"):
            raise psched.Error(f"psched.torch.EmbeddingBag does not support mode={mode!r}: "
                               "mode 'sum' or 'mean' (torch has no sparse gradient for 'max')")
        super().__init__(num_embeddings, embedding_dim, padding_idx=padding_idx,
                         max_norm=max_norm, norm_type=norm_type,
                         scale_grad_by_freq=scale_grad_by_freq, sparse=sparse, _weight=_weight,
                         device=device, dtype=dtype, name=name, optimizer=optimizer, init=init,
                         seed=seed, compression=compression, client=client, max_rows=max_rows,
                         admit_after=admit_after, settings=settings)
        self.mode, self.include_last_offset = mode, include_last_offset

    def forward(self, input, offsets=None, per_sample_weights=None):
        rows, inverse = self._lookup(input)
        return F.embedding_bag(inverse, self._padded(rows), offsets, mode=self.mode,
                               per_sample_weights=per_sample_weights,
                               include_last_offset=self.include_last_offset,
                               padding_idx=self._padding_row(rows))

    def extra_repr(self):
        return f"{super().extra_repr()}, mode={self.mode!r}"


class Embedding(_Rows):
    """torch.nn.Embedding whose table lives on psched's shards (the module docstring).

    Embedding(num_embeddings, embedding_dim, padding_idx=None, max_norm=None, norm_type=2.0,
    scale_grad_by_freq=False, sparse=False, _weight=None, device=None, dtype=None, *,
    _freeze=False, name=None, optimizer=None, init=("normal", 0.0, 1.0), seed=0,
    compression=None, client=None, max_rows=0, admit_after=0, **settings)

    torch's arguments (1.13's, in its order; _freeze, torch 2's, by keyword only), with torch's
    defaults: as EmbeddingBag's, and _freeze only False. The padding id's rows are zeros, as
    torch's at init. {psched}

    forward(input): the rows of input's ids, of shape input.shape + (embedding_dim,).
    """

    def __init__(self, num_embeddings, embedding_dim, padding_idx=None, max_norm=None,
                 norm_type=2.0, scale_grad_by_freq=False, sparse=False, _weight=None,
                 device=None, dtype=None, *, _freeze=False, name=None, optimizer=None,
                 init=("normal", 0.0, 1.0), seed=0, compression=None, client=None, max_rows=0,
                 admit_after=0, **settings):
        super().__init__(num_embeddings, embedding_dim, padding_idx=padding_idx,
                         max_norm=max_norm, norm_type=norm_type,
                         scale_grad_by_freq=scale_grad_by_freq, sparse=sparse, _weight=_weight,
                         _freeze=_freeze, device=device, dtype=dtype, name=name,
                         optimizer=optimizer, init=init, seed=seed, compression=compression,
                         client=client, max_rows=max_rows, admit_after=admit_after,
                         settings=settings)

    def forward(self, input):
        rows, inverse = self._lookup(input)
        return F.embedding(inverse, self._padded(rows), padding_idx=self._padding_row(rows))


EmbeddingBag.__doc__ = EmbeddingBag.__doc__.format(psched=_PSCHED_KEYWORDS)
Embedding.__doc__ = Embedding.__doc__.format(psched=_PSCHED_KEYWORDS)
