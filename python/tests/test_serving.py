# SPDX-License-Identifier: Apache-2.0
"""Serving shards (psched-server --serve): a trained job's checkpoints answered read-only to
inference clients, which predict what the trained model predicts, bit for bit (float64); every
push refused naming the shard; a newer checkpoint loaded at SIGHUP while lookups go on, none
dropped; the version served in /status, /metrics and `psched status`."""
import json
import pathlib
import signal
import subprocess
import threading
import time
import urllib.request

import pytest
import torch

import psched
import psched.torch
from conftest import SERVER
from test_embedding_exact import (DENSE_LR, ROWS, evaluate, half, make_batches, psched_model,
                                  step, train_with_psched)


def inference_model(server):
    """The job's model on serving shards, as an inference client makes it: the same modules
    (their registrations are no-ops on shards that hold them), forward only."""
    return psched.torch.DistributedModel(psched_model(), "adam", config=server.config, worker=0,
                                         lr=DENSE_LR)


def predictions(model, held_out):
    with torch.no_grad():
        return [model(dense, ids) for dense, ids, _ in held_out]


def train_and_stop(start_server, batches, state=True):
    """A sync job of 2 workers on 2 shards trained on `batches` from its checkpoints in `state`
    (True: a directory of its own), then stopped (SIGTERM: each shard checkpoints); the
    server and what worker 0 predicted for the held-out batches at the end."""
    server = start_server(mode="sync", workers=2, shards=2, checkpoint=state)
    workers, _, _ = train_with_psched(server, batches)
    expected = [evaluate(workers[0], batch) for batch in HELD_OUT]
    for worker in workers:
        worker.client.close()
    server.stop()
    return server, expected


BATCHES = make_batches()
HELD_OUT = [half(batch, 1) for batch in BATCHES[-3:]]


def wait_for_log(server, text, count, seconds=30):
    deadline = time.monotonic() + seconds
    while sum(text in line for line in server.log) < count:
        assert time.monotonic() < deadline, f"no {count} '{text}' in:\n" + "".join(server.log)
        time.sleep(0.05)


def test_serving_shards_predict_what_the_trained_model_did_and_refuse_every_push(start_server):
    trained, expected = train_and_stop(start_server, BATCHES[:12])
    serving = start_server(shards=2, args=["--serve", str(trained.state)])
    model = inference_model(serving)
    for actual, wanted in zip(predictions(model, HELD_OUT), expected):
        assert torch.equal(actual, wanted)

    with pytest.raises(psched.Error) as refused:
        step(model, HELD_OUT[0])
        model.synchronize()
    assert refused.value.code == "read_only"
    assert "refused: shard" in str(refused.value) and "read-only" in str(refused.value)
    model.client.close()
    # The refused pushes changed nothing.
    again = inference_model(serving)
    for actual, wanted in zip(predictions(again, HELD_OUT), expected):
        assert torch.equal(actual, wanted)
    again.client.close()

    status = json.load(urllib.request.urlopen(
        f"http://127.0.0.1:{serving.http_ports[0]}/status"))
    assert status["serving"]["generation"] >= 2
    assert status["serving"]["versions_loaded"] == 1
    assert status["errors"]["read_only"] >= 1
    metrics = urllib.request.urlopen(
        f"http://127.0.0.1:{serving.http_ports[1]}/metrics").read().decode()
    assert 'psched_shard_served_generation{shard="1"}' in metrics
    printed = subprocess.run([str(pathlib.Path(SERVER).with_name("psched")), "status",
                              "--config", str(serving.config)],
                             check=True, capture_output=True, text=True).stdout
    assert "serving shard 0: " in printed and "serving shard 1: " in printed, printed


def test_a_newer_checkpoint_is_loaded_at_sighup_while_lookups_go_on_and_none_fails(
        start_server):
    trained, before = train_and_stop(start_server, BATCHES[:8])
    serving = start_server(shards=2, args=["--serve", str(trained.state)])
    model = inference_model(serving)
    assert predictions(model, HELD_OUT[:1])[0].equal(before[0])
    stop, failures, answered = threading.Event(), [], [0]

    def look_up():
        while not stop.is_set():
            try:
                predictions(model, HELD_OUT[:1])
                answered[0] += 1
            except Exception as error:  # reported below
                failures.append(error)
                return

    lookups = threading.Thread(target=look_up)
    lookups.start()
    try:
        # The job resumes from its checkpoints, trains on and stops: a newer checkpoint.
        _, after = train_and_stop(start_server, BATCHES[8:16], state=trained.state)
        counted = answered[0]
        serving.process.send_signal(signal.SIGHUP)
        wait_for_log(serving, "now serving", 2)
        while answered[0] < counted + 20 and not failures:  # lookups after the switch too
            time.sleep(0.01)
    finally:
        stop.set()
        lookups.join()
    assert not failures, failures
    # A client's lookups read the new version's rows at once; its dense parameters once it
    # refreshes them, and then it predicts what the resumed job did.
    ids = torch.arange(ROWS)
    stale_dense = [p.detach().clone() for p in model.module.top.parameters()]
    model.refresh()
    assert not all(p.equal(q) for p, q in zip(model.module.top.parameters(), stale_dense))
    for actual, wanted in zip(predictions(model, HELD_OUT), after):
        assert torch.equal(actual, wanted)
    assert not any(actual.equal(wanted) for actual, wanted in zip(after, before))
    fresh = inference_model(serving)
    for bag, new in zip(model.module.bags, fresh.module.bags):
        assert torch.equal(bag.rows(ids), new.rows(ids))
    model.client.close()
    fresh.client.close()


def test_a_model_averaging_buffers_the_served_job_kept_local_is_told_to_keep_them_local(
        start_server):
    """Serving shards hold the variables the job had: a model whose BatchNorm buffers are
    averaged (the default) against a job trained with buffers="local" is refused at its first
    forward naming buffers="local", and one made so predicts what the trained model did."""
    from test_torch import batch_norm_model, make_batches as plain_batches
    trained = start_server(checkpoint=True)
    model = psched.torch.DistributedModel(batch_norm_model(), "sgd", lr=0.1, buffers="local",
                                          config=trained.config)
    x, y = plain_batches(1, 32, torch.float64)[0]
    torch.nn.functional.cross_entropy(model(x), y).backward()
    model.synchronize()
    model.eval()
    with torch.no_grad():
        expected = model(x)
    model.client.close()
    trained.stop()

    serving = start_server(args=["--serve", str(trained.state)])
    averaged = psched.torch.DistributedModel(batch_norm_model(), "sgd", lr=0.1,
                                             config=serving.config).eval()
    with pytest.raises(psched.Error, match=r"buffer '0.running_mean' is not among the served "
                                           r"job's variables.*buffers=\"local\"") as refused:
        with torch.no_grad():
            averaged(x)
    assert refused.value.code == "read_only"
    averaged.client.close()
    local = psched.torch.DistributedModel(batch_norm_model(), "sgd", lr=0.1, buffers="local",
                                          config=serving.config).eval()
    with torch.no_grad():
        # The dense parameters are the trained ones; the running statistics this process's own.
        for name in ("running_mean", "running_var"):
            getattr(local.module[0], name).copy_(getattr(model.module[0], name))
        assert torch.equal(local(x), expected)
    local.client.close()
