#!/usr/bin/python3
# SPDX-License-Identifier: Apache-2.0
"""Checks the manifests in this folder offline, without a cluster: every field against the
Kubernetes API's typed models (Debian's python3-kubernetes), then that the files agree with
each other (names, labels, ports, shards and workers); and those of its grow/ folder (the Job
that places a stopped job's checkpoints on more shards, and the new shards' volume claims)
likewise, and against the deployment they grow. Prints one line per problem, naming the file,
document and field; exits 1 if there is any.

    deploy/kubernetes/check.py [FOLDER]    # default: the folder this file is in
"""
import pathlib
import re
import sys

import kubernetes.client
import yaml

MODELS = {("v1", "Service"): "V1Service", ("v1", "ConfigMap"): "V1ConfigMap",
          ("apps/v1", "StatefulSet"): "V1StatefulSet", ("batch/v1", "Job"): "V1Job",
          ("v1", "PersistentVolumeClaim"): "V1PersistentVolumeClaim"}
PRIMITIVES = {"str": str, "int": int, "bool": bool, "float": (int, float), "date": str,
              "datetime": str}


def check_value(value, type_name, where, problems):
    """Appends to `problems` what in `value` does not fit the API type `type_name` (as the
    models' openapi_types spell it: "str", "list[V1Container]", "dict(str, str)", "V1Pod")."""
    if type_name == "object":  # IntOrString, Quantity and free-form fields
        return
    if match := re.fullmatch(r"list\[(.+)\]", type_name):
        if not isinstance(value, list):
            problems.append(f"{where}: expected a list, got {value!r}")
            return
        for i, item in enumerate(value):
            check_value(item, match[1], f"{where}[{i}]", problems)
    elif match := re.fullmatch(r"dict\(str, (.+)\)", type_name):
        if not isinstance(value, dict):
            problems.append(f"{where}: expected a map, got {value!r}")
            return
        for key, item in value.items():
            check_value(item, match[1], f"{where}.{key}", problems)
    elif type_name in PRIMITIVES:
        if not isinstance(value, PRIMITIVES[type_name]) or (
                isinstance(value, bool) and type_name != "bool"):
            problems.append(f"{where}: expected {type_name}, got {value!r}")
    else:
        check_object(value, getattr(kubernetes.client, type_name), where, problems)


def check_object(value, model, where, problems):
    """Every field of the map `value` must be one of `model`'s, of its type."""
    if not isinstance(value, dict):
        problems.append(f"{where}: expected a {model.__name__} map, got {value!r}")
        return
    attributes = {json_name: attr for attr, json_name in model.attribute_map.items()}
    for key, item in value.items():
        if key not in attributes:
            problems.append(f"{where}: {model.__name__} has no field {key!r}")
        else:
            check_value(item, model.openapi_types[attributes[key]], f"{where}.{key}", problems)


def check_required(document, model_name, where, problems):
    """The models' own checks (required fields, allowed values) by building the object."""
    try:
        kubernetes.client.ApiClient()._ApiClient__deserialize(document, model_name)
    except (ValueError, TypeError) as e:
        problems.append(f"{where}: {e}")


def check_schema(documents, problems):
    """`documents`: (where, parsed manifest) pairs."""
    for where, document in documents:
        key = (document.get("apiVersion"), document.get("kind"))
        if key not in MODELS:
            problems.append(f"{where}: unknown apiVersion/kind {key} (expected one of "
                            f"{sorted(MODELS)})")
            continue
        before = len(problems)
        check_object(document, getattr(kubernetes.client, MODELS[key]), where, problems)
        if len(problems) == before:
            check_required(document, MODELS[key], where, problems)


def by_kind(documents, kind):
    return [(where, d) for where, d in documents if d.get("kind") == kind]


def one(documents, kind, problems):
    found = by_kind(documents, kind)
    if len(found) != 1:
        problems.append(f"expected one {kind}, found {len(found)}")
        return None, None
    return found[0]


def check_shard_names(deployment, statefulset, service, where, problems):
    """Shard i of the deployment is pod i of the StatefulSet, named through the Service."""
    shards = deployment.get("shards", [])
    replicas = statefulset["spec"].get("replicas", 1)
    if len(shards) != replicas:
        problems.append(f"{where}: {len(shards)} shards but the StatefulSet has {replicas} "
                        "replicas")
    ports = {p["name"]: p["port"] for p in service["spec"].get("ports", [])}
    for i, shard in enumerate(shards):
        host = f"{statefulset['metadata']['name']}-{i}.{service['metadata']['name']}"
        for field, port in (("listen", ports.get("rpc")), ("http", ports.get("http"))):
            if shard.get(field) != f"{host}:{port}":
                problems.append(f"{where}: shards[{i}].{field} is {shard.get(field)!r}, "
                                f"expected {host}:{port}")


# Containerfile's targets, by the containers that run them.
SERVER_IMAGE, TRAINER_IMAGE = "psched-server", "psched-trainer"
SERVER_USER = 10001  # the server image's user, who writes the state volume


def image_name(image):
    """'registry.example/team/psched-server:1.2' -> 'psched-server'."""
    return image.rsplit("/", 1)[-1].split("@")[0].split(":")[0]


def check_images(statefulset, job, where, problems):
    """The shards and the trainers' wait run the server image, the trainers the trainer image;
    the shard pods give the server image's user the state volume."""
    shard_pod = statefulset["spec"]["template"]["spec"]
    trainer_pod = job["spec"]["template"]["spec"]
    expected = [(c, SERVER_IMAGE) for c in shard_pod.get("containers", [])]
    expected += [(c, SERVER_IMAGE) for c in trainer_pod.get("initContainers", [])]
    expected += [(c, TRAINER_IMAGE) for c in trainer_pod.get("containers", [])]
    for container, image in expected:
        if image_name(container.get("image", "")) != image:
            problems.append(f"{where}: container {container.get('name')!r} runs image "
                            f"{container.get('image')!r}, expected {image} (Containerfile)")
    if shard_pod.get("securityContext", {}).get("fsGroup") != SERVER_USER:
        problems.append(f"{where}: the shard pods need securityContext.fsGroup {SERVER_USER}, "
                        "the server image's user, to write their state volume")


def check_agreement(documents, problems):
    """What the files must agree on, which no schema sees."""
    service_at, service = one(documents, "Service", problems)
    statefulset_at, statefulset = one(documents, "StatefulSet", problems)
    configmap_at, configmap = one(documents, "ConfigMap", problems)
    job_at, job = one(documents, "Job", problems)
    if None in (service, statefulset, configmap, job):
        return
    if statefulset["spec"]["serviceName"] != service["metadata"]["name"]:
        problems.append(f"{statefulset_at}: serviceName is not the Service's name "
                        f"{service['metadata']['name']!r}")
    pod_labels = statefulset["spec"]["template"]["metadata"].get("labels", {})
    if any(pod_labels.get(k) != v for k, v in service["spec"].get("selector", {}).items()):
        problems.append(f"{service_at}: the selector does not select the shard pods")
    if service["spec"].get("clusterIP") != "None":
        problems.append(f"{service_at}: expected a headless Service (clusterIP: None)")
    where = f"{configmap_at}: deployment.yaml"
    deployment = yaml.safe_load(configmap.get("data", {}).get("deployment.yaml", "null"))
    if not isinstance(deployment, dict):
        problems.append(f"{where}: expected the deployment file (a map) under data")
        return
    check_shard_names(deployment, statefulset, service, where, problems)
    check_images(statefulset, job, f"{statefulset_at} and {job_at}", problems)
    if deployment.get("workers") != job["spec"].get("completions"):
        problems.append(f"{where}: workers is {deployment.get('workers')} but the Job has "
                        f"{job['spec'].get('completions')} completions")


def env_number(container, name, where, problems):
    """The container's environment variable `name` as a number, or None (a problem)."""
    value = next((e.get("value") for e in container.get("env", []) if e.get("name") == name),
                 None)
    if value is None or not str(value).isdigit() or int(value) < 1:
        problems.append(f"{where}: env {name} is {value!r}, expected a number of shards")
        return None
    return int(value)


def check_reshard_volumes(pod, container, statefulset, shards, where, problems):
    """/state/<i> is the claim of shard i's pod (<template>-<statefulset>-<i>) for i < shards;
    the deployment file and its token are mounted where the shards mount them."""
    claims = {v["name"]: v["persistentVolumeClaim"].get("claimName")
              for v in pod.get("volumes", []) if "persistentVolumeClaim" in v}
    mounts = {m["mountPath"]: m["name"] for m in container.get("volumeMounts", [])}
    template = statefulset["spec"]["volumeClaimTemplates"][0]["metadata"]["name"]
    for i in range(shards):
        claim = f"{template}-{statefulset['metadata']['name']}-{i}"
        if claims.get(mounts.get(f"/state/{i}")) != claim:
            problems.append(f"{where}: /state/{i} mounts claim "
                            f"{claims.get(mounts.get(f'/state/{i}'))!r}, expected {claim} "
                            f"(shard {i}'s volume)")
    shard_mounts = {m["mountPath"]: m["name"] for m in
                    statefulset["spec"]["template"]["spec"]["containers"][0]["volumeMounts"]}
    for path in ("/etc/psched/deployment.yaml", "/etc/psched/auth"):
        if path not in mounts:
            problems.append(f"{where}: {path} is not mounted (the shards mount "
                            f"{shard_mounts.get(path)!r} there)")


def check_grow(documents, grow, problems):
    """grow/ (`grow`) against the deployment it grows (`documents`): the reshard Job's
    OLD_SHARDS is the ConfigMap's shard count, it mounts every shard volume, old and new, and a
    claim of the StatefulSet's template spec is made for every new shard; it runs psched with a
    shell (the trainer image) as the server image's user."""
    configmap_at, configmap = one(documents, "ConfigMap", problems)
    _, statefulset = one(documents, "StatefulSet", problems)
    job_at, job = one(grow, "Job", problems)
    if None in (configmap, statefulset, job):
        return
    pod = job["spec"]["template"]["spec"]
    container = pod["containers"][0]
    old = env_number(container, "OLD_SHARDS", job_at, problems)
    new = env_number(container, "NEW_SHARDS", job_at, problems)
    if old is None or new is None:
        return
    shards = len(yaml.safe_load(configmap["data"]["deployment.yaml"]).get("shards", []))
    if old != shards:
        problems.append(f"{job_at}: OLD_SHARDS is {old} but {configmap_at}'s deployment.yaml has "
                        f"{shards} shards (the job it grows)")
    check_reshard_volumes(pod, container, statefulset, max(old, new), job_at, problems)
    template = statefulset["spec"]["volumeClaimTemplates"][0]
    made = {d["metadata"]["name"]: (where, d) for where, d in by_kind(grow,
                                                                      "PersistentVolumeClaim")}
    for i in range(old, new):
        name = f"{template['metadata']['name']}-{statefulset['metadata']['name']}-{i}"
        if name not in made:
            problems.append(f"grow: no PersistentVolumeClaim {name} for new shard {i}")
        elif made[name][1]["spec"] != template["spec"]:
            problems.append(f"{made[name][0]}: spec differs from the StatefulSet's "
                            "volumeClaimTemplates (the pod would not adopt it as it would its own)")
    if image_name(container.get("image", "")) != TRAINER_IMAGE:
        problems.append(f"{job_at}: container {container.get('name')!r} runs image "
                        f"{container.get('image')!r}, expected {TRAINER_IMAGE} (psched and a "
                        "shell, Containerfile)")
    if pod.get("securityContext", {}).get("fsGroup") != SERVER_USER:
        problems.append(f"{job_at}: needs securityContext.fsGroup {SERVER_USER}, the shards' "
                        "user, to move and write their files")


def load(folder, prefix=""):
    """(where, document) for every document of every manifest in `folder`; `where` begins with
    `prefix` ("grow/"), then the file's name."""
    documents = []
    for path in sorted(pathlib.Path(folder).glob("*.yaml")):
        for i, document in enumerate(yaml.safe_load_all(path.read_text())):
            if document is not None:
                documents.append((f"{prefix}{path.name}[{i}] {document.get('kind')}", document))
    return documents


def check(documents, grow=None):
    """The problems found, as lines; `grow`: the documents of grow/, checked against them."""
    problems = []
    check_schema(documents + (grow or []), problems)
    if not problems:
        check_agreement(documents, problems)
    if not problems and grow is not None:
        check_grow(documents, grow, problems)
    return problems


def main():
    folder = sys.argv[1] if len(sys.argv) > 1 else pathlib.Path(__file__).parent
    documents = load(folder)
    grow = load(pathlib.Path(folder) / "grow", "grow/")
    problems = check(documents, grow)
    for problem in problems:
        print(problem)
    if problems:
        return 1
    print(f"{len(documents) + len(grow)} manifests in {folder} and its grow/: every field fits "
          f"the Kubernetes API (python3-kubernetes {kubernetes.__version__}) and the files agree")
    return 0


if __name__ == "__main__":
    sys.exit(main())
