# SPDX-License-Identifier: Apache-2.0
"""psched.torch.EmbeddingBag and Embedding against torch's own modules, on a real psched-server
(one worker, async): the constructors must take torch's arguments, the forward must be torch's,
each step's push torch's coalesced sparse gradient, and the steps must follow the rules of
psched/embedding.py. Recording hands every table call to a real psched.Client and notes it, so
the tests see what reached the client while every value comes from the shards."""
import inspect
import re

import numpy as np
import pytest
import torch

import psched
import psched.torch

NUM, DIM = 20, 4
LR = 0.1  # the deployment's (start_server's) sgd, and the tables' own
INPUT = torch.tensor([[1, 3, 3], [0, 1, 19], [7, 7, 7]])  # bags with duplicates within and across


class RecordedPull:
    """A psched.RowsPull, its waits counted in the Recording that started it."""

    def __init__(self, pull, recording):
        self.pull, self.recording = pull, recording

    def wait(self):
        self.pull.wait()
        self.recording.waited_prefetches += 1

    def ready(self):
        return self.pull.ready()


class Recording:
    """A real psched.Client whose table calls are noted as they pass to it: registrations
    (name, keywords), pulls (name, after, ids) and the rows they got (`pulled`), prefetches
    (name, after, ids, prefetch), pushes (name, step, ids, gradients: copies) and waits (name,
    step). Everything else is the client's own."""

    def __init__(self, client):
        self.client = client
        self.registrations, self.pulls, self.pushes, self.waits = [], [], [], []
        self.pulled = []
        self.prefetches, self.waited_prefetches = [], 0

    def __getattr__(self, name):
        return getattr(self.client, name)

    def register_table(self, name, num_embeddings, dim, **keywords):
        self.registrations.append((name, keywords))
        return self.client.register_table(name, num_embeddings, dim, **keywords)

    def pull_rows(self, table, ids, out, after=None):
        self.pulls.append((table.name, after, ids.tolist()))
        self.client.pull_rows(table, ids, out, after=after)
        self.pulled.append(out.copy())

    def start_pull_rows(self, table, ids, out, *, after=None, prefetch=False):
        self.prefetches.append((table.name, after, ids.tolist(), prefetch))
        return RecordedPull(self.client.start_pull_rows(table, ids, out, after=after,
                                                        prefetch=prefetch), self)

    def push_rows(self, table, ids, gradients, step):
        self.pushes.append((table.name, step, ids.copy(), gradients.copy()))
        self.client.push_rows(table, ids, gradients, step)

    def wait_rows(self, table, step):
        self.waits.append((table.name, step))
        self.client.wait_rows(table, step)


@pytest.fixture
def server(start_server):
    """One async worker's deployment; its optimizer: section is sgd with lr LR."""
    return start_server(mode="async", workers=1, lr=LR)


@pytest.fixture
def client(server):
    with psched.connect(server.config, 0) as real:
        yield Recording(real)


def torch_twin(module):
    """The torch.nn module `module` stands for, sparse, with `module`'s current rows."""
    if isinstance(module, psched.torch.EmbeddingBag):
        twin = torch.nn.EmbeddingBag(NUM, DIM, mode=module.mode, sparse=True, dtype=module.dtype,
                                     include_last_offset=module.include_last_offset,
                                     padding_idx=module.padding_idx)
    else:
        twin = torch.nn.Embedding(NUM, DIM, sparse=True, dtype=module.dtype,
                                  padding_idx=module.padding_idx)
    with torch.no_grad():
        twin.weight.copy_(module.rows(torch.arange(NUM)))
    return twin


def backward_both(module, twin, *inputs):
    """One step of `module` and of `twin` on `inputs`, the same loss; returns the outputs and
    the twin's coalesced gradient."""
    output, expected = module(*inputs), twin(*inputs)
    cotangent = torch.randn(expected.shape, generator=torch.Generator().manual_seed(0),
                            dtype=expected.dtype)
    (output * cotangent).sum().backward()
    (expected * cotangent).sum().backward()
    return output, expected, twin.weight.grad.coalesce()


def assert_pushed(client, step, gradient):
    """The last push is `step`'s, and holds exactly `gradient`'s rows (a coalesced sparse
    tensor)."""
    _, pushed_step, ids, values = client.pushes[-1]
    assert pushed_step == step
    assert ids.tolist() == gradient.indices()[0].tolist()
    torch.testing.assert_close(torch.from_numpy(values), gradient.values())


def sgd_bag(client, **keywords):
    return psched.torch.EmbeddingBag(NUM, DIM, name="bag", client=client, optimizer="sgd", lr=LR,
                                     **keywords)


FLAT, OFFSETS = INPUT.flatten(), torch.tensor([0, 3, 3, 6])  # the third bag is empty
CASES = {
    "2d": lambda dtype: ((INPUT,), {}),
    "offsets": lambda dtype: ((FLAT, OFFSETS), {}),
    "include_last_offset": lambda dtype: ((FLAT, torch.tensor([0, 3, 3, 6, 9])),
                                          {"include_last_offset": True}),
    "per_sample_weights": lambda dtype: ((FLAT, OFFSETS, torch.linspace(-1, 2, 9, dtype=dtype)),
                                         {}),
    # 3 pads the first bag and is all of the second's, 7 all of the last's
    "padding": lambda dtype: ((INPUT,), {"padding_idx": 3}),
    "padding_offsets": lambda dtype: ((FLAT, OFFSETS), {"padding_idx": 7}),
    "padding_per_sample_weights": lambda dtype: (
        (FLAT, OFFSETS, torch.linspace(-1, 2, 9, dtype=dtype)), {"padding_idx": -19}),
}


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
@pytest.mark.parametrize("mode, case", [(mode, case) for mode in ("sum", "mean") for case in CASES
                                        if mode == "sum" or "per_sample_weights" not in case])
def test_the_forward_is_torchs_and_the_push_its_coalesced_gradient(client, mode, case, dtype):
    inputs, keywords = CASES[case](dtype)
    bag = sgd_bag(client, mode=mode, dtype=dtype, **keywords)
    twin = torch_twin(bag)
    output, expected, gradient = backward_both(bag, twin, *inputs)
    assert output.dtype == dtype
    torch.testing.assert_close(output, expected)
    assert_pushed(client, 1, gradient)
    torch.optim.SGD(twin.parameters(), lr=LR).step()  # what the shards applied
    torch.testing.assert_close(bag.rows(torch.arange(NUM)), twin.weight.detach())


@pytest.mark.parametrize("padding_idx", [None, 7], ids=["no_padding", "padding"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
def test_embedding_gives_torchs_rows_in_the_inputs_shape_and_pushes_its_gradient(
        client, dtype, padding_idx):
    embedding = psched.torch.Embedding(NUM, DIM, padding_idx, name="embedding", client=client,
                                       dtype=dtype, optimizer="sgd", lr=LR)
    ids = INPUT.reshape(1, 3, 3).expand(2, 3, 3)
    output, expected, gradient = backward_both(embedding, torch_twin(embedding), ids)
    assert output.shape == (2, 3, 3, DIM)
    assert torch.equal(output, expected)
    assert_pushed(client, 1, gradient)


def test_the_padding_id_is_never_pulled_nor_pushed_and_reads_as_zeros(client):
    bag = sgd_bag(client, mode="mean", padding_idx=7)
    shard_row = np.empty((1, DIM), np.float32)
    for step in (1, 2):
        bag(INPUT).sum().backward()  # the last bag is all padding
        bag.synchronize()
        client.client.pull_rows(bag.table, np.array([7]), shard_row)
        if step == 1:
            initial = shard_row.copy()
    np.testing.assert_array_equal(shard_row, initial)  # on the shards: its init, untouched
    assert np.any(initial != 0)
    assert all(7 not in ids for _, _, ids in client.pulls)
    assert all(7 not in ids.tolist() for _, _, ids, _ in client.pushes)
    assert torch.equal(bag(torch.tensor([[7, 7]])), torch.zeros(1, DIM))
    assert torch.equal(bag.rows(torch.tensor([7, 1]))[0], torch.zeros(DIM))


@pytest.mark.parametrize("padding_idx", [0, 19, -1, -20])
def test_padding_idx_counts_from_the_end_when_negative_as_torchs(padding_idx):
    bag = psched.torch.EmbeddingBag(NUM, DIM, padding_idx=padding_idx)
    embedding = psched.torch.Embedding(NUM, DIM, padding_idx)
    assert bag.padding_idx == torch.nn.EmbeddingBag(NUM, DIM, padding_idx=padding_idx).padding_idx
    assert embedding.padding_idx == torch.nn.Embedding(NUM, DIM, padding_idx).padding_idx


def test_steps_follow_forwards_and_each_pull_waits_for_the_step_before(client):
    bag = sgd_bag(client)
    for _ in range(3):
        bag(INPUT).sum().backward()
    bag.synchronize()
    assert [step for _, step, _, _ in client.pushes] == [1, 2, 3]
    assert [after for _, after, _ in client.pulls] == [0, 1, 2]
    assert client.waits == [("bag", 1), ("bag", 2), ("bag", 3)]


def test_a_prefetch_between_forward_and_backward_serves_the_next_forward(client):
    bag = sgd_bag(client)
    twin = torch_twin(bag)
    client.pulls.clear()  # the twin's
    inputs = [INPUT, INPUT.flip(0), (INPUT + 1) % NUM]
    output = bag(inputs[0])
    for step, input in enumerate(inputs, 1):
        if step < len(inputs):
            bag.prefetch(inputs[step], None)  # step + 1's rows, before step's push
        output.sum().backward()
        if step < len(inputs):
            output = bag(inputs[step])  # served by the prefetch: no pull of its own
    assert [after for _, after, _ in client.pulls] == [0]
    assert [(after, prefetch) for _, after, _, prefetch in client.prefetches] == [(1, True),
                                                                                 (2, True)]
    assert client.waited_prefetches == 2 and bag.prefetches == 2 and bag.prefetch_misses == 0
    optimizer = torch.optim.SGD(twin.parameters(), lr=LR)
    for input in inputs:  # the same rows and gradients as torch's, step by step
        optimizer.zero_grad()
        twin(input).sum().backward()
        optimizer.step()
    torch.testing.assert_close(bag.rows(torch.arange(NUM)), twin.weight.detach())


def test_a_stale_prefetch_lets_the_next_forward_go_before_the_last_push_arrived(client):
    bag = sgd_bag(client)
    bag.staleness = 1
    output = bag(INPUT)
    for step in range(1, 4):
        bag.prefetch(INPUT)  # step + 1's rows as step - 1 left them
        output.sum().backward()  # pushes step
        output = bag(INPUT)  # step + 1 waits for the pushes before step's, not for step's
        assert client.waits == [("bag", s) for s in range(1, step)]
    bag.synchronize()
    assert client.waits == [("bag", s) for s in range(1, 4)]


def test_a_prefetch_of_other_ids_is_dropped_and_staleness_reads_older_steps(client):
    bag = sgd_bag(client)
    bag(INPUT).sum().backward()
    bag.prefetch((INPUT + 1) % NUM)
    bag(INPUT).sum().backward()  # other ids: pulled as usual
    assert bag.prefetch_misses == 1 and [a for _, a, _ in client.pulls] == [0, 1]
    bag.prefetch(INPUT, staleness=1)  # step 3's rows as step 1 left them
    bag.staleness = 2
    bag.prefetch(INPUT)  # replaces the one before, which counts as a miss
    assert [after for _, after, _, _ in client.prefetches] == [1, 1, 0]
    assert bag.prefetch_misses == 2
    bag(INPUT).sum().backward()
    assert [a for _, a, _ in client.pulls] == [0, 1]
    with pytest.raises(psched.Error, match="staleness -1"):
        bag.prefetch(INPUT, staleness=-1)


@pytest.mark.parametrize("evaluation", ["no_grad", "eval"])
def test_an_evaluation_forward_reads_the_last_pushed_step_pushes_nothing_and_is_no_step(
        client, evaluation):
    bag = sgd_bag(client)

    def evaluate():
        if evaluation == "no_grad":
            with torch.no_grad():
                return bag(INPUT)
        bag.eval()  # grad stays enabled
        try:
            return bag(INPUT)
        finally:
            bag.train()

    assert not evaluate().requires_grad
    bag(INPUT).sum().backward()
    after_step_1 = evaluate()
    assert torch.equal(after_step_1, torch.nn.functional.embedding_bag(
        INPUT, bag.rows(torch.arange(NUM)), mode="mean"))
    bag(INPUT).sum().backward()
    bag.synchronize()
    assert [step for _, step, _, _ in client.pushes] == [1, 2]
    # evaluation, step 1, evaluation, rows(), step 2
    assert [after for _, after, _ in client.pulls] == [0, 0, 1, 1, 1]


def test_a_step_whose_backward_never_ran_is_pushed_empty_at_the_next_forward(client):
    bag = sgd_bag(client, dtype=torch.float64)
    bag(INPUT)  # step 1: no backward
    bag(INPUT).sum().backward()  # step 2
    assert [(step, len(ids)) for _, step, ids, _ in client.pushes] == [(1, 0), (2, 5)]
    _, _, ids, gradients = client.pushes[0]
    assert ids.dtype == np.int64 and gradients.shape == (0, DIM) and gradients.dtype == np.float64
    assert [after for _, after, _ in client.pulls] == [0, 1]
    bag.synchronize()


def test_a_second_backward_through_one_forward_is_refused(client):
    bag = sgd_bag(client)
    loss = bag(INPUT).sum()
    loss.backward(retain_graph=True)
    with pytest.raises(psched.Error, match="'bag': a gradient for step 1 came after that step"):
        loss.backward()
    assert len(client.pushes) == 1


def test_a_table_called_twice_in_one_step_is_refused_at_backward(client):
    bag = sgd_bag(client)
    loss = bag(INPUT).sum() + bag(INPUT).sum()  # the second forward closes step 1 empty
    with pytest.raises(psched.Error, match="a gradient for step 1 came after that step"):
        loss.backward()


def test_rows_reads_ids_with_duplicates_through_one_pull_of_the_unique_ids(client):
    bag = sgd_bag(client)
    ids = torch.tensor([5, 2, 5, 5, 0])
    rows = bag.rows(ids)
    assert rows.shape == (5, DIM)
    each = [bag.rows(torch.tensor([i]))[0] for i in ids.tolist()]
    assert all(torch.equal(row, alone) for row, alone in zip(rows, each))
    assert len({tuple(row.tolist()) for row in rows}) == 3
    assert client.pulls[0] == ("bag", 0, [0, 2, 5])


def test_the_table_is_registered_at_first_use_with_torch_optims_keywords_translated(client):
    bag = psched.torch.EmbeddingBag(NUM, DIM, name="t", client=client, optimizer="sparse_adam",
                                    lr=0.01, betas=(0.8, 0.99), eps=1e-7, seed=3,
                                    init=("uniform", -0.1, 0.1), dtype=torch.float64)
    assert client.registrations == []
    bag.rows(torch.tensor([0]))
    (name, keywords), = client.registrations
    assert name == "t" and keywords["dtype"] == "float64"
    assert (keywords["optimizer"], keywords["init"], keywords["seed"]) == (
        "sparse_adam", ("uniform", -0.1, 0.1), 3)
    assert keywords["settings"] == {"lr": 0.01, "beta1": 0.8, "beta2": 0.99, "eps": 1e-7}
    assert (bag.table.name, bag.table.num_embeddings, bag.table.dim, bag.table.dtype) == (
        "t", NUM, DIM, "float64")
    assert "optimizer=sparse_adam" in repr(bag.table)


@pytest.mark.parametrize("ours, theirs", [(psched.torch.EmbeddingBag, torch.nn.EmbeddingBag),
                                          (psched.torch.Embedding, torch.nn.Embedding)],
                         ids=["EmbeddingBag", "Embedding"])
def test_the_constructors_take_torchs_arguments_in_its_order_with_its_defaults(ours, theirs):
    def parameters(cls, kind):
        return [(p.name, p.default) for p in inspect.signature(cls.__init__).parameters.values()
                if p.kind is kind and p.name != "self"]
    positional = inspect.Parameter.POSITIONAL_OR_KEYWORD
    assert parameters(ours, positional) == parameters(theirs, positional)
    psched_only = ["name", "optimizer", "init", "seed", "compression", "client", "max_rows",
                   "admit_after"]
    keyword_only = [name for name, _ in parameters(ours, inspect.Parameter.KEYWORD_ONLY)]
    assert keyword_only == (["_freeze"] if ours is psched.torch.Embedding else []) + psched_only
    assert psched.torch.EmbeddingBag(NUM, DIM).mode == torch.nn.EmbeddingBag(NUM, DIM).mode


def test_torchs_arguments_that_change_nothing_here_are_accepted():
    for module in (psched.torch.EmbeddingBag(NUM, DIM, None, 2.0, False, "sum", True, None, True,
                                             None, "cpu", torch.float64),
                   psched.torch.Embedding(NUM, DIM, None, None, 2.0, False, True, None,
                                          torch.device("cpu"), torch.float64, _freeze=False)):
        assert module.sparse and module.dtype == torch.float64
    assert psched.torch.EmbeddingBag(NUM, DIM, None, 2.0, False, "sum").mode == "sum"
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        assert psched.torch.Embedding(NUM, DIM).dtype == torch.float64  # dtype None: torch's
    finally:
        torch.set_default_dtype(previous)


REFUSALS = {
    "max_mode": ({"mode": "max"}, "does not support mode='max'"),
    "float16": ({"dtype": torch.float16}, "does not support dtype=torch.float16: rows are "
                                          "torch.float32 or torch.float64"),
    "max_norm": ({"max_norm": 1.0}, "does not support max_norm=1.0: torch renormalizes"),
    "norm_type": ({"norm_type": 1.0}, "does not support norm_type=1.0: it is max_norm's norm"),
    "scale_grad_by_freq": ({"scale_grad_by_freq": True},
                           "does not support scale_grad_by_freq=True"),
    "weight": ({"_weight": torch.zeros(NUM, DIM)},
               r"does not support _weight='a tensor of shape \(20, 4\)': the rows live on the "
               "shards"),
    "device": ({"device": "cuda:0"}, "does not support device='cuda:0': rows are pulled into "
                                     "CPU tensors"),
    "freeze": ({"_freeze": True}, "does not support _freeze=True"),
    "padding_idx": ({"padding_idx": NUM}, "padding_idx=20 is outside the table of 20 rows"),
    "unknown_optimizer": ({"optimizer": "adam", "lr": 0.1}, "row optimizer 'adam' is unknown"),
    "unknown_keyword": ({"nesterov": True}, "got an unknown keyword 'nesterov'"),
    "sgd_without_lr": ({"optimizer": "sgd"}, "row optimizer 'sgd' needs lr"),
    "settings_without_optimizer": ({"lr": 0.1}, "settings lr given without optimizer="),
}


@pytest.mark.parametrize("refusal", sorted(REFUSALS))
def test_what_a_psched_table_cannot_do_is_refused_at_construction_naming_the_argument(refusal):
    changes, message = REFUSALS[refusal]
    cls = psched.torch.Embedding if "_freeze" in changes else psched.torch.EmbeddingBag
    with pytest.raises(psched.Error, match=message) as error:
        cls(NUM, DIM, **changes)
    assert error.value.code == "invalid_argument"


def test_a_standalone_table_without_a_name_is_refused(client):
    with pytest.raises(psched.Error, match=r"a standalone psched.torch.EmbeddingBag "
                                           r"\(client given\) needs a name"):
        psched.torch.EmbeddingBag(NUM, DIM, client=client)


def test_a_table_without_a_client_outside_distributed_model_is_refused_at_first_use():
    bag = psched.torch.EmbeddingBag(NUM, DIM, optimizer="sgd", lr=LR)
    with pytest.raises(psched.Error, match="needs a client: wrap its model in "
                                           "psched.torch.DistributedModel or give client="):
        bag(INPUT)


class TwoTables(torch.nn.Module):
    """A bag on the deployment's optimizer and an embedding on its own, around a frozen
    layer."""

    def __init__(self):
        super().__init__()
        self.users = psched.torch.EmbeddingBag(NUM, DIM, dtype=torch.float64)
        self.items = torch.nn.ModuleDict({"ids": psched.torch.Embedding(
            NUM, DIM, name="items", dtype=torch.float64, optimizer="sgd", lr=0.5)})
        self.frozen = torch.nn.Linear(DIM, 1).double().requires_grad_(False)

    def forward(self, users, items):
        return self.frozen(self.users(users) + self.items["ids"](items).sum(1))


def test_distributed_model_names_its_tables_starts_them_at_its_step_and_waits_for_them(
        start_server):
    server = start_server(mode="sync", workers=1, lr=LR)
    with psched.connect(server.config, 0) as first:  # steps 1 to 4 of a job
        model = psched.torch.DistributedModel(TwoTables(), client=first)
        for _ in range(4):
            model(INPUT, INPUT).sum().backward()
        model.synchronize()
        trained = {name: model.module.get_submodule(module).rows(torch.arange(NUM))
                   for name, module in (("users", "users"), ("items", "items.ids"))}
    with psched.connect(server.config, 0) as restarted:  # the same worker, started again
        client = Recording(restarted)
        assert client.start_step == 5
        model = psched.torch.DistributedModel(TwoTables(), client=client)
        assert model.module.users.optimizer == "sgd"  # the deployment's
        assert model.module.users.settings == {"lr": LR}
        model(INPUT, INPUT).sum().backward()
        assert client.waits == []
        model.synchronize()
        assert sorted(name for name, _ in client.registrations) == ["items", "users"]
        assert sorted((name, step) for name, step, _, _ in client.pushes) == \
            [("items", 5), ("users", 5)]
        assert sorted((name, after) for name, after, _ in client.pulls) == \
            [("items", 4), ("users", 4)]
        assert sorted(client.waits) == [("items", 5), ("users", 5)]
        for (name, _, ids), rows in zip(client.pulls, client.pulled):
            assert torch.equal(torch.from_numpy(rows), trained[name][ids])  # the job's rows


class BagModel(torch.nn.Module):
    """A bag made with torch's arguments alone, and a layer."""

    def __init__(self):
        super().__init__()
        self.bag = psched.torch.EmbeddingBag(NUM, DIM)
        self.top = torch.nn.Linear(DIM, 1)

    def forward(self, ids):
        return self.top(self.bag(ids))


@pytest.mark.parametrize("kind, settings, why", [
    ("adam", {}, r"kind adam\) has no row formula \(kinds sgd and adagrad have one\)"),
    ("sgd", {"weight_decay": 0.01}, r"kind sgd, weight_decay 0.01\) decays every row"),
])
def test_a_deployment_optimizer_with_no_row_formula_is_refused_naming_it_and_the_choice(
        start_server, kind, settings, why):
    server = start_server(optimizer=kind, lr=0.01, optimizer_settings=settings)
    with pytest.raises(psched.Error, match=f"table 'bag' has no optimizer= and the deployment's "
                                           f"optimizer \\({re.escape(str(server.config))}: "
                                           f"{why}") as error:
        psched.torch.DistributedModel(BagModel(), config=server.config)
    assert ("pass optimizer= (one of sgd, adagrad, rowwise_adagrad, sparse_adam) and its "
            "settings" in str(error.value))
    model = BagModel()  # the table's own optimizer, the deployment's for the dense layer
    model.bag = psched.torch.EmbeddingBag(NUM, DIM, optimizer="adagrad", lr=0.1)
    model = psched.torch.DistributedModel(model, config=server.config)
    model(INPUT).sum().backward()
    model.synchronize()
    model.client.close()


def test_a_table_without_optimizer_on_a_client_without_deployment_is_refused(server):
    shards = psched.load_deployment(str(server.config)).shards
    with psched.connect(shards=shards, worker=0) as bare:
        assert bare.deployment is None
        with pytest.raises(psched.Error, match="table 'bag' has no optimizer= and its client was "
                                               "not made from a deployment file"):
            psched.torch.EmbeddingBag(NUM, DIM, name="bag", client=bare)
        with pytest.raises(psched.Error, match="table 'bag' has no optimizer= and its client"):
            psched.torch.DistributedModel(BagModel(), client=bare)
        model = torch.nn.Linear(DIM, 1)  # the dense variables: the shards' default
        wrapped = psched.torch.DistributedModel(model, client=bare)
        before = model.weight.detach().clone()
        wrapped(torch.ones(1, DIM)).sum().backward()
        wrapped.synchronize()
        torch.testing.assert_close(model.weight.detach(), before - LR)  # sgd, the deployment's lr
