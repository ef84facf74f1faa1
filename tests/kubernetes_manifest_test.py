# SPDX-License-Identifier: Apache-2.0
"""deploy/kubernetes/ validated offline (deploy/kubernetes/check.py against python3-kubernetes'
typed models): the shipped manifests pass, each of a set of broken copies is refused with a
message naming what is wrong, and psched reads the ConfigMap's deployment file. Exits 77
(skipped) where python3-kubernetes is missing.
Usage: kubernetes_manifest_test.py SOURCE_DIR BUILD_DIR"""
import copy
import importlib.util
import pathlib
import shutil
import subprocess
import sys
import tempfile

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


def check_deployment_loads(documents):
    """`psched status` reads the ConfigMap's deployment.yaml, with the Secrets' files (the test
    certificates of tests/tls/ and a token) where the pods mount them: it exits 1 with every
    shard down (no cluster here), where a file it cannot use exits 2."""
    text = document(documents, "ConfigMap")["data"]["deployment.yaml"]
    with tempfile.TemporaryDirectory() as folder:
        mounts = pathlib.Path(folder)
        for name, origin in (("tls.crt", "server.pem"), ("tls.key", "server.key"),
                             ("ca.crt", "ca.pem")):
            (mounts / "tls").mkdir(exist_ok=True)
            shutil.copy(source / "tests" / "tls" / origin, mounts / "tls" / name)
        (mounts / "auth").mkdir()
        (mounts / "auth" / "token").write_text("a test token\n")
        (mounts / "auth" / "token").chmod(0o600)
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


def main():
    shipped = check.load(source / "deploy" / "kubernetes")
    problems = check.check(shipped)
    if problems:
        print("the shipped manifests fail:", *problems, sep="\n  ")
        return 1
    print(f"the shipped manifests pass: {', '.join(where for where, _ in shipped)}")
    failed = 0
    for what, breakage, expected in BROKEN:
        documents = copy.deepcopy(shipped)
        breakage(documents)
        problems = check.check(documents)
        if any(expected in p for p in problems):
            print(f"refused {what}: {next(p for p in problems if expected in p)}")
        else:
            print(f"FAIL: {what} not refused with {expected!r}; problems: {problems}")
            failed += 1
    return 1 if failed or not check_deployment_loads(shipped) else 0


if __name__ == "__main__":
    sys.exit(main())
