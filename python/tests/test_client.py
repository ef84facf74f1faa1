# SPDX-License-Identifier: Apache-2.0
"""psched's Python client over real psched-server processes: zero-copy memory, the push/wait
cycle, and errors as Python exceptions."""
import json
import os
import re
import time

import numpy as np
import pytest
import torch

import psched
from conftest import free_ports


def connect(server, worker=0):
    return psched.connect(server.config, worker)


def test_push_and_wait_update_the_registered_array_in_place(start_server):
    server = start_server(optimizer="sgd", lr=0.5)
    with connect(server) as client:
        w = np.arange(1000, dtype=np.float64)  # spans both shards, several partitions
        variable = client.register("w", w)
        assert variable.value is w and variable.shape == (1000,) and variable.dtype == "float64"
        grad = np.full(1000, 2.0)
        client.push(variable, 1, grad)
        client.wait(variable, 1)
        np.testing.assert_array_equal(w, np.arange(1000) - 1.0)  # sgd: w -= 0.5 * 2


def test_the_chrome_trace_holds_each_partition_on_the_callers_time_axis(start_server):
    server = start_server()  # partitions of 1 KiB: 8000 bytes are 8 of them
    with connect(server) as client:
        w = np.zeros(1000, dtype=np.float64)
        client.register("w", w)
        epoch = time.monotonic()
        client.push("w", 1, np.ones(1000))
        client.wait("w", 1)
        elapsed_us = (time.monotonic() - epoch) * 1e6
        events = json.loads(client.chrome_trace("worker 0", epoch))["traceEvents"]
        assert events[0] == {"ph": "M", "name": "process_name", "pid": 0,
                             "args": {"name": "worker 0"}}
        partitions = [e for e in events if e["name"].startswith("p0 ")]
        assert sum(e["args"]["bytes"] for e in partitions) == 8000
        for e in partitions:
            assert 0 <= e["ts"] and e["ts"] + e["dur"] <= elapsed_us
        assert json.loads(client.chrome_trace("worker 0", epoch))["traceEvents"] == \
            events[:1]  # taken: the next call holds only what finished since


def test_ready_polls_without_consuming_the_push(start_server):
    server = start_server()
    with connect(server) as client:
        w = np.zeros((4, 3), dtype=np.float32)
        client.register("w", w, optimizer=psched.Optimizer("sgd", lr=1.0))
        client.push("w", 1, np.ones((4, 3), dtype=np.float32))
        client.wait("w", 1)
        assert (w == -1).all()
        with pytest.raises(psched.Error, match="no such push.*already waited for") as error:
            client.ready("w", 1)  # the wait consumed it
        assert error.value.code == "invalid_argument"


def test_a_torch_tensor_is_registered_without_a_copy(start_server):
    server = start_server()
    with connect(server) as client:
        weight = torch.nn.Linear(8, 4).weight
        before = weight.detach().clone()
        client.register("linear/weight", weight, optimizer=psched.Optimizer("sgd", lr=0.25))
        client.push("linear/weight", 1, torch.ones(4, 8))
        client.wait("linear/weight", 1)
        torch.testing.assert_close(weight.detach(), before - 0.25, rtol=0, atol=1e-7)


def test_a_second_worker_adopts_the_first_registration_by_pull(start_server):
    server = start_server(workers=2)
    with connect(server, 0) as first, connect(server, 1) as second:
        first.register("w", np.full(10, 3.0))
        mine = np.zeros(10)
        second.register("w", mine)
        second.pull("w")
        np.testing.assert_array_equal(mine, np.full(10, 3.0))


def test_a_gradient_of_the_wrong_shape_is_refused_at_push(start_server):
    server = start_server()
    with connect(server) as client:
        client.register("w", np.zeros((2, 3), dtype=np.float32))
        with pytest.raises(psched.Error, match=r"shape \(3, 2\) differs.*\(2, 3\)") as error:
            client.push("w", 1, np.zeros((3, 2), dtype=np.float32))
        assert error.value.code == "shape_mismatch"


def test_a_gradient_of_the_wrong_dtype_is_refused_at_push(start_server):
    server = start_server()
    with connect(server) as client:
        client.register("w", np.zeros(6, dtype=np.float32))
        with pytest.raises(psched.Error, match="gradient is float64, the variable is float32") \
                as error:
            client.push("w", 1, np.zeros(6))
        assert error.value.code == "dtype_mismatch"


def test_unsupported_and_non_contiguous_arrays_are_refused_at_register(start_server):
    server = start_server()
    with connect(server) as client:
        with pytest.raises(psched.Error, match="not float32 or float64") as error:
            client.register("ints", np.zeros(4, dtype=np.int32))
        assert error.value.code == "dtype_mismatch"
        with pytest.raises(psched.Error, match="not C-contiguous") as error:
            client.register("strided", np.zeros((4, 4), dtype=np.float32).T)
        assert error.value.code == "invalid_argument"


def test_an_unknown_name_raises_unknown_variable(start_server):
    server = start_server()
    with connect(server) as client:
        with pytest.raises(psched.Error, match="no variable 'nope'") as error:
            client.push("nope", 1, np.zeros(1))
        assert error.value.code == "unknown_variable"


def test_a_conflicting_registration_raises_the_servers_message(start_server):
    server = start_server(workers=2)
    with connect(server, 0) as first, connect(server, 1) as second:
        first.register("w", np.zeros(8))
        with pytest.raises(psched.Error, match="'w'") as error:
            second.register("w", np.zeros(9))
        assert error.value.code == "spec_conflict"


def test_a_server_that_is_gone_raises_disconnected_without_hanging(start_server):
    server = start_server(reconnect_seconds=2)  # the client gives up after 2 s, not 60
    with connect(server) as client:
        w = np.zeros(100, dtype=np.float32)
        client.register("w", w)
        client.push("w", 1, np.ones(100, dtype=np.float32))
        client.wait("w", 1)
        server.kill()
        with pytest.raises(psched.DisconnectedError) as error:
            client.push("w", 2, np.ones(100, dtype=np.float32))
            client.wait("w", 2)
        assert error.value.code == "disconnected"
        with pytest.raises(psched.DisconnectedError):
            client.pull("w")


def test_connecting_to_no_server_raises_disconnected():
    port = free_ports(1)[0]
    with pytest.raises(psched.DisconnectedError, match=f"127.0.0.1:{port}"):
        psched.connect(shards=[f"127.0.0.1:{port}"])


def test_a_bad_config_names_the_file_and_line(tmp_path):
    config = tmp_path / "bad.yaml"
    config.write_text("shards:\n  - listen: 127.0.0.1:7410\nmode: sometimes\n")
    with pytest.raises(psched.Error, match=r"bad.yaml:3.*mode") as error:
        psched.connect(config)
    assert error.value.code == "bad_config"


def test_world_size_must_match_the_configs_workers(start_server, monkeypatch):
    server = start_server(workers=2)
    monkeypatch.setenv("WORLD_SIZE", "3")
    with pytest.raises(psched.Error, match="WORLD_SIZE=3.*workers: 2"):
        psched.connect(server.config)


def test_the_worker_id_comes_from_rank(start_server, monkeypatch):
    server = start_server(workers=2)
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("PSCHED_CONFIG", str(server.config))
    with psched.connect() as client:
        assert client.worker == 1 and client.deployment.workers == 2


def test_an_optimizer_takes_every_setting_by_name_and_refuses_others():
    adam = psched.Optimizer("adam", lr=0.5, beta2=0.99, amsgrad=True)
    assert (adam.kind, adam.lr, adam.beta2, adam.amsgrad) == ("adam", 0.5, 0.99, True)
    assert adam.eps == 1e-8  # left out: PyTorch's default
    with pytest.raises(TypeError, match="'betas'.*expected one of: lr, momentum"):
        psched.Optimizer("adam", betas=(0.9, 0.99))
    with pytest.raises(TypeError, match="amsgrad takes True or False, not 1.5"):
        psched.Optimizer("adam", amsgrad=1.5)
    with pytest.raises(psched.Error, match="lr"):
        psched.Optimizer("sgd", lr=-1.0)


def test_a_compression_names_its_formats_and_refuses_others():
    c = psched.Compression(push="topk", pull="bf16", topk_fraction=0.05, min_bytes=0)
    assert (c.push, c.pull, c.topk_fraction, c.min_bytes) == ("topk", "bf16", 0.05, 0)
    d = psched.Compression(pull="topk", pull_fraction=0.02, ring=8, refresh_steps=100,
                           pull_full="bf16")
    assert (d.pull, d.pull_fraction, d.ring, d.refresh_steps, d.pull_full) == (
        "topk", 0.02, 8, 100, "bf16")
    with pytest.raises(psched.Error, match="'onebit' is not a pull format"):
        psched.Compression(pull="onebit")
    with pytest.raises(psched.Error, match="'topk' is not a value format"):
        psched.Compression(pull="topk", pull_full="topk")
    with pytest.raises(psched.Error, match="ring 0 keeps no delta"):
        psched.Compression(pull="topk", ring=0)
    with pytest.raises(psched.Error, match="'int8' is not a push format"):
        psched.Compression(push="int8")
    with pytest.raises(psched.Error, match="topk_fraction 2 is not a fraction in"):
        psched.Compression(push="topk", topk_fraction=2.0)


def test_a_variable_registered_with_bf16_receives_its_values_in_bf16(start_server):
    server = start_server()
    with psched.connect(server.config) as client:
        w = np.zeros(1000, dtype=np.float32)
        client.register("w", w, optimizer=psched.Optimizer("sgd", lr=1.0),
                        compression=psched.Compression(push="bf16", pull="bf16", min_bytes=0))
        gradient = np.full(1000, -1.0 / 3, dtype=np.float32)
        client.push("w", 1, gradient)
        client.wait("w", 1)
        # 1/3 in bf16 is 0.333984375: narrowed on the way up and again on the way back.
        assert np.all(w == np.float32(0.333984375)), w[:4]
        client.pull("w")  # the shard's value, whole: the bf16 gradient applied in float32
        assert np.all(w == np.float32(0.333984375)), w[:4]


def test_a_restarted_sync_worker_starts_at_the_jobs_step_from_its_values(start_server):
    server = start_server(mode="sync", workers=2, optimizer="sgd", lr=1.0)
    values = [np.zeros(1000, dtype=np.float64) for _ in range(2)]
    clients = [connect(server, w) for w in range(2)]
    assert [c.start_step for c in clients] == [1, 1]  # declared workers of a fresh job
    for client, w in zip(clients, values):
        client.register("w", w)
    for step in (1, 2, 3):
        for client in clients:
            client.push("w", step, np.full(1000, float(step)))
        for client in clients:
            client.wait("w", step)
    clients[1].close()  # worker 1 "dies" after step 3; a new process with its id starts
    with connect(server, 1) as again:
        assert again.start_step == 4
        fresh = np.full(1000, 99.0)
        again.register("w", fresh)
        again.pull("w", after=again.start_step - 1)
        np.testing.assert_array_equal(fresh, values[0])  # -(1 + 2 + 3)
        with pytest.raises(psched.Error) as refused:
            again.push("w", 3, np.ones(1000))  # a step that closed without it
            again.wait("w", 3)
        assert refused.value.code == "stale_step"
        for client in (clients[0], again):
            client.push("w", 4, np.full(1000, 4.0))
        for client in (clients[0], again):
            client.wait("w", 4)
        np.testing.assert_array_equal(values[0], np.full(1000, -10.0))
    clients[0].close()


def test_a_client_that_does_not_join_leaves_the_membership_alone(start_server):
    server = start_server(mode="sync", workers=1, optimizer="sgd", lr=1.0)
    with connect(server, 0) as trainer:
        w = np.zeros(10)
        trainer.register("w", w)
        trainer.push("w", 1, np.ones(10))
        trainer.wait("w", 1)
        with psched.connect(server.config, 0, join=False) as reader:
            assert reader.start_step == 1
            seen = np.zeros(10)
            reader.register("w", seen)
            reader.pull("w")
            np.testing.assert_array_equal(seen, -np.ones(10))
        trainer.push("w", 2, np.ones(10))  # still a member: its step 2 is applied
        trainer.wait("w", 2)
        np.testing.assert_array_equal(w, np.full(10, -2.0))


def test_a_client_follows_a_shard_restarted_at_another_port(start_server):
    """The server restarted on "another node" (another port, same checkpoint directory), the
    deployment file replaced to say so: a connected client's next push reconnects there and its
    update is applied once (docs/reliability.md)."""
    server = start_server(shards=1, checkpoint=True)
    client = psched.connect(server.config)
    w = np.zeros(4, np.float32)
    variable = client.register("w", w)
    client.push(variable, 1, np.ones(4, np.float32))
    client.wait(variable, 1)
    server.kill()
    old = re.search(r"listen: 127\.0\.0\.1:(\d+)", server.config.read_text()).group(1)
    new = free_ports(1)[0]
    edited = server.config.with_suffix(".new")
    edited.write_text(server.config.read_text().replace(f"127.0.0.1:{old}", f"127.0.0.1:{new}"))
    os.replace(edited, server.config)  # whole, as docs/reliability.md asks
    server._start()
    client.push(variable, 2, np.ones(4, np.float32))
    client.wait(variable, 2)
    np.testing.assert_array_equal(w, np.full(4, -0.2, np.float32))  # sgd, lr 0.1: two steps
    client.close()
    options = psched.ClientOptions.from_config(psched.load_deployment(str(server.config)), 0)
    assert options.deployment_file == str(server.config.resolve())
