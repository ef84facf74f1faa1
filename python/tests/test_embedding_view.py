# SPDX-License-Identifier: Apache-2.0
"""The operator view of embedding tables: each shard's rows, bytes and rows pushed and pulled
per table on /metrics, /status and `psched status`, after two sync workers trained."""
import json
import os
import pathlib
import re
import subprocess
import urllib.request

import torch

from conftest import SERVER
from test_embedding_exact import ROWS, half, make_batches, train_with_psched

ROWS_PER_STEP = 2 * 8 * 4  # at most: two workers' batches of 8 samples, 4 ids a bag


def get(port, path):
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}") as response:
        return response.read().decode()


def test_each_table_shows_its_rows_bytes_and_traffic_per_shard(start_server):
    server = start_server(mode="sync", workers=2, shards=2)
    batches = make_batches()[:5]
    workers, _, _ = train_with_psched(server, batches)
    for worker in workers:
        worker.client.close()
    # A row per id: each worker's step pulls its batch's distinct ids (its forward) and pushes
    # their gradients (its backward); before training, worker 0 read every row of each table
    # (train_with_psched).
    pushes = {f"bags.{i}": sum(len(torch.unique(half(batch, rank)[1][i]))
                               for batch in batches for rank in range(2))
              for i in range(4)}
    rows, pulled, pushed = {}, {}, {}
    for port in server.http_ports:
        tables = {t["name"]: t for t in json.loads(get(port, "/status"))["tables"]}
        assert sorted(tables) == [f"bags.{i}" for i in range(4)], tables
        for name, t in tables.items():
            assert 0 < t["rows"] == t["rows_created"] <= 40, t  # ids are drawn below 40
            row = t["payload_bytes"] // t["rows"]  # a row's value and optimizer state
            assert t["payload_bytes"] <= t["bytes"] <= (4096 + 64) * row, t  # one arena chunk
            assert 0 < t["rows_pushed"] <= 5 * ROWS_PER_STEP, t
            assert t["rows_pulled"] > 0, t  # every table has rows on both shards
            rows[name] = rows.get(name, 0) + t["rows"]
            pulled[name] = pulled.get(name, 0) + t["rows_pulled"]
            pushed[name] = pushed.get(name, 0) + t["rows_pushed"]
        metrics = get(port, "/metrics")
        for name, t in tables.items():
            line = re.search(rf'^psched_shard_table_rows\{{shard="\d+",table="{name}"\}} (\S+)$',
                             metrics, re.M)
            assert line and float(line.group(1)) == t["rows"], metrics
    touched = {index: len(torch.unique(torch.cat([batch[1][index].flatten()
                                                  for batch in batches])))
               for index in range(4)}
    assert rows == {f"bags.{i}": touched[i] for i in range(4)}  # every touched row, once
    # Over both shards: each id counted once, by the shard that holds its row.
    assert pushed == pushes
    assert pulled == {name: ROWS + count for name, count in pushes.items()}
    cli = pathlib.Path(SERVER).parent / "psched"
    status = subprocess.run([str(cli), "status", "--config", str(server.config)],
                            capture_output=True, text=True, env=os.environ)
    assert status.returncode == 0, status.stdout + status.stderr
    for shard in range(2):
        for index in range(4):
            assert re.search(rf"^shard {shard} table bags\.{index}: \d+ rows, ", status.stdout,
                             re.M), status.stdout
