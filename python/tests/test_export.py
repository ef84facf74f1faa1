# SPDX-License-Identifier: Apache-2.0
"""The trained model leaves psched (issue 56): `psched export` of a stopped job's checkpoints
read back by numpy, psched.torch.to_local's plain torch model predicting bit for bit what the
distributed click model predicts (float32 and float64), the initial rows computed as the shards
compute them, and the state_dict, load_state_dict, torch.save and copy.deepcopy of models with
psched tables either doing what a DistributedDataParallel user expects or refusing, saying what
to use instead."""
import copy
import io
import json
import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest
import torch

import psched
import psched.export
import psched.torch

sys.path.insert(0, str(pathlib.Path(__file__).parents[1] / "examples"))
from ctr_model import ClickLog, ClickModel, psched_bags  # noqa: E402

TABLES, ROWS, DIM, IDS_PER_BAG = 3, 400, 8, 4


def click_model(dtype):
    """The click example's model (python/examples/ctr_model.py), small, in `dtype`."""
    default = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        torch.manual_seed(0)
        return ClickModel(TABLES, DIM, psched_bags(ROWS, DIM, lr=0.05))
    finally:
        torch.set_default_dtype(default)


def train_and_stop(start_server, dtype, steps=6, batch=64):
    """Trains the click model `steps` steps on a one-worker sync job whose shards checkpoint,
    then stops the shards (their last checkpoint). Returns (model, server, held-out batches,
    the distributed model's predictions of them)."""
    server = start_server(mode="sync", shards=2, checkpoint=True, optimizer="adam", lr=0.01)
    model = psched.torch.DistributedModel(click_model(dtype), config=server.config)
    log = ClickLog(TABLES, ROWS, IDS_PER_BAG, seed=0)
    x, ids, y = log.sample(steps * batch, torch.Generator().manual_seed(1))
    for step in range(steps):
        part = slice(step * batch, (step + 1) * batch)
        logits = model(x[part].to(dtype), ids[:, part])
        torch.nn.functional.binary_cross_entropy_with_logits(logits, y[part].to(dtype)).backward()
    model.synchronize()
    held_out = [log.sample(128, torch.Generator().manual_seed(2 + k)) for k in range(2)]
    with torch.no_grad():
        predicted = [model(x.to(dtype), ids) for x, ids, _ in held_out]
    model.client.close()
    server.stop()
    return model, server, held_out, predicted


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_the_local_model_predicts_bit_for_bit_what_the_distributed_model_predicts(
        start_server, tmp_path, dtype):
    model, server, held_out, predicted = train_and_stop(start_server, dtype)
    report = psched.torch.export(model, tmp_path / "model", server.state)
    assert report["tables"] == TABLES and report["step"] == 6 and report["shards"] == 2
    folder = psched.export.load(tmp_path / "model")
    assert folder.step == 6
    # Held-out ids the tables never stored: their rows come from the initial-row function.
    stored = {int(i) for name in folder.table_names() for i in folder.rows(name)[0]}
    assert any(int(i) not in stored for _, ids, _ in held_out for i in ids[0].flatten())
    # From the trained model, and from a fresh one as an inference service builds it.
    for source in (model, click_model(dtype)):
        local = psched.torch.to_local(source, tmp_path / "model")
        assert not any(isinstance(m, psched.torch.EmbeddingBag) for m in local.modules())
        assert isinstance(local.bags[0], torch.nn.EmbeddingBag)
        assert local.bags[0].weight.dtype == dtype
        with torch.no_grad():
            for (x, ids, _), expected in zip(held_out, predicted):
                got = local(x.to(dtype), ids)
                assert got.dtype == dtype
                assert torch.equal(got, expected), (got - expected).abs().max()


def test_an_export_is_numpy_files_and_a_manifest(start_server, tmp_path):
    model, server, _, _ = train_and_stop(start_server, torch.float32, steps=2)
    psched._core.export_model([str(server.state)], str(tmp_path / "plain"), True)
    manifest = json.loads((tmp_path / "plain" / "manifest.json").read_text())
    assert manifest["format"] == "psched-export" and manifest["version"] == 1
    assert manifest["mode"] == "sync" and manifest["workers"] == 1 and manifest["step"] == 2
    assert manifest["row_order"] == "storage" and manifest["optimizer_state"] is True
    table = next(t for t in manifest["tables"] if t["name"] == "table0")
    assert table["num_embeddings"] == ROWS and table["dim"] == DIM and table["seed"] == 0
    assert table["optimizer"]["kind"] == "adagrad" and table["init"]["kind"] == "uniform"
    ids = np.load(tmp_path / "plain" / table["ids"], mmap_mode="r")
    values = np.load(tmp_path / "plain" / table["values"], mmap_mode="r")
    state = np.load(tmp_path / "plain" / table["state"])
    assert ids.dtype == np.int64 and table["ids_dtype"] == "int64"
    assert torch.from_numpy(ids.copy()).dtype == torch.int64
    assert len(np.unique(ids)) == len(ids) == table["rows"] > 0
    assert values.shape == (len(ids), DIM) and values.dtype == np.float32
    assert state.shape == (len(ids), DIM) and (state > 0).all()  # adagrad's sums, all trained
    dense = {entry["name"]: entry for entry in manifest["dense"]}
    weight = np.load(tmp_path / "plain" / dense["bottom.0.weight"]["file"])
    assert np.array_equal(weight, model.module.bottom[0].weight.detach().numpy())
    assert len(dense["bottom.0.weight"]["state"]) == 2  # adam's exp_avg, exp_avg_sq


def test_an_export_refuses_an_existing_folder_and_an_incomplete_set(start_server, tmp_path):
    _, server, _, _ = train_and_stop(start_server, torch.float32, steps=1)
    (tmp_path / "taken").mkdir()
    with pytest.raises(psched.Error, match="taken exists; name a new folder") as e:
        psched._core.export_model([str(server.state)], str(tmp_path / "taken"))
    assert e.value.code == "bad_config"
    for file in server.state.glob("shard-1.*"):
        file.unlink()
    with pytest.raises(psched.Error, match="the set is incomplete: the job ran on 2 shards and "
                                           "shard 1 has no checkpoint"):
        psched._core.export_model([str(server.state)], str(tmp_path / "out"))
    assert not (tmp_path / "out").exists() and not (tmp_path / "out.partial").exists()


def test_to_local_refuses_an_export_of_another_model(start_server, tmp_path):
    _, server, _, _ = train_and_stop(start_server, torch.float32, steps=1)
    psched._core.export_model([str(server.state)], str(tmp_path / "model"))
    wider = ClickModel(TABLES, DIM, lambda k: psched.torch.EmbeddingBag(
        ROWS, DIM + 1, mode="sum", name=f"table{k}", optimizer="sgd", lr=0.1))
    with pytest.raises(psched.Error, match=rf"table 'table0' is {ROWS} x {DIM + 1} float32 in "
                                           rf"the model but {ROWS} x {DIM} float32"):
        psched.torch.to_local(wider, tmp_path / "model")
    renamed = ClickModel(TABLES, DIM, lambda k: psched.torch.EmbeddingBag(
        ROWS, DIM, mode="sum", name=f"other{k}", optimizer="sgd", lr=0.1))
    with pytest.raises(psched.Error, match="holds no table 'other0'"):
        psched.torch.to_local(renamed, tmp_path / "model")
    with pytest.raises(psched.Error, match="is no psched export: it has no manifest.json"):
        psched.torch.to_local(click_model(torch.float32), tmp_path)


@pytest.mark.parametrize("init", [("uniform", -0.5, 0.25), ("normal", 0.1, 2.0), ("zeros",)])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_initial_rows_are_the_shards_rows_bit_for_bit(start_server, init, dtype):
    ids = np.array([0, 1, 2, 99, 12345, 999_999, 123_456_789, (1 << 40) - 1], np.int64)
    with psched.connect(start_server().config) as client:
        table = client.register_table("t", 1 << 40, 5, dtype=dtype, optimizer="sgd",
                                      settings={"lr": 0.1}, init=init, seed=42)
        pulled = np.empty((len(ids), 5), dtype)
        client.pull_rows(table, ids, pulled)
    computed = psched._core.initial_rows(ids, 5, dtype, init, 42)
    assert computed.dtype == np.dtype(dtype)
    assert computed.tobytes() == pulled.tobytes()
    assert np.array_equal(psched._core.initial_rows(ids.view(np.uint64), 5, dtype, init, 42),
                          computed)
    with pytest.raises(psched.Error, match="ids must be a 1-D array of uint64 or int64"):
        psched._core.initial_rows(ids.astype(np.float64), 5, dtype, init, 42)


def test_state_dict_names_each_table_after_synchronizing(start_server):
    server = start_server(optimizer="sgd", lr=0.1)
    model = psched.torch.DistributedModel(click_model(torch.float32), config=server.config)
    log = ClickLog(TABLES, ROWS, IDS_PER_BAG, seed=0)
    x, ids, y = log.sample(32, torch.Generator().manual_seed(1))
    torch.nn.functional.binary_cross_entropy_with_logits(model(x, ids), y).backward()
    # After the step's update (synchronized first); cloned: a state dict shares the memory.
    state = {key: value.clone() if isinstance(value, torch.Tensor) else value
             for key, value in model.state_dict().items()}
    expected = model.module.bottom[0].weight.detach().clone()
    with torch.no_grad():
        model(x, ids)  # waits for nothing more: the update was in already
    assert torch.equal(state["module.bottom.0.weight"], expected)
    assert torch.equal(model.module.bottom[0].weight, expected)
    assert state["module.bags.0._extra_state"]["psched_table"] == "table0"
    assert state["module.bags.0._extra_state"]["num_embeddings"] == ROWS
    assert "module.bags.0.weight" not in state
    saved = io.BytesIO()
    torch.save(state, saved)  # a state dict pickles
    model.client.close()


def test_loading_a_torch_tables_weight_into_a_psched_table_is_refused():
    plain = ClickModel(TABLES, DIM, lambda k: torch.nn.EmbeddingBag(ROWS, DIM, mode="sum"))
    model = click_model(torch.float32)
    for strict in (True, False):
        with pytest.raises(psched.Error, match=r"'table0' cannot load 'bags.0.weight' \(a torch "
                                               rf"table's rows, shape \({ROWS}, {DIM}\)\)"):
            model.load_state_dict(plain.state_dict(), strict=strict)


def test_a_psched_state_dict_loads_into_the_same_model_and_refuses_another():
    model = click_model(torch.float32)
    state = model.state_dict()
    state["bottom.0.bias"] = torch.ones_like(state["bottom.0.bias"])
    model.load_state_dict(state)
    assert torch.equal(model.bottom[0].bias, torch.ones_like(model.bottom[0].bias))
    wider = ClickModel(TABLES, DIM, lambda k: psched.torch.EmbeddingBag(
        ROWS + 1, DIM, mode="sum", optimizer="sgd", lr=0.1))
    with pytest.raises(psched.Error, match=f"has num_embeddings {ROWS} where this one has "
                                           f"{ROWS + 1}"):
        wider.load_state_dict(state)


def test_a_distributed_model_refuses_load_state_dict_pickling_and_deepcopy(start_server):
    server = start_server()
    model = psched.torch.DistributedModel(click_model(torch.float32), config=server.config)
    for target in (model, model.module):
        with pytest.raises(psched.Error, match="would be undone at its next step"):
            target.load_state_dict(model.module.state_dict())
    with pytest.raises(psched.Error, match="would be undone at its next step"):
        model.module.bottom.load_state_dict(model.module.bottom.state_dict())  # a part of it
    for copy_it in (lambda m: torch.save(m, io.BytesIO()), copy.deepcopy):
        with pytest.raises(psched.Error, match="cannot be pickled or deep-copied"):
            copy_it(model)
        with pytest.raises(psched.Error, match="cannot be pickled or deep-copied"):
            copy_it(model.module)  # its tables, or the hooks DistributedModel gave it
    model.client.close()
    # Before it is connected, a model with psched tables copies and pickles as any module.
    fresh = click_model(torch.float32)
    saved = io.BytesIO()
    torch.save(fresh, saved)
    saved.seek(0)
    loaded = torch.load(saved)
    assert loaded.bags[0].name == "table0"
    assert copy.deepcopy(fresh).bags[1].num_embeddings == ROWS


class _PaddedModel(torch.nn.Module):
    """An Embedding and a mean EmbeddingBag with padding ids, and a linear layer over both."""

    def __init__(self):
        super().__init__()
        self.words = psched.torch.Embedding(50, 4, padding_idx=0, optimizer="sgd", lr=0.5,
                                            init=("normal", 0.0, 1.0), seed=5)
        self.bag = psched.torch.EmbeddingBag(30, 4, mode="mean", padding_idx=1,
                                             optimizer="rowwise_adagrad", lr=0.5, seed=6)
        self.out = torch.nn.Linear(8, 1)

    def forward(self, words, ids, offsets):
        return self.out(torch.cat([self.words(words).sum(1), self.bag(ids, offsets)], 1))


def test_embeddings_and_mean_bags_with_padding_become_torchs_and_predict_the_same(start_server,
                                                                                  tmp_path):
    server = start_server(mode="sync", checkpoint=True, optimizer="sgd", lr=0.1)
    torch.manual_seed(0)
    model = psched.torch.DistributedModel(_PaddedModel(), config=server.config)
    g = torch.Generator().manual_seed(3)

    def batch():
        words = torch.randint(0, 50, (16, 3), generator=g)
        ids = torch.randint(0, 30, (80,), generator=g)
        offsets = torch.arange(0, 80, 5)
        return words, ids, offsets

    for _ in range(3):
        model(*batch()).square().mean().backward()
    held_out = [batch() for _ in range(2)]
    held_out[0][0][0] = 0  # the padding ids appear
    held_out[0][1][:5] = 1
    with torch.no_grad():
        expected = [model(*b) for b in held_out]
    model.client.close()
    server.stop()
    psched.torch.export(model, tmp_path / "model", [server.state])
    local = psched.torch.to_local(_PaddedModel(), tmp_path / "model")
    assert type(local.words) is torch.nn.Embedding and local.words.padding_idx == 0
    assert type(local.bag) is torch.nn.EmbeddingBag and local.bag.mode == "mean"
    assert local.bag.padding_idx == 1 and not local.words.weight[0].any()
    with torch.no_grad():
        for b, want in zip(held_out, expected):
            assert torch.equal(local(*b), want)


def test_the_command_line_refuses_with_exit_status_2_naming_what_is_wrong(tmp_path):
    cli = pathlib.Path(os.environ.get("PSCHED_SERVER", "build/apps/psched-server")).with_name(
        "psched")
    (tmp_path / "empty").mkdir()
    (tmp_path / "taken").mkdir()
    for to, more, why in (
            ("out", [], f"export: {tmp_path / 'empty'} holds no shard checkpoint"),
            ("taken", [], "exists; name a new folder for the export"),
            ("out", ["--accept-log-loss"], "export: --accept-log-loss without --from-config")):
        run = subprocess.run([str(cli), "export", "--from", str(tmp_path / "empty"), "--to",
                              str(tmp_path / to), *more], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
        assert run.returncode == 2 and why in run.stderr and run.stderr.startswith(
            "psched export: ") and "export: export:" not in run.stderr, run.stderr
    assert not (tmp_path / "out").exists()
