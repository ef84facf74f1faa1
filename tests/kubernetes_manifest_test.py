# SPDX-License-Identifier: Apache-2.0
"""deploy/kubernetes/ validated offline (deploy/kubernetes/check.py against python3-kubernetes'
typed models): the shipped manifests and those of grow/ pass, each of a set of broken copies is
refused with a message naming what is wrong, and psched reads the ConfigMap's deployment file.
Then grow/reshard.yaml's script is run as its pod would run it, the volumes folders here: a job
of the ConfigMap's deployment on 2 shards, each a psched-server with a checkpoint folder of its
own (a pod's volume), trained 20 steps by 2 psched-example-trainers and SIGKILLed (its steps in
the update logs alone), is placed on 3 by the script, and 3 shards of the deployment grown as
README's "Growing a job" says start from it (slot map epoch 2 on 3 shards) and train on from
step 21 (or 22, where the other worker pushed step 21 first). Exits 77 (skipped) where
python3-kubernetes is missing.
Usage: kubernetes_manifest_test.py SOURCE_DIR BUILD_DIR"""
import copy
import importlib.util
import os
import pathlib
import re
import shutil
import subprocess
import sys
import tempfile

from free_ports import free_ports

if importlib.util.find_spec("kubernetes") is None:  # check.py's models
    print("skipped: no python3-kubernetes (scripts/setup installs it)")
    sys.exit(77)

source = pathlib.Path(sys.argv[1])
build = pathlib.Path(sys.argv[2])
sys.path.insert(0, str(source / "deploy" / "kubernetes"))
import check  # noqa: E402


def document(documents, kind):
    return next(d for _, d in documents if d["kind"] == kind)


def shard_container(documents):
    return document(documents, "StatefulSet")["spec"]["template"]["spec"]["containers"][0]


def set_in_deployment(documents, text, replacement):
    data = document(documents, "ConfigMap")["data"]
    data["deployment.yaml"] = data["deployment.yaml"].replace(text, replacement)


# (what is broken, how, a part of the expected message)
BROKEN = [
    ("a misspelt field", lambda d: shard_container(d)["ports"][0].update(
        {"containerport": shard_container(d)["ports"][0].pop("containerPort")}),
     "V1ContainerPort has no field 'containerport'"),
    ("a field of the wrong type", lambda d: document(d, "StatefulSet")["spec"].update(
        replicas="2"), "spec.replicas: expected int, got '2'"),
    ("a missing required field", lambda d: shard_container(d).pop("name"),
     "Invalid value for `name`, must not be `None`"),
    ("an unknown kind", lambda d: document(d, "Job").update(kind="CronJobs"),
     "unknown apiVersion/kind ('batch/v1', 'CronJobs')"),
    ("more replicas than shards", lambda d: document(d, "StatefulSet")["spec"].update(
        replicas=3), "2 shards but the StatefulSet has 3 replicas"),
    ("a shard under another name", lambda d: set_in_deployment(
        d, "listen: psched-shard-1.psched:7410", "listen: shard-1.psched:7410"),
     "shards[1].listen is 'shard-1.psched:7410', expected psched-shard-1.psched:7410"),
    ("more trainers than workers", lambda d: document(d, "Job")["spec"].update(completions=3),
     "workers is 2 but the Job has 3 completions"),
    ("a shard from the trainer image", lambda d: shard_container(d).update(
        image="registry.example/psched-trainer:1.0"),
     "container 'shard' runs image 'registry.example/psched-trainer:1.0', expected psched-server"),
    ("a state volume the server's user cannot write", lambda d: document(d, "StatefulSet")[
        "spec"]["template"]["spec"].pop("securityContext"), "securityContext.fsGroup 10001"),
    ("a selector missing the shards", lambda d: document(d, "Service")["spec"]["selector"].update(
        {"app.kubernetes.io/component": "trainer"}), "the selector does not select the shard pods"),
]


def reshard_container(grow):
    return document(grow, "Job")["spec"]["template"]["spec"]["containers"][0]


def set_env(container, name, value):
    next(e for e in container["env"] if e["name"] == name)["value"] = value


def volume(grow, name):
    volumes = document(grow, "Job")["spec"]["template"]["spec"]["volumes"]
    return next(v for v in volumes if v["name"] == name)


# The same for grow/, checked against the shipped deployment.
BROKEN_GROW = [
    ("a reshard of another shard count", lambda g: set_env(reshard_container(g), "OLD_SHARDS",
                                                           "3"),
     "OLD_SHARDS is 3 but configmap.yaml[0] ConfigMap's deployment.yaml has 2 shards"),
    ("no claim for the new shard", lambda g: g.remove(
        next(d for d in g if d[1]["kind"] == "PersistentVolumeClaim")),
     "no PersistentVolumeClaim state-psched-shard-2 for new shard 2"),
    ("a claim unlike the StatefulSet's", lambda g: document(g, "PersistentVolumeClaim")["spec"][
        "resources"]["requests"].update(storage="1Gi"), "spec differs from the StatefulSet's"),
    ("a shard's volume mounted for another", lambda g: volume(g, "state-2")[
        "persistentVolumeClaim"].update(claimName="state-psched-shard-1"),
     "/state/2 mounts claim 'state-psched-shard-1', expected state-psched-shard-2"),
    ("the deployment file not mounted", lambda g: reshard_container(g)["volumeMounts"].pop(0),
     "/etc/psched/deployment.yaml is not mounted"),
    ("psched reshard from the shell-less image", lambda g: reshard_container(g).update(
        image="psched-server:latest"), "expected psched-trainer"),
]


def write_secrets(mounts):
    """The Secrets' files where the pods mount them, under `mounts`: the test certificates of
    tests/tls/ and a token."""
    for name, origin in (("tls.crt", "server.pem"), ("tls.key", "server.key"),
                         ("ca.crt", "ca.pem")):
        (mounts / "tls").mkdir(exist_ok=True)
        shutil.copy(source / "tests" / "tls" / origin, mounts / "tls" / name)
    (mounts / "auth").mkdir()
    (mounts / "auth" / "token").write_text("a test token\n")
    (mounts / "auth" / "token").chmod(0o600)


def check_deployment_loads(documents):
    """`psched status` reads the ConfigMap's deployment.yaml, with the Secrets' files (the test
    certificates of tests/tls/ and a token) where the pods mount them: it exits 1 with every
    shard down (no cluster here), where a file it cannot use exits 2."""
    text = document(documents, "ConfigMap")["data"]["deployment.yaml"]
    with tempfile.TemporaryDirectory() as folder:
        mounts = pathlib.Path(folder)
        write_secrets(mounts)
        (mounts / "deployment.yaml").write_text(text.replace("/etc/psched/", f"{folder}/"))
        result = subprocess.run([build / "apps" / "psched", "status", "--config",
                                 mounts / "deployment.yaml"], capture_output=True, text=True,
                                timeout=30)
    print(result.stdout + result.stderr, end="")
    shards = text.count("- listen:")
    down = result.stdout.count(" down ")
    if result.returncode != 1 or down != shards:
        print(f"FAIL: expected `psched status` to exit 1 with {shards} shards down; it exited "
              f"{result.returncode} with {down} down")
        return False
    print(f"psched reads the ConfigMap's deployment.yaml: {shards} shards, all down here")
    return True


def grown(text, shards):
    """The ConfigMap's deployment.yaml with `shards` shards, as README's "Growing a job" has an
    operator edit it: an entry for each new pod psched-shard-i."""
    last = "    http: psched-shard-1.psched:8410\n"
    more = "".join(f"  - listen: psched-shard-{i}.psched:7410\n"
                   f"    http: psched-shard-{i}.psched:8410\n" for i in range(2, shards))
    return text.replace(last, last + more)


def on_this_host(text, mounts, ports, state):
    """The deployment `text` on loopback: shard i listening on ports[i] (its view on
    ports[shards + i]), the Secrets' files under `mounts`, TLS for localhost (the test
    certificate's name), checkpoints in `state`."""
    shards = text.count("- listen:")
    for i in range(shards):
        text = text.replace(f"psched-shard-{i}.psched:7410", f"127.0.0.1:{ports[i]}")
        text = text.replace(f"psched-shard-{i}.psched:8410", f"127.0.0.1:{ports[shards + i]}")
    text = text.replace("server_name: psched-shard", "server_name: localhost")
    return text.replace("/var/lib/psched", str(state)).replace("/etc/psched/", f"{mounts}/")


def start_shards(text, mounts, shards, name):
    """Each shard of `text` a psched-server of its own, its checkpoints in mounts/state/<i> (its
    pod's volume), serving; returns (processes, the first one's deployment file)."""
    ports = free_ports(2 * shards)
    servers, files = [], []
    for i in range(shards):
        files.append(mounts / f"{name}-{i}.yaml")
        files[-1].write_text(on_this_host(text, mounts, ports, mounts / "state" / str(i)))
        servers.append(subprocess.Popen([build / "apps" / "psched-server", "--config", files[-1],
                                         "--shard", str(i), "--job", "psched", "--threads", "1"],
                                        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
    subprocess.run([build / "apps" / "psched", "status", "--config", files[0], "--wait", "30"],
                   capture_output=True, timeout=60)
    return servers, files[0]


def train(deployment, steps):
    """Both workers of the job, psched-example-trainers, to step `steps`: their output."""
    trainers = [subprocess.Popen([build / "apps" / "psched-example-trainer", "--steps",
                                  str(steps), "--print-every", "99"],
                                 env=dict(os.environ, PSCHED_CONFIG=str(deployment),
                                          RANK=str(rank), WORLD_SIZE="2"),
                                 stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
                for rank in range(2)]
    outputs = [t.communicate(timeout=60)[0] for t in trainers]
    if any(t.returncode != 0 for t in trainers):
        raise RuntimeError("a trainer failed:\n" + "\n".join(outputs))
    return "".join(outputs)


def run_reshard_job(grow, mounts):
    """grow/reshard.yaml's container command, run here as its pod runs it: /state/<i> and
    /etc/psched/ being folders of `mounts`, psched from the build. Its exit status and output."""
    container = reshard_container(grow)
    command = [part.replace("/state/", f"{mounts}/state/").replace("/etc/psched/", f"{mounts}/")
               for part in container["command"]]
    env = dict(os.environ, PATH=f"{build / 'apps'}:{os.environ['PATH']}",
               **{e["name"]: e["value"] for e in container["env"]})
    result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=60)
    return result.returncode, result.stdout + result.stderr


def check_growing_runs(shipped, grow):
    """README's "Growing a job" on this host: the job stopped hard, the reshard Job's script,
    the deployment grown to NEW_SHARDS shards started from what it wrote."""
    text = document(shipped, "ConfigMap")["data"]["deployment.yaml"]
    new = int(next(e["value"] for e in reshard_container(grow)["env"]
                   if e["name"] == "NEW_SHARDS"))
    with tempfile.TemporaryDirectory() as folder:
        mounts = pathlib.Path(folder)
        write_secrets(mounts)
        for i in range(new):
            (mounts / "state" / str(i)).mkdir(parents=True)
        servers, deployment = start_shards(text, mounts, 2, "old")
        try:
            train(deployment, 20)
        finally:
            for server in servers:
                server.kill()  # the job's steps are in the shards' update logs alone
                server.wait()
        # The pod mounts the ConfigMap's deployment file, the job's, at /etc/psched/.
        (mounts / "deployment.yaml").write_text(text.replace("/etc/psched/", f"{mounts}/"))
        status, output = run_reshard_job(grow, mounts)
        print(output, end="")
        written = sorted(p.name for p in (mounts / "state").glob("*/shard-*.ckpt"))
        expected = [f"shard-{i}.00000001.ckpt" for i in range(new)]
        if status != 0 or written != expected or "logged update(s) replayed" not in output:
            print(f"FAIL: the reshard Job's script exited {status}, wrote {written} (expected "
                  f"{expected}), replaying the logs")
            return False
        servers, deployment = start_shards(grown(text, new), mounts, new, "new")
        try:
            placement = subprocess.run([build / "apps" / "psched", "status", "--config",
                                        deployment], capture_output=True, text=True,
                                       timeout=30).stdout
            resumed = train(deployment, 25)
        finally:
            for server in servers:
                server.terminate()
                server.wait()
    placed = placement.count(f"slot map epoch 2 on {new} shard(s)")
    # A trainer joins at the job's step, 21, or at 22 where the other pushed step 21 first.
    joined = sorted(int(step) for step in re.findall(r"joins the job at step (\d+)", resumed))
    if placed != new or len(joined) != 2 or not all(21 <= step <= 22 for step in joined):
        print(f"FAIL: {placed} of {new} shards on the new slot map, workers joined at steps "
              f"{joined}, expected both at 21 or 22:\n{placement}{resumed}")
        return False
    print(f"the reshard Job's script placed the job of 2 shards, killed after step 20, on {new}: "
          f"each starts from it (slot map epoch 2) and the workers resume at steps {joined}")
    return True


def main():
    shipped = check.load(source / "deploy" / "kubernetes")
    grow = check.load(source / "deploy" / "kubernetes" / "grow", "grow/")
    problems = check.check(shipped, grow)
    if problems:
        print("the shipped manifests fail:", *problems, sep="\n  ")
        return 1
    print(f"the shipped manifests pass: {', '.join(where for where, _ in shipped + grow)}")
    failed = 0
    for broken, in_grow in ((BROKEN, False), (BROKEN_GROW, True)):
        for what, breakage, expected in broken:
            documents, grown_documents = copy.deepcopy(shipped), copy.deepcopy(grow)
            breakage(grown_documents if in_grow else documents)
            problems = check.check(documents, grown_documents)
            if any(expected in p for p in problems):
                print(f"refused {what}: {next(p for p in problems if expected in p)}")
            else:
                print(f"FAIL: {what} not refused with {expected!r}; problems: {problems}")
                failed += 1
    if failed or not check_deployment_loads(shipped):
        return 1
    return 0 if check_growing_runs(shipped, grow) else 1


if __name__ == "__main__":
    sys.exit(main())
