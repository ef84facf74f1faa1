# SPDX-License-Identifier: Apache-2.0
"""psched.torch against torch.optim: the same model, data and order must reach the same
parameters, whether the optimizer runs in torch or on psched's shards."""
import copy
import json
import time

import pytest
import torch
import torch.nn.functional as F

import psched
import psched.torch
from conftest import run_workers

STEPS = 50
BATCH = 32


def make_model(dtype=torch.float32):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, 4))
    return model.to(dtype)


class OutOfOrder(torch.nn.Module):
    """An MLP defined in another order than it runs: `last` is defined before `first`, the
    model's own `scale` is used before either, `head`'s parameters are used directly (`head`
    itself never runs), and `unused` takes no part."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.last = torch.nn.Linear(32, 4)
        self.head = torch.nn.Linear(4, 4)
        self.unused = torch.nn.Linear(2, 2)
        self.first = torch.nn.Linear(16, 32)
        self.scale = torch.nn.Parameter(torch.ones(16))

    def forward(self, x):
        h = self.last(torch.tanh(self.first(x * self.scale)))
        return F.linear(h, self.head.weight, self.head.bias)


def make_batches(count, batch, dtype=torch.float32):
    generator = torch.Generator().manual_seed(1)
    return [(torch.randn(batch, 16, generator=generator, dtype=dtype),
             torch.randint(0, 4, (batch,), generator=generator)) for _ in range(count)]


def train_with_torch(model, optimizer, batches):
    for x, y in batches:
        optimizer.zero_grad()
        F.cross_entropy(model(x), y).backward()
        optimizer.step()


def train_with_psched(model, batches):
    for x, y in batches:
        F.cross_entropy(model(x), y).backward()
    model.synchronize()


def assert_parameters_equal(actual, expected, relative):
    for (name, a), (_, e) in zip(actual.named_parameters(), expected.named_parameters()):
        error = (a.detach() - e.detach()).norm() / e.detach().norm()
        assert error <= relative, f"{name}: relative difference {error:.3g}"


# Every option torch.optim has for the kinds psched runs, each where it changes the formula.
OPTIMIZERS = {
    "sgd": (torch.optim.SGD, {"lr": 0.1}),
    "sgd_weight_decay": (torch.optim.SGD, {"lr": 0.1, "weight_decay": 1e-2}),
    "sgd_momentum": (torch.optim.SGD, {"lr": 0.1, "momentum": 0.9, "dampening": 0.1}),
    "sgd_nesterov": (torch.optim.SGD, {"lr": 0.1, "momentum": 0.9, "nesterov": True,
                                       "weight_decay": 1e-3}),
    "adam": (torch.optim.Adam, {"lr": 1e-2}),
    "adam_amsgrad_l2": (torch.optim.Adam, {"lr": 1e-2, "weight_decay": 0.1, "amsgrad": True}),
    "adamw": (torch.optim.AdamW, {"lr": 1e-2, "betas": (0.8, 0.99)}),  # torch's decay 0.01
    "adamw_amsgrad": (torch.optim.AdamW, {"lr": 1e-2, "weight_decay": 0.1, "amsgrad": True}),
    "adagrad": (torch.optim.Adagrad, {"lr": 0.1}),
    "adagrad_decays": (torch.optim.Adagrad, {"lr": 0.1, "lr_decay": 0.01, "weight_decay": 1e-2,
                                             "initial_accumulator_value": 0.1, "eps": 1e-8}),
    "rmsprop": (torch.optim.RMSprop, {"lr": 1e-2}),
    "rmsprop_centered": (torch.optim.RMSprop, {"lr": 1e-2, "alpha": 0.9, "centered": True}),
    "rmsprop_momentum": (torch.optim.RMSprop, {"lr": 1e-2, "momentum": 0.9,
                                               "weight_decay": 1e-2}),
    "rmsprop_centered_momentum": (torch.optim.RMSprop, {"lr": 1e-2, "momentum": 0.5,
                                                        "centered": True}),
}
PSCHED_NAMES = {torch.optim.SGD: "sgd", torch.optim.Adam: "adam", torch.optim.AdamW: "adamw",
                torch.optim.Adagrad: "adagrad", torch.optim.RMSprop: "rmsprop"}


# Relative difference allowed after STEPS steps. float32: torch's kernels fuse multiply-adds
# that psched's do not; the last-bit differences grow through training to ~5e-7 (measured),
# and to 4.3e-6 where rmsprop's momentum buffer sums g / avg, whose last bits differ.
# float64 shows that the formulas are the same: ~1e-15 measured.
TOLERANCE = {torch.float32: 1e-6, torch.float64: 1e-12}
FLOAT32_TOLERANCE = {"rmsprop_momentum": 1e-5}


@pytest.mark.parametrize("dtype", TOLERANCE, ids=str)
@pytest.mark.parametrize("case", sorted(OPTIMIZERS))
def test_one_worker_equals_torch_optim(start_server, case, dtype):
    torch_optimizer, settings = OPTIMIZERS[case]
    server = start_server()
    batches = make_batches(STEPS, BATCH, dtype)
    expected = make_model(dtype)
    train_with_torch(expected, torch_optimizer(expected.parameters(), **settings), batches)

    model = psched.torch.DistributedModel(make_model(dtype), PSCHED_NAMES[torch_optimizer],
                                          config=server.config, worker=0, **settings)
    train_with_psched(model, batches)
    tolerance = FLOAT32_TOLERANCE.get(case, TOLERANCE[dtype]) if dtype == torch.float32 else \
        TOLERANCE[dtype]
    assert_parameters_equal(model.module, expected, tolerance)
    model.client.close()


class TensorFlowApplyAdam:
    """TensorFlow's ApplyAdam as its documentation states it, written plainly:
        lr_t = lr * sqrt(1 - beta2^t) / (1 - beta1^t)
        m = beta1 * m + (1 - beta1) * g;  v = beta2 * v + (1 - beta2) * g^2
        p = p - lr_t * m / (sqrt(v) + eps)"""

    def __init__(self, parameters, lr, beta1, beta2, eps):
        self.parameters = list(parameters)
        self.lr, self.beta1, self.beta2, self.eps = lr, beta1, beta2, eps
        self.m = [torch.zeros_like(p) for p in self.parameters]
        self.v = [torch.zeros_like(p) for p in self.parameters]
        self.t = 0

    def zero_grad(self):
        for p in self.parameters:
            p.grad = None

    @torch.no_grad()
    def step(self):
        self.t += 1
        lr_t = self.lr * (1 - self.beta2 ** self.t) ** 0.5 / (1 - self.beta1 ** self.t)
        for p, m, v in zip(self.parameters, self.m, self.v):
            m.mul_(self.beta1).add_((1 - self.beta1) * p.grad)
            v.mul_(self.beta2).add_((1 - self.beta2) * p.grad * p.grad)
            p.sub_(lr_t * m / (v.sqrt() + self.eps))


def test_adam_tf_equals_tensorflows_formula_in_float64(start_server):
    settings = {"lr": 1e-2, "beta1": 0.8, "beta2": 0.99, "eps": 1e-7}
    server = start_server()
    batches = make_batches(STEPS, BATCH, torch.float64)
    expected = make_model(torch.float64)
    train_with_torch(expected, TensorFlowApplyAdam(expected.parameters(), **settings), batches)
    model = psched.torch.DistributedModel(make_model(torch.float64), "adam_tf",
                                          config=server.config, worker=0, **settings)
    train_with_psched(model, batches)
    assert_parameters_equal(model.module, expected, TOLERANCE[torch.float64])
    model.client.close()


# Each torch.optim class's settings as psched.Optimizer names them.
def torch_defaults(torch_optimizer, **required):
    defaults = dict(torch_optimizer([torch.zeros(1)], **required).defaults)
    if "betas" in defaults:
        defaults["beta1"], defaults["beta2"] = defaults.pop("betas")
    for setting in ("foreach", "maximize", "capturable", "differentiable", "fused"):
        defaults.pop(setting, None)
    return defaults


@pytest.mark.parametrize("torch_optimizer", sorted(PSCHED_NAMES, key=str), ids=str)
def test_settings_left_out_take_torch_optims_defaults(torch_optimizer):
    required = {"lr": 0.1} if torch_optimizer is torch.optim.SGD else {}
    psched_optimizer = psched.torch.optimizer_settings(PSCHED_NAMES[torch_optimizer], **required)
    for setting, value in torch_defaults(torch_optimizer, **required).items():
        assert getattr(psched_optimizer, setting) == value, setting


def test_sgd_without_lr_is_refused_as_torch_refuses_it():
    with pytest.raises(psched.Error, match="needs lr"):
        psched.torch.optimizer_settings("sgd", momentum=0.9)
    with pytest.raises(psched.Error, match="needs lr"):
        psched.Optimizer("sgd")


@pytest.mark.parametrize("model", [make_model, OutOfOrder], ids=["sequential", "out_of_order"])
def test_two_sync_workers_equal_one_process_on_the_concatenated_batch(start_server, model):
    server = start_server(mode="sync", workers=2)
    concatenated = make_batches(STEPS, 2 * BATCH)
    halves = [[(x[rank * BATCH:(rank + 1) * BATCH], y[rank * BATCH:(rank + 1) * BATCH])
               for x, y in concatenated] for rank in range(2)]
    expected = model()
    train_with_torch(expected, torch.optim.SGD(expected.parameters(), lr=0.1), concatenated)

    workers = [psched.torch.DistributedModel(model(), "sgd", lr=0.1, config=server.config,
                                             worker=rank) for rank in range(2)]
    run_workers(workers, lambda rank: train_with_psched(workers[rank], halves[rank]))
    for worker in workers:
        assert_parameters_equal(worker.module, expected, 1e-6)
        worker.client.close()


def batch_norm_model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.BatchNorm1d(16), torch.nn.Linear(16, 4)).double()


def recalibrate(model, batches):
    """Forwards in training mode under no_grad, as torch.optim.swa_utils.update_bn runs them."""
    with torch.no_grad():
        for x, _ in batches:
            model(x)
    model.synchronize()


@pytest.mark.parametrize("buffers,run", [("average", "train"), ("local", "train"),
                                         ("average", "no_grad")])
def test_batch_norms_running_statistics_are_the_mean_of_the_workers_each_step(start_server,
                                                                              buffers, run):
    """Two sync workers, each its own half of every batch: with buffers="average" (the default)
    both end every step with BatchNorm's running_mean and running_var at the mean of what each
    computed from its half, the statistics of the whole batch's halves as DDP's broadcast of
    worker 0's never are; with buffers="local" each keeps its own, as without psched. Forwards
    in training mode under no_grad (BatchNorm recalibration) are steps of the buffers too."""
    server = start_server(mode="sync", workers=2)
    batches = make_batches(8, 2 * BATCH, torch.float64)
    halves = [[(x[rank * BATCH:(rank + 1) * BATCH], y[rank * BATCH:(rank + 1) * BATCH])
               for x, y in batches] for rank in range(2)]
    workers = [psched.torch.DistributedModel(batch_norm_model(), "sgd", lr=0.1, buffers=buffers,
                                             config=server.config, worker=rank)
               for rank in range(2)]
    train = train_with_psched if run == "train" else recalibrate
    run_workers(workers, lambda rank: train(workers[rank], halves[rank]))
    # BatchNorm's own update, from each half's statistics (its input is the batch itself).
    momentum = 0.1
    local = [(torch.zeros(16, dtype=torch.float64), torch.ones(16, dtype=torch.float64))
             for _ in range(2)]
    mean, var = local[0][0].clone(), local[0][1].clone()
    for step in range(len(batches)):
        new = [((1 - momentum) * m + momentum * halves[r][step][0].mean(0),
                (1 - momentum) * v + momentum * halves[r][step][0].var(0, unbiased=True))
               for r, (m, v) in enumerate(local)]
        if buffers == "average":
            mean = sum((1 - momentum) * mean + momentum * h[step][0].mean(0) for h in halves) / 2
            var = sum((1 - momentum) * var + momentum * h[step][0].var(0) for h in halves) / 2
            local = [(mean, var)] * 2
        else:
            local = new
    for rank, worker in enumerate(workers):
        norm = worker.module[0]
        expected_mean, expected_var = local[rank]
        torch.testing.assert_close(norm.running_mean, expected_mean, rtol=1e-12, atol=1e-14)
        torch.testing.assert_close(norm.running_var, expected_var, rtol=1e-12, atol=1e-14)
        assert int(norm.num_batches_tracked) == len(batches)
    differ = not torch.equal(workers[0].module[0].running_mean, workers[1].module[0].running_mean)
    assert differ == (buffers == "local")
    for worker in workers:
        worker.client.close()


def test_a_buffer_replaced_after_wrapping_is_refused_at_the_next_forward(start_server):
    model = psched.torch.DistributedModel(batch_norm_model(), "sgd", lr=0.1,
                                          config=start_server().config)
    x, y = make_batches(1, BATCH, torch.float64)[0]
    F.cross_entropy(model(x), y).backward()
    model.module[0].running_mean = model.module[0].running_mean.clone()
    with pytest.raises(psched.Error, match=r"buffer '0.running_mean' was replaced after "
                                           r"DistributedModel wrapped it"):
        model(x)
    model.client.close()


def test_a_buffer_psched_cannot_average_in_place_is_refused_naming_local():
    model = torch.nn.Sequential(torch.nn.BatchNorm1d(4))
    model[0].running_mean = model[0].running_mean.half()
    with pytest.raises(psched.Error, match=r"buffer '0.running_mean' is torch.float16.*"
                                           r"buffers=\"local\""):
        psched.torch.DistributedModel(model, "sgd", lr=0.1)
    with pytest.raises(psched.Error, match=r"buffers='shared': \"average\""):
        psched.torch.DistributedModel(make_model(), "sgd", lr=0.1, buffers="shared")


def test_settings_beside_a_psched_optimizer_are_refused():
    with pytest.raises(psched.Error, match="lr"):
        psched.torch.DistributedModel(make_model(), psched.Optimizer("sgd", lr=0.1), lr=0.1)


def test_settings_without_an_optimizer_are_refused():
    with pytest.raises(psched.Error, match=r"settings \['lr'\] given without an optimizer"):
        psched.torch.DistributedModel(make_model(), lr=0.1)


def test_an_unknown_optimizer_is_refused():
    with pytest.raises(psched.Error, match="'lamb' is unknown") as error:
        psched.torch.optimizer_settings("lamb")
    assert error.value.code == "invalid_argument"


def test_parameters_are_registered_in_the_first_forwards_order_as_priorities(start_server):
    server = start_server()
    model = psched.torch.DistributedModel(OutOfOrder(), "sgd", lr=0.1, config=server.config)
    assert model.client.variables == []
    batches = make_batches(STEPS, BATCH)
    train_with_psched(model, batches)
    # The modules as they started; then, as the model's forward ended, the parameters no module
    # hook saw, in definition order.
    order = ["scale", "first.weight", "first.bias", "last.weight", "last.bias", "head.weight",
             "head.bias", "unused.weight", "unused.bias"]
    assert [(v.name, v.priority) for v in model.client.variables] == \
        [(name, index) for index, name in enumerate(order)]
    expected = OutOfOrder()
    train_with_torch(expected, torch.optim.SGD(expected.parameters(), lr=0.1), batches)
    assert_parameters_equal(model.module, expected, 1e-6)
    model.client.close()


def test_each_gradient_is_pushed_from_one_buffer_reused_every_step(start_server):
    server = start_server()
    model = psched.torch.DistributedModel(make_model(), "sgd", lr=0.1, momentum=0.9,
                                          config=server.config)
    pushed = {}  # variable name -> every gradient pushed, kept alive (so no address is reused)
    push = model.client.push

    def recording_push(variable, step, gradient):
        pushed.setdefault(variable.name, []).append(gradient)
        push(variable, step, gradient)

    model.client.push = recording_push
    batches = make_batches(5, BATCH)
    train_with_psched(model, batches)
    assert sorted(pushed) == sorted(name for name, _ in model.module.named_parameters())
    for name, gradients in pushed.items():
        assert len(gradients) == 5 and len({g.data_ptr() for g in gradients}) == 1, name
    expected = make_model()
    train_with_torch(expected, torch.optim.SGD(expected.parameters(), lr=0.1, momentum=0.9),
                     batches)
    assert_parameters_equal(model.module, expected, 1e-6)
    model.client.close()


def test_a_second_backward_waits_for_the_first_push_before_reusing_its_buffer(start_server):
    # One linear layer: its backward reads no parameter, so a second backward through the same
    # graph gives exactly twice the gradient while the first step's update lands. 64 KiB of
    # weights against 4 KiB of credit: most of step 1 is still queued when step 2 is ready.
    server = start_server()
    (x, y), = make_batches(1, BATCH)
    torch.manual_seed(0)
    expected = torch.nn.Linear(16, 1024)
    model = psched.torch.DistributedModel(copy.deepcopy(expected), "sgd", lr=0.1,
                                          config=server.config)
    gradients = torch.autograd.grad(F.cross_entropy(expected(x), y), list(expected.parameters()))
    loss = F.cross_entropy(model(x), y)
    loss.backward(retain_graph=True)  # step 1 pushes g
    (2 * loss).backward()  # step 2 pushes 2g from the same buffers, no forward between
    model.synchronize()
    for p, e, g in zip(model.module.parameters(), expected.parameters(), gradients):
        torch.testing.assert_close(p.detach(), e.detach() - 0.1 * 3 * g)
    model.client.close()


@pytest.mark.parametrize("how", ["argument", "environment"])
def test_the_trace_holds_each_parameters_partitions_and_waits(start_server, tmp_path,
                                                              monkeypatch, how):
    server = start_server()
    path = str(tmp_path / "trace-{worker}.json")
    if how == "environment":
        monkeypatch.setenv("PSCHED_TRACE", path)
    start = time.monotonic()
    model = psched.torch.DistributedModel(make_model(), "sgd", lr=0.1, config=server.config,
                                          trace=path if how == "argument" else None)
    train_with_psched(model, make_batches(3, BATCH))  # synchronize() writes the trace
    end = time.monotonic()
    events = json.loads((tmp_path / "trace-0.json").read_text())["traceEvents"]
    for name, parameter in model.module.named_parameters():
        partitions = [e for e in events if e.get("args", {}).get("parameter") == name]
        assert sum(e["args"]["bytes"] for e in partitions) == 3 * parameter.numel() * 4, name
        waits = [e for e in events if e["name"] == f"wait {name}"]
        assert [e["args"]["step"] for e in waits] == [1, 2, 3], name
    for e in events:
        if e["ph"] == "X":  # on time.monotonic()'s axis, in microseconds
            assert start * 1e6 <= e["ts"] and e["ts"] + e["dur"] <= end * 1e6
    model.client.close()


@pytest.mark.parametrize("parameter, why", [
    (torch.nn.Parameter(torch.zeros(4, dtype=torch.float16)), "is torch.float16"),
    (torch.nn.Parameter(torch.zeros(3, 4).t()), r"is not contiguous \(strides \(1, 4\)\)"),
    (torch.nn.Parameter(torch.zeros(4, device="meta")), "is on meta"),
], ids=["float16", "transposed", "meta"])
def test_a_parameter_psched_cannot_train_in_place_is_refused_when_wrapped(parameter, why):
    model = make_model()
    model[2].bias = parameter
    with pytest.raises(psched.Error, match=f"parameter '2.bias' {why}; psched.torch trains "
                                           "contiguous float32 or float64 CPU tensors") as error:
        psched.torch.DistributedModel(model, "sgd", lr=0.1)  # before connecting
    assert error.value.code == "invalid_argument"


REPLACEMENTS = {
    "data": (lambda m: setattr(m[0].weight, "data", m[0].weight.detach().clone()),
             r"new memory \(p.data = "),
    "double": (lambda m: m.double(), r"new memory \(p.data = "),
    "parameter": (lambda m: setattr(m[0], "weight", torch.nn.Parameter(torch.ones(32, 16))),
                  "another Parameter or module"),
    "module": (lambda m: setattr(m, "0", torch.nn.Linear(16, 32)), "another Parameter or module"),
}


@pytest.mark.parametrize("when", ["before_the_first_forward", "after_a_step"])
@pytest.mark.parametrize("replacement", sorted(REPLACEMENTS))
def test_a_parameter_replaced_after_wrapping_is_refused_at_the_next_forward(start_server,
                                                                            replacement, when):
    server = start_server()
    model = psched.torch.DistributedModel(make_model(), "sgd", lr=0.1, config=server.config)
    (x, y), = make_batches(1, BATCH)
    if when == "after_a_step":
        F.cross_entropy(model(x), y).backward()
    replace, what = REPLACEMENTS[replacement]
    replace(model.module)
    with pytest.raises(psched.Error, match=f"parameter '0.weight' was replaced by {what}"):
        model(x)
    model.client.close()


def test_training_against_a_server_that_is_gone_raises_disconnected(start_server):
    server = start_server(reconnect_seconds=2)  # the client gives up after 2 s, not 60
    model = psched.torch.DistributedModel(make_model(), "sgd", lr=0.1, config=server.config)
    (x, y), = make_batches(1, BATCH)
    F.cross_entropy(model(x), y).backward()
    model.synchronize()
    server.kill()
    with pytest.raises(psched.DisconnectedError):
        F.cross_entropy(model(x), y).backward()
        model(x)
    model.client.close()
