# SPDX-License-Identifier: Apache-2.0
"""The examples with two worker processes, started as torchrun would start them (RANK,
WORLD_SIZE): python/examples/train_digits.py learns the digits, python/examples/train_ctr.py's
click model (its tables on the shards) lowers its logloss and raises its AUC."""
import json
import os
import pathlib
import re
import subprocess
import sys
import urllib.request

EXAMPLE = pathlib.Path(__file__).parents[1] / "examples" / "train_digits.py"
CTR_EXAMPLE = pathlib.Path(__file__).parents[1] / "examples" / "train_ctr.py"


def run_example(server):
    """Trains the example with two workers on `server`; checks they learn."""
    workers = [subprocess.Popen([sys.executable, str(EXAMPLE), "--epochs", "4"],
                                env={**os.environ, "PSCHED_CONFIG": str(server.config),
                                     "RANK": str(rank), "WORLD_SIZE": "2"},
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
               for rank in range(2)]
    outputs = [worker.communicate()[0] for worker in workers]
    for worker, output in zip(workers, outputs):
        assert worker.returncode == 0, output
        losses = [float(v) for v in re.findall(r"loss (\S+)", output)]
        accuracy = float(re.findall(r"test accuracy (\S+)", output)[-1])
        assert len(losses) == 4 and losses[-1] < losses[0] / 2 and accuracy > 0.9, output


def test_two_workers_learn_the_digits(start_server):
    run_example(start_server(mode="sync", workers=2))


def terminal_lines(tmp_path, command, env=None):
    """The lines two workers (`command(rank)`, with `env(rank)`) wrote into one file, as onto
    one terminal, both run to success."""
    terminal = tmp_path / "terminal.txt"
    with open(terminal, "ab") as shared:
        workers = [subprocess.Popen(command(rank), env=env(rank) if env else None, stdout=shared,
                                    stderr=subprocess.STDOUT)
                   for rank in range(2)]
        for worker in workers:
            assert worker.wait() == 0, terminal.read_text()
    return terminal.read_text().splitlines()


def test_two_workers_on_one_terminal_print_whole_lines(start_server, tmp_path):
    server = start_server(mode="sync", workers=2)
    lines = terminal_lines(
        tmp_path, lambda rank: [sys.executable, str(EXAMPLE), "--epochs", "4"],
        lambda rank: {**os.environ, "PSCHED_CONFIG": str(server.config), "RANK": str(rank),
                      "WORLD_SIZE": "2", "PYTHONUNBUFFERED": "1"})
    line = re.compile(r"worker [01](/2: \d+ training samples, \d+ steps per epoch, sync mode"
                      r"| epoch +\d+  loss \d\.\d{4}  test accuracy \d\.\d{3})$")
    assert len(lines) == 10 and all(line.match(text) for text in lines), lines


def test_the_demos_two_trainers_on_one_terminal_print_whole_lines(start_server, tmp_path):
    # scripts/demo: two psched-example-trainer processes writing to one terminal (here a file).
    trainer = pathlib.Path(os.environ.get("PSCHED_SERVER", "build/apps/psched-server")).with_name(
        "psched-example-trainer")
    server = start_server(mode="async", workers=2)
    lines = terminal_lines(tmp_path, lambda rank: [
        str(trainer), "--config", str(server.config), "--worker", str(rank), "--steps", "1000",
        "--print-every", "1"])
    line = re.compile(r"worker [01](: \d+ features, \d+ samples, loss of the true model \d\.\d{4}"
                      r"| step +\d+  loss \d\.\d{4}  accuracy \d\.\d{3})$")
    assert len(lines) == 2 * (1 + 1000), lines  # its first line, then every step
    assert all(line.match(text) for text in lines), lines


def test_the_deployment_compresses_the_example_without_a_change(start_server):
    server = start_server(mode="sync", workers=2,
                          compression="{push: bf16, pull: bf16, min_bytes: 0}")
    run_example(server)
    for port in server.http_ports:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/status") as response:
            wire = json.load(response)["wire_bytes"]
        assert wire["push"]["raw"] > 0 and wire["push"]["sent"] * 2 == wire["push"]["raw"], wire
        # Fresh values in bf16; the pulls that adopt the initial values travel whole.
        assert 0 < wire["pull"]["sent"] <= 0.51 * wire["pull"]["raw"], wire


def test_two_workers_learn_the_click_model_with_tables_on_the_shards(start_server):
    server = start_server(mode="sync", workers=2)
    for rank, output in enumerate(run_ctr(server, "--steps", "64")):
        aucs = [float(v) for v in re.findall(r"auc (\S+)", output)]
        assert len(aucs) >= 3 and aucs[-1] > aucs[0] + 0.1, output
        for line in output.splitlines():  # whole lines only, never two run together
            assert line.startswith(f"worker {rank}"), output


def test_the_click_models_torch_tables_start_from_the_rows_psched_gives(start_server):
    sys.path.insert(0, str(CTR_EXAMPLE.parent))
    try:
        from ctr_model import psched_uniform_rows
    finally:
        sys.path.pop(0)
    import numpy as np
    import psched
    with psched.connect(start_server().config, 0) as client:
        table = client.register_table("t", 5000, 8, init=("uniform", -0.25, 0.5), seed=3)
        rows = np.empty((5000, 8), np.float32)
        client.pull_rows(table, np.arange(5000, dtype=np.int64), rows)
    assert np.array_equal(rows, psched_uniform_rows(5000, 8, -0.25, 0.5, seed=3, chunk=999))


def test_the_click_models_export_evaluates_in_plain_torch_as_the_workers_last_did(start_server,
                                                                                   tmp_path):
    # scripts/example-ctr's end: the shards stopped, `psched export`, then train_ctr.py
    # --evaluate-export prints the workers' last held-out logloss and AUC again, with no shard.
    server = start_server(mode="sync", workers=2, checkpoint=True)
    last = re.findall(r"step +(\d+) .*test logloss (\S+)  auc (\S+)",
                      run_ctr(server, "--steps", "40")[0])[-1]
    server.stop()
    cli = pathlib.Path(os.environ.get("PSCHED_SERVER", "build/apps/psched-server")).with_name(
        "psched")
    subprocess.run([str(cli), "export", "--from", str(server.state), "--to",
                    str(tmp_path / "model")], check=True)
    evaluated = subprocess.run(
        [sys.executable, str(CTR_EXAMPLE), "--evaluate-export", str(tmp_path / "model")],
        env={k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE")},
        check=True, stdout=subprocess.PIPE, text=True).stdout
    assert re.findall(r"exported model, plain torch: step +(\d+)  test logloss (\S+)  auc (\S+)",
                      evaluated) == [last], (evaluated, last)


def run_ctr(server, *arguments):
    """The click example with two workers on `server`; --check must pass. Their outputs."""
    workers = [subprocess.Popen([sys.executable, str(CTR_EXAMPLE), "--check", *arguments],
                                env={**os.environ, "PSCHED_CONFIG": str(server.config),
                                     "RANK": str(rank), "WORLD_SIZE": "2"},
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
               for rank in range(2)]
    outputs = []
    for worker in workers:
        outputs.append(worker.communicate()[0])
        assert worker.returncode == 0, outputs[-1]  # --check: logloss fell and AUC rose
    return outputs


def shard_status(server):
    statuses = []
    for port in server.http_ports:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/status") as response:
            statuses.append(json.load(response))
    return statuses


def test_the_click_model_learns_with_a_tenth_of_its_rows_on_the_shards(start_server):
    arguments = ("--steps", "64", "--rows", "200000")
    free = start_server(mode="sync", workers=2)
    run_ctr(free, *arguments)
    touched = [t["rows"] for s in shard_status(free) for t in s["tables"]]
    held = max(s["tables_bytes"]["held"] for s in shard_status(free))
    bound, limit = max(touched) // 10, held // 2
    assert min(touched) > 1000
    tables = "".join(f"  - {{name: table{k}, max_rows: {bound}}}\n" for k in range(4))
    bounded = start_server(mode="sync", workers=2,
                           extra=f"tables:\n{tables}limits: {{max_table_bytes: {limit}}}\n")
    run_ctr(bounded, *arguments)
    for status in shard_status(bounded):
        assert status["tables_bytes"]["held"] <= limit < held
        for table in status["tables"]:
            assert table["rows"] <= bound and table["rows_evicted"] > 0
