# SPDX-License-Identifier: Apache-2.0
"""psched.torch's embedding tables against torch, exactly: two sync workers training a small
DLRM-like model (four tables, one per row optimizer, and a dense MLP on Adam) reach, in float64,
the rows and parameters of one torch process trained on both workers' batches together; so do
tables with a padding_idx (sum and mean bags and Embedding, each on SGD, Adagrad and
SparseAdam), a model built with torch's arguments alone (the deployment's optimizer), and a job
in which worker 0 evaluates under model.eval() between steps; and a hybrid job (sync dense,
bounded tables) whose dense part takes exactly the mean of the workers' gradients each step; and a
job stopped after step 15 on 2 shards (SIGTERM, or SIGKILL with its steps in the update logs),
placed on 3 or 1 by `psched reshard` (or exported with its optimizer state and placed by
`psched import`) and resumed, ends bit-equal to the job run on 2 shards throughout."""
import functools
import json
import pathlib
import subprocess
import urllib.request

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import psched
import psched.torch
from conftest import SERVER, run_workers

STEPS, BATCH, BAG = 30, 8, 4  # BATCH samples per worker and step, BAG ids per sample and table
ROWS, DIM, DENSE = 1000, 8, 4
IDS = 40  # ids are drawn below IDS, so bags repeat ids, within a bag and across bags and workers
INIT = ("uniform", -0.5, 0.5)
# One table per row optimizer: a sum bag, psched.torch.EmbeddingBag's keywords being the
# torch.optim ones. A table is (module, settings): module "sum" or "mean" (a bag of that mode)
# or "embedding".
TABLES = [
    ("sum", {"optimizer": "sgd", "lr": 0.1}),
    ("sum", {"optimizer": "adagrad", "lr": 0.1}),
    ("sum", {"optimizer": "rowwise_adagrad", "lr": 0.1, "eps": 1e-8}),
    ("sum", {"optimizer": "sparse_adam", "lr": 0.01}),
]
PAD = 5  # the padding id of PADDED's tables, below IDS: bags hold it often
PADDED = [(module, settings) for module in ("sum", "mean", "embedding")
          for settings in ({"optimizer": "sgd", "lr": 0.1}, {"optimizer": "adagrad", "lr": 0.1},
                           {"optimizer": "sparse_adam", "lr": 0.01})]
DENSE_LR = 1e-2
TOLERANCE = 1e-12  # relative, per row and per parameter; float64's rounding differences only


EMBEDDINGS = (psched.torch.Embedding, torch.nn.Embedding)


class Dlrm(torch.nn.Module):
    """Dense features through a bottom layer, beside each table's output for the sample (a bag's
    pooled row, an Embedding's BAG rows side by side); a top MLP over them gives one logit per
    sample."""

    def __init__(self, bags):
        super().__init__()
        self.bags = torch.nn.ModuleList(bags)
        torch.manual_seed(0)  # the same dense parameters whatever the bags drew
        self.bottom = torch.nn.Linear(DENSE, DIM, dtype=torch.float64)
        width = DIM * (1 + sum(BAG if isinstance(bag, EMBEDDINGS) else 1 for bag in bags))
        self.top = torch.nn.Sequential(
            torch.nn.Linear(width, 16, dtype=torch.float64), torch.nn.ReLU(),
            torch.nn.Linear(16, 1, dtype=torch.float64))

    def forward(self, dense, ids):
        pooled = [bag(table_ids).flatten(1) for bag, table_ids in zip(self.bags, ids)]
        return self.top(torch.cat([torch.relu(self.bottom(dense))] + pooled, dim=1)).squeeze(1)


def psched_model(tables=TABLES, padding_idx=None, **capacity):
    def table(index, module, settings):
        keywords = dict(padding_idx=padding_idx, dtype=torch.float64, init=INIT, seed=index,
                        **capacity, **settings)
        if module == "embedding":
            return psched.torch.Embedding(ROWS, DIM, **keywords)
        return psched.torch.EmbeddingBag(ROWS, DIM, mode=module, **keywords)
    return Dlrm([table(index, *spec) for index, spec in enumerate(tables)])


def make_batches(tables=TABLES, padding_idx=None):
    """Both workers' batches, STEPS of (dense, ids per table, labels); worker r's are the
    samples r * BATCH to (r + 1) * BATCH. With padding_idx, about a third of the ids are it, and
    each worker's first sample of every table is all padding."""
    generator = torch.Generator().manual_seed(1)

    def ids():
        drawn = torch.randint(0, IDS, (2 * BATCH, BAG), generator=generator)
        if padding_idx is not None:
            padded = torch.rand(drawn.shape, generator=generator) < 1 / 3
            padded[::BATCH] = True
            drawn[padded] = padding_idx
        return drawn

    return [(torch.randn(2 * BATCH, DENSE, generator=generator, dtype=torch.float64),
             [ids() for _ in tables],
             torch.randint(0, 2, (2 * BATCH,), generator=generator).to(torch.float64))
            for _ in range(STEPS)]


def half(batch, rank):
    part = slice(rank * BATCH, (rank + 1) * BATCH)
    dense, ids, labels = batch
    return dense[part], [table_ids[part] for table_ids in ids], labels[part]


def step(model, batch, prefetch=None):
    """One step; prefetch: the next step's ids per table, prefetched (DistributedModel.prefetch)
    between this step's forward and backward."""
    dense, ids, labels = batch
    loss = F.binary_cross_entropy_with_logits(model(dense, ids), labels)
    if prefetch is not None:
        model.prefetch(dict(zip(model.module.bags, prefetch)))
    loss.backward()


class RowwiseAdagrad:
    """FBGEMM's EXACT_ROWWISE_ADAGRAD on a sparse gradient, written plainly: for each row the
    step's gradient g holds, acc += mean(g^2) over the row; w -= lr / (sqrt(acc) + eps) * g."""

    def __init__(self, parameters, lr, eps):
        self.weight, = parameters
        self.lr, self.eps = lr, eps
        self.accumulator = torch.zeros(len(self.weight), dtype=self.weight.dtype)

    def zero_grad(self):
        self.weight.grad = None

    @torch.no_grad()
    def step(self):
        gradient = self.weight.grad.coalesce()
        rows, g = gradient.indices()[0], gradient.values()
        self.accumulator[rows] += (g * g).mean(1)
        self.weight[rows] -= (self.lr / (self.accumulator[rows].sqrt() + self.eps))[:, None] * g


TORCH_OPTIMIZERS = {"sgd": torch.optim.SGD, "adagrad": torch.optim.Adagrad,
                    "rowwise_adagrad": RowwiseAdagrad, "sparse_adam": torch.optim.SparseAdam}


def evaluate(model, batch):
    """The logits of `batch` under model.eval() with grad enabled, as a validation pass that
    forgets torch.no_grad() computes them; the model goes back to training."""
    dense, ids, _ = batch
    model.eval()
    try:
        return model(dense, ids).detach()
    finally:
        model.train()


def torch_table(module, padding_idx):
    if module == "embedding":
        return torch.nn.Embedding(ROWS, DIM, padding_idx, sparse=True, dtype=torch.float64)
    return torch.nn.EmbeddingBag(ROWS, DIM, mode=module, sparse=True, padding_idx=padding_idx,
                                 dtype=torch.float64)


def train_with_torch(initial_rows, batches, tables=TABLES, padding_idx=None, held_out=None,
                     dense_optimizer=None):
    """One process on the whole batches: torch's sparse tables from `initial_rows`, each with
    its table's optimizer, and torch.optim.Adam on the rest. The loss is the mean over both
    workers' samples, the mean of the workers' losses: what sync mode applies. held_out: a
    batch evaluated after each step; returns the model and those logits. dense_optimizer:
    (torch.optim class, settings) instead of Adam."""
    bags = [torch_table(module, padding_idx) for module, _ in tables]
    model = Dlrm(bags)
    dense_class, dense_settings = dense_optimizer or (torch.optim.Adam, {"lr": DENSE_LR})
    optimizers = [dense_class(
        [p for name, p in model.named_parameters() if not name.startswith("bags.")],
        **dense_settings)]
    for bag, rows, (_, settings) in zip(bags, initial_rows, tables):
        with torch.no_grad():
            bag.weight.copy_(rows)
        settings = dict(settings)
        optimizers.append(TORCH_OPTIMIZERS[settings.pop("optimizer")](bag.parameters(),
                                                                      **settings))
    evaluations = []
    for batch in batches:
        for optimizer in optimizers:
            optimizer.zero_grad()
        step(model, batch)
        for optimizer in optimizers:
            optimizer.step()
        if held_out is not None:
            evaluations.append(evaluate(model, held_out))
    return model, evaluations


def train_with_psched(server, batches, restart_at=None, prefetch=None, capacity=None,
                      tables=TABLES, padding_idx=None, held_out=None, make_model=None,
                      dense=("adam", {"lr": DENSE_LR})):
    """Both workers, each a thread with its own DistributedModel; returns the models (their
    clients open), every table's rows as worker 0 read them before training, and worker 0's
    evaluations. restart_at: worker 0 SIGKILLs the server before that step and starts it again
    (the workers reconnect by themselves). prefetch: each step prefetches the next one's rows
    with this staleness. capacity: the tables' max_rows and admit_after. tables, padding_idx:
    the model's (psched_model). held_out: a batch worker 0 alone evaluates after each step
    (evaluate(): model.eval(), grad enabled). make_model: makes the model instead of
    psched_model. dense: DistributedModel's optimizer and settings (None: none given)."""
    if make_model is None:
        def make_model():
            return psched_model(tables, padding_idx, **(capacity or {}))
    optimizer, settings = dense or (None, {})
    workers = [psched.torch.DistributedModel(make_model(), optimizer, config=server.config,
                                             worker=rank, embedding_staleness=prefetch,
                                             **settings)
               for rank in range(2)]
    initial_rows = [bag.rows(torch.arange(ROWS)) for bag in workers[0].module.bags]
    evaluations = []

    def train(rank):
        for index, batch in enumerate(batches):
            if rank == 0 and index == restart_at:
                server.restart()
            following = batches[index + 1] if index + 1 < len(batches) else None
            step(workers[rank], half(batch, rank),
                 half(following, rank)[1] if prefetch is not None and following else None)
            if rank == 0 and held_out is not None:
                evaluations.append(evaluate(workers[rank], held_out))
        workers[rank].synchronize()

    run_workers(workers, train)
    return workers, initial_rows, evaluations


def trained_state(worker):
    """Every table's rows (as the worker reads them after its last step) and every dense
    parameter, by name."""
    state = {f"{name}.rows": bag.rows(torch.arange(ROWS))
             for name, bag in worker.module.named_modules()
             if isinstance(bag, (psched.torch.EmbeddingBag, psched.torch.Embedding))}
    state.update((name, p.detach().clone()) for name, p in worker.module.named_parameters())
    return state


def assert_close_per_row(actual, expected, what):
    """Each row of `actual` within TOLERANCE (relative) of `expected`'s; a zero row (torch's
    padding row) exactly zero."""
    actual, expected = actual.reshape(len(actual), -1), expected.reshape(len(expected), -1)
    difference, size = (actual - expected).norm(dim=1), expected.norm(dim=1)
    zero = size == 0
    assert not difference[zero].any(), f"{what}: rows {zero.nonzero().flatten().tolist()} not 0"
    error = (difference[~zero] / size[~zero]).max()
    assert error <= TOLERANCE, f"{what}: relative difference {error:.3g}"


def assert_trained_as(workers, expected, tables=TABLES):
    """Every worker's rows and parameters are the torch model `expected`'s."""
    for rank, worker in enumerate(workers):
        actual = trained_state(worker)
        for index, (bag, (module, settings)) in enumerate(zip(expected.bags, tables)):
            assert_close_per_row(actual[f"bags.{index}.rows"], bag.weight.detach(),
                                 f"worker {rank} table {index} ({module}, "
                                 f"{settings['optimizer']})")
        for name, p in expected.named_parameters():
            if not name.startswith("bags."):
                assert_close_per_row(actual[name].reshape(1, -1), p.detach().reshape(1, -1),
                                     f"worker {rank} {name}")


def test_two_sync_workers_train_every_row_optimizer_as_torch_on_the_whole_batch(start_server):
    server = start_server(mode="sync", workers=2, shards=2)
    batches = make_batches()
    workers, initial_rows, _ = train_with_psched(server, batches)
    expected, _ = train_with_torch(initial_rows, batches)
    assert_trained_as(workers, expected)
    for worker in workers:
        worker.client.close()


def test_rows_prefetched_under_the_step_before_train_as_torch(start_server):
    server = start_server(mode="sync", workers=2, shards=2)
    batches = make_batches()
    workers, initial_rows, _ = train_with_psched(server, batches, prefetch=0)
    expected, _ = train_with_torch(initial_rows, batches)
    assert_trained_as(workers, expected)
    for worker in workers:
        bags = worker.module.bags
        assert [(bag.prefetches, bag.prefetch_misses) for bag in bags] == [(STEPS - 1, 0)] * 4
        worker.client.close()


def test_one_shard_trains_the_same_rows_as_two(start_server):
    batches = make_batches()
    states = []
    for shards in (1, 2):
        workers, _, _ = train_with_psched(start_server(mode="sync", workers=2, shards=shards),
                                          batches)
        states.append(trained_state(workers[0]))
        for worker in workers:
            worker.client.close()
    one, two = states
    assert sorted(one) == sorted(two)
    for name in one:
        assert torch.equal(one[name], two[name]), name


@pytest.mark.parametrize("capacity", [{}, {"max_rows": 8, "admit_after": 2}],
                         ids=["unbounded", "bounded"])
def test_a_server_killed_mid_run_and_restarted_changes_no_row(start_server, capacity):
    batches = make_batches()
    states = []
    for restart_at in (None, STEPS // 2):
        server = start_server(mode="sync", workers=2, shards=2, checkpoint=True)
        workers, _, _ = train_with_psched(server, batches, restart_at, capacity=capacity)
        states.append(trained_state(workers[0]))
        for worker in workers:
            worker.client.close()
        if restart_at is not None:
            assert any("restored" in line for line in server.log), "".join(server.log)
        if capacity:  # the bound did bite: rows were evicted and updates dropped
            counts = [(t["rows_evicted"], t["updates_dropped"])
                      for port in server.http_ports for t in json.load(urllib.request.urlopen(
                          f"http://127.0.0.1:{port}/status"))["tables"]]
            assert all(evicted > 0 and dropped > 0 for evicted, dropped in counts), counts
    clean, restarted = states
    for name in clean:
        assert torch.equal(clean[name], restarted[name]), name


@pytest.mark.parametrize("shards,stop_by,via", [(3, "sigterm", "reshard"), (1, "sigterm", "reshard"),
                                               (3, "sigkill", "reshard"), (3, "sigterm", "export"),
                                               (1, "sigkill", "export")])
def test_a_job_placed_on_another_number_of_shards_trains_the_same_rows(start_server, tmp_path,
                                                                       shards, stop_by, via):
    """A sync job stopped after step 15 on 2 shards, placed on 3 (or 1) by `psched reshard` and
    resumed to step 30 by new trainer processes ends with every row and parameter bit-equal to
    the job run on 2 shards throughout. Stopped by SIGTERM, each shard checkpoints; by SIGKILL
    (and checkpointing only at a clean stop), the 15 steps are in the shards' update logs alone,
    and reshard replays them (--from-config, the deployment the shards ran with). via "export":
    the job's model is exported with its optimizer state instead (psched.torch.export from a
    trainer, or `psched export` replaying the logs) and `psched import` places the export."""
    batches = make_batches()
    workers, _, _ = train_with_psched(start_server(mode="sync", workers=2, shards=2), batches)
    expected = trained_state(workers[0])
    for worker in workers:
        worker.client.close()
    stop = STEPS // 2
    if stop_by == "sigterm":
        first = start_server(mode="sync", workers=2, shards=2, checkpoint=True)
        state = first.state
    else:
        state = tmp_path / "killed"
        first = start_server(mode="sync", workers=2, shards=2,
                             extra=f"checkpoint: {{directory: {state}, interval_seconds: 0}}\n")
    workers, _, _ = train_with_psched(first, batches[:stop])
    for worker in workers:
        worker.client.close()
    replay = []
    if stop_by == "sigterm":
        first.stop()
    else:
        first.kill()
        logged = [log.stat().st_size for log in state.glob("shard-*.log")]
        assert len(logged) == 2 and min(logged) > 20, logged  # more than a log's header
        replay = ["--from-config", str(first.config)]
    placed = tmp_path / "placed"
    # The deployments' split_bytes (2 KiB) is not the default: on 1 shard it is given, on 3 the
    # tool keeps each variable split or whole as the 2 shards held it.
    split = ["--split-bytes", "2048"] if shards == 1 else []
    tool = str(pathlib.Path(SERVER).with_name("psched"))
    if via == "reshard":
        subprocess.run([tool, "reshard", "--from", str(state), "--to", str(placed), "--shards",
                        str(shards), *split, *replay], check=True)
    else:
        export = tmp_path / "export"
        if stop_by == "sigterm":
            psched.torch.export(psched_model(), export, state, with_optimizer_state=True)
        else:
            subprocess.run([tool, "export", "--from", str(state), "--to", str(export),
                            "--with-optimizer-state", *replay], check=True)
        subprocess.run([tool, "import", "--from", str(export), "--to", str(placed), "--shards",
                        str(shards), *split], check=True)
    second = start_server(mode="sync", workers=2, shards=shards, checkpoint=placed)
    workers = [psched.torch.DistributedModel(psched_model(), "adam", config=second.config,
                                             worker=rank, lr=DENSE_LR) for rank in range(2)]
    assert [worker.start_step for worker in workers] == [stop + 1] * 2

    def train(rank):
        for batch in batches[stop:]:
            step(workers[rank], half(batch, rank))
        workers[rank].synchronize()

    run_workers(workers, train)
    actual = trained_state(workers[0])
    for worker in workers:
        worker.client.close()
    assert sorted(actual) == sorted(expected)
    for name in expected:
        assert torch.equal(actual[name], expected[name]), name


def shard_rows(client, table, ids):
    """The rows of `ids` as the shards hold them, pulled through the client itself."""
    out = np.empty((len(ids), DIM))
    client.pull_rows(table, np.array(ids, np.int64), out)
    return out


def test_tables_with_a_padding_idx_train_as_torchs_and_never_touch_its_row(start_server):
    server = start_server(mode="sync", workers=2, shards=2)
    batches = make_batches(PADDED, PAD)
    workers, initial_rows, _ = train_with_psched(server, batches, tables=PADDED, padding_idx=PAD)
    expected, _ = train_with_torch(initial_rows, batches, PADDED, PAD)
    assert_trained_as(workers, expected, PADDED)
    client = workers[0].client
    for index, bag in enumerate(workers[0].module.bags):
        assert not bag.rows(torch.tensor([PAD])).any()  # torch's padding row: zeros
        # On the shards the padding row holds its initial value: that of a fresh table of the
        # same init and seed.
        fresh = client.register_table(f"fresh{index}", ROWS, DIM, dtype="float64",
                                      optimizer="sgd", settings={"lr": 0.1}, init=INIT,
                                      seed=index)
        initial = shard_rows(client, fresh, [PAD])
        assert initial.any()
        np.testing.assert_array_equal(shard_rows(client, bag.table, [PAD]), initial)
    for worker in workers:
        worker.client.close()


def test_worker_0_evaluating_under_eval_between_steps_keeps_both_workers_in_step(start_server):
    # A step that waits 20 s for a worker fails: a job whose steps went out of line ends.
    server = start_server(mode="sync", workers=2, shards=2,
                          extra="sync: {timeout_seconds: 20, on_timeout: fail}\n")
    batches = make_batches()
    held_out = half(batches[-1], 1)
    workers, initial_rows, evaluations = train_with_psched(server, batches, held_out=held_out)
    expected, expected_evaluations = train_with_torch(initial_rows, batches, held_out=held_out)
    assert_trained_as(workers, expected)
    assert len(evaluations) == STEPS
    for index, (actual, torchs) in enumerate(zip(evaluations, expected_evaluations), 1):
        assert_close_per_row(actual.reshape(1, -1), torchs.reshape(1, -1),
                             f"worker 0's evaluation after step {index}")
    for worker in workers:
        assert [bag.pushed for bag in worker.module.bags] == [STEPS] * len(TABLES)
        worker.client.close()


@pytest.mark.parametrize("kind", ["sgd", "adagrad"])
def test_a_model_made_with_torchs_arguments_alone_trains_with_the_deployments_optimizer(
        start_server, kind):
    lr = 0.3
    server = start_server(mode="sync", workers=2, shards=2, optimizer=kind, lr=lr)
    tables = [("mean", {"optimizer": kind, "lr": lr}), ("embedding", {"optimizer": kind, "lr": lr})]
    batches = make_batches(tables)

    def make_model():  # torch's arguments only: a mean bag, N(0, 1) rows, no optimizer
        return Dlrm([psched.torch.EmbeddingBag(ROWS, DIM, dtype=torch.float64),
                     psched.torch.Embedding(ROWS, DIM, dtype=torch.float64)])

    workers, initial_rows, _ = train_with_psched(server, batches, make_model=make_model,
                                                 dense=None)
    expected, _ = train_with_torch(initial_rows, batches, tables,
                                   dense_optimizer=(TORCH_OPTIMIZERS[kind], {"lr": lr}))
    assert_trained_as(workers, expected, tables)
    deployment = workers[0].client.deployment.optimizer
    assert (deployment.kind, deployment.lr) == (kind, lr)
    settings = {"sgd": {"lr": lr},
                "adagrad": {"lr": lr, "eps": 1e-10, "lr_decay": 0.0,
                            "initial_accumulator_value": 0.0}}[kind]
    for bag in workers[0].module.bags:
        assert (bag.optimizer, bag.settings) == (kind, settings)
    for worker in workers:
        worker.client.close()


def test_hybrid_steps_keep_the_dense_part_exactly_sync_beside_bounded_tables(start_server):
    """table_mode: {mode: bounded, staleness: 1} in a sync job (Persia's hybrid): the rows
    each worker reads may lag by the bound, but every dense step applies exactly the mean of
    both workers' gradients of that step. Checked against torch's Adam fed those gradients (as
    each worker computed them, from the rows it read): each worker's dense parameters at every
    forward, and at the end."""
    server = start_server(mode="sync", workers=2, optimizer="adagrad",
                          extra="table_mode: {mode: bounded, staleness: 1}\n")
    workers = [psched.torch.DistributedModel(psched_model(), "adam", config=server.config,
                                             worker=rank, lr=DENSE_LR) for rank in range(2)]
    dense_names = [name for name, _ in workers[0].module.named_parameters()
                   if not name.startswith("bags.")]
    seen = [[] for _ in workers]  # per worker and step: its dense parameters at the forward
    grads = [[] for _ in workers]  # per worker and step: its dense gradients

    def record(rank, module, inputs, output):
        parameters = dict(module.named_parameters())
        seen[rank].append([parameters[name].detach().clone() for name in dense_names])

    def train(rank):
        model = workers[rank]
        model.module.register_forward_hook(functools.partial(record, rank))
        for batch in make_batches():
            parameters = dict(model.module.named_parameters())
            for name in dense_names:
                parameters[name].grad = None
            step(model, half(batch, rank))
            grads[rank].append([parameters[name].grad.clone() for name in dense_names])
        model.synchronize()

    run_workers(workers, train)

    reference = [p.clone().requires_grad_() for p in seen[0][0]]
    adam = torch.optim.Adam(reference, lr=DENSE_LR)
    for index in range(STEPS):
        for rank in range(2):
            for name, actual, expected in zip(dense_names, seen[rank][index], reference):
                assert_close_per_row(actual.reshape(1, -1), expected.detach().reshape(1, -1),
                                     f"worker {rank} step {index + 1} {name}")
        for p, g0, g1 in zip(reference, grads[0][index], grads[1][index]):
            p.grad = (g0 + g1) / 2
        adam.step()
    for rank, worker in enumerate(workers):
        final = trained_state(worker)
        for name, expected in zip(dense_names, reference):
            assert_close_per_row(final[name].reshape(1, -1), expected.detach().reshape(1, -1),
                                 f"worker {rank} {name} after the last step")
    for worker in workers:
        worker.client.close()
