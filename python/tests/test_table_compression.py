# SPDX-License-Identifier: Apache-2.0
"""Embedding tables follow the compression dense variables follow, on a real psched-server: a
table's own compression= first, then DistributedModel's compression=, then the deployment's
compression: section, then none; min_bytes is compared with the table's size (all its rows),
not with a batch's, so a small batch of a large table travels narrowed. The bytes are the
client's own record of each task it finished (Client.chrome_trace), by table."""
import json

import pytest
import torch

import psched
import psched.torch

DIM = 16
BIG = 1024  # rows: 1024 x 16 float32 = 65,536 bytes, the default min_bytes
SMALL = 1023  # 65,472 bytes: under it
IDS = torch.arange(64).reshape(8, 8)  # 64 unique ids a step: 4,096 bytes of float32 rows
WHOLE, HALF = 64 * DIM * 4, 64 * DIM * 2


def bag(rows, **keywords):
    return psched.torch.EmbeddingBag(rows, DIM, mode="sum", optimizer="sgd", lr=0.1, **keywords)


class Tables(torch.nn.Module):
    """A large table and a small one with no compression of their own, a large one with its
    own (fp16 pushes, pulls whole), and a dense layer."""

    def __init__(self):
        super().__init__()
        self.big, self.small = bag(BIG), bag(SMALL)
        self.own = bag(BIG, compression=psched.Compression(push="fp16", pull="none"))
        self.top = torch.nn.Linear(DIM, 1)

    def forward(self, ids):
        return self.top(self.big(ids) + self.small(ids) + self.own(ids))


def finished(client, tables):
    """Per table name: the bytes of its tasks the client finished since the last call, and
    their (push format, pull format) pairs, from the client's trace records."""
    names = {table.table.priority: name for name, table in tables.items()}
    out = {name: [0, set()] for name in tables}
    for event in json.loads(client.chrome_trace("worker", 0.0))["traceEvents"]:
        args = event.get("args") or {}
        if "bytes" in args and args["priority"] in names:
            entry = out[names[args["priority"]]]
            entry[0] += args["bytes"]
            entry[1].add((args["format"], args["value_format"]))
    return {name: (total, formats) for name, (total, formats) in out.items()}


def one_step(model):
    """The bytes and formats of each table's pull (the forward) and push (the backward)."""
    tables = {name: getattr(model.module, name) for name in ("big", "small", "own")}
    loss = model(IDS).sum()
    pulled = finished(model.client, tables)
    loss.backward()
    model.synchronize()
    return pulled, finished(model.client, tables)


def test_the_models_compression_reaches_its_tables_and_a_tables_own_wins(start_server):
    server = start_server()
    model = psched.torch.DistributedModel(
        Tables(), config=server.config, compression=psched.Compression(push="bf16", pull="bf16"))
    try:
        pulled, pushed = one_step(model)
        assert pulled["big"] == (HALF, {("none", "bf16")})  # 64 rows of a 64 KiB table
        assert pushed["big"] == (HALF, {("bf16", "none")})
        assert pulled["small"] == (WHOLE, {("none", "none")})  # the table is under min_bytes
        assert pushed["small"] == (WHOLE, {("none", "none")})
        assert pulled["own"] == (WHOLE, {("none", "none")})  # its own setting, not the model's
        assert pushed["own"] == (HALF, {("fp16", "none")})
        assert model.module.big.table.compression.push == "bf16"
        assert model.module.own.table.compression.push == "fp16"
    finally:
        model.client.close()


@pytest.mark.parametrize("model_compression, big", [
    (None, (("bf16", "none"), ("none", "fp16"))),  # the deployment's
    (psched.Compression(), (("none", "none"), ("none", "none"))),  # the model's beats it
])
def test_the_deployments_compression_reaches_tables_unless_the_model_says(start_server,
                                                                         model_compression, big):
    server = start_server(compression="{push: bf16, pull: fp16}")
    model = psched.torch.DistributedModel(Tables(), config=server.config,
                                          compression=model_compression)
    try:
        pulled, pushed = one_step(model)
        push_format, pull_format = big
        assert pushed["big"] == (WHOLE if push_format[0] == "none" else HALF, {push_format})
        assert pulled["big"] == (WHOLE if pull_format[1] == "none" else HALF, {pull_format})
        assert pushed["small"][0] == pulled["small"][0] == WHOLE
        assert pushed["own"] == (HALF, {("fp16", "none")})  # its own, whatever the others say
        assert pulled["own"] == (WHOLE, {("none", "none")})
    finally:
        model.client.close()


def test_a_topk_setting_for_every_variable_leaves_rows_whole_and_for_a_table_is_refused(
        start_server):
    server = start_server(compression="{push: topk, pull: topk, pull_full: bf16}")
    with psched.connect(server.config, 0) as client:
        table = client.register_table("t", BIG, DIM)
        assert (table.compression.push, table.compression.pull) == ("none", "bf16")
        model = psched.torch.DistributedModel(
            Tables(), client=client,
            compression=psched.Compression(push="onebit", pull="topk", pull_full="fp16"))
        pulled, pushed = one_step(model)
        assert pushed["big"] == (WHOLE, {("none", "none")})
        assert pulled["big"] == (HALF, {("none", "fp16")})
        refused = bag(BIG, name="refused", client=client,
                      compression=psched.Compression(push="topk"))
        with pytest.raises(psched.Error, match=r"table 'refused' rejected: its compression push "
                                               r"is topk, but rows travel as none, bf16 or fp16"):
            refused(IDS)
        with pytest.raises(psched.Error, match=r"table 'u' rejected: its compression pull is topk"):
            client.register_table("u", BIG, DIM, compression=psched.Compression(pull="topk"))
