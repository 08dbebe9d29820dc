"""The Kubernetes manifests we ship are ones the API server and the KubeRay operator accept.

RayCluster and RayJob are checked against the vendored KubeRay CRDs (deployments/kuberay/crds/):
JSON-schema types, enums, required fields and int32 ranges with ``jsonschema``, plus what a CRD
schema does not say with ``additionalProperties: false``: a field the schema does not know is
pruned by the API server (silently dropped), so a typo would be a setting that never applies.
We reject those ourselves, walking the schema. The Prefect work-pool template and prefect.yaml are
checked with Prefect's own models and templating, and every pipeline configuration in them is
loaded with ``training.config.overrides.load_config``.
"""

from __future__ import annotations

import ast
import copy
import functools
import json
import re
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from training.config.overrides import load_config

REPO_ROOT = Path(__file__).resolve().parents[2]
KUBERAY = REPO_ROOT / "deployments" / "kuberay"
KUBERNETES = REPO_ROOT / "deployments" / "kubernetes"
CRDS = KUBERAY / "crds"
# Where the Dockerfile puts the repository in the image.
IMAGE_ROOT = "/app/"

# ObjectMeta fields a manifest may set (the CRDs say only `type: object`; the API server owns it).
OBJECT_META_FIELDS = {"name", "generateName", "namespace", "labels", "annotations", "finalizers"}
INT_RANGES = {"int32": (-(2**31), 2**31 - 1), "int64": (-(2**63), 2**63 - 1)}
CREDENTIAL_NAME = re.compile(r"SECRET|PASSWORD|TOKEN|ACCESS_KEY|CREDENTIAL", re.IGNORECASE)

_Loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # the CRDs are 43k lines


def load_yaml(path: Path) -> Any:
    return yaml.load(path.read_text(), Loader=_Loader)


@functools.cache
def crd(file_name: str) -> dict[str, Any]:
    return load_yaml(CRDS / file_name)


def crd_schema(file_name: str) -> dict[str, Any]:
    """The v1 OpenAPI schema of a CRD (the served storage version)."""
    (v1,) = [v for v in crd(file_name)["spec"]["versions"] if v["name"] == "v1"]
    return v1["schema"]["openAPIV3Schema"]


# --- the validator ----------------------------------------------------------------------------


def unknown_fields(instance: Any, schema: dict[str, Any], path: str) -> list[str]:
    """Paths of fields the schema does not declare (the API server would prune them), and of
    fields whose CEL rules (x-kubernetes-validations) this validator cannot evaluate."""
    problems = []
    if "x-kubernetes-validations" in schema:
        problems.append(f"{path}: carries CEL rules this test cannot evaluate; avoid the field")
    if schema.get("x-kubernetes-preserve-unknown-fields"):
        return problems
    if isinstance(instance, dict) and schema.get("type") == "object":
        known = schema.get("properties", {})
        extra = schema.get("additionalProperties")
        for key, value in instance.items():
            child = f"{path}.{key}"
            if key in known:
                problems += unknown_fields(value, known[key], child)
            elif isinstance(extra, dict):
                problems += unknown_fields(value, extra, child)
            elif extra is not True:
                problems.append(f"{child}: unknown field (not in the CRD schema)")
    elif isinstance(instance, list) and isinstance(schema.get("items"), dict):
        for index, item in enumerate(instance):
            problems += unknown_fields(item, schema["items"], f"{path}[{index}]")
    return problems


def _format_checker() -> jsonschema.FormatChecker:
    checker = jsonschema.FormatChecker()
    for name, (low, high) in INT_RANGES.items():
        # Non-integers are the `type` keyword's business.
        checker.checks(name)(
            lambda value, low=low, high=high: not isinstance(value, int) or low <= value <= high
        )
    return checker


def schema_errors(instance: Any, schema: dict[str, Any], path: str = "") -> list[str]:
    """Every problem: unknown fields, then types, enums, patterns, required and int ranges."""
    problems = unknown_fields(instance, schema, path)
    validator = jsonschema.Draft7Validator(schema, format_checker=_format_checker())
    for error in validator.iter_errors(instance):
        where = path + "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in error.path)
        problems.append(f"{where or '.'}: {error.message}")
    return problems


def manifest_errors(manifest: dict[str, Any], crd_file: str) -> list[str]:
    """A whole custom resource: apiVersion/kind of the CRD, ObjectMeta, and the schema."""
    definition = crd(crd_file)["spec"]
    problems = []
    if manifest.get("apiVersion") != f"{definition['group']}/v1":
        problems.append(f".apiVersion: {manifest.get('apiVersion')!r} is not ray.io/v1")
    if manifest.get("kind") != definition["names"]["kind"]:
        problems.append(f".kind: {manifest.get('kind')!r} is not {definition['names']['kind']}")
    metadata = manifest.get("metadata") or {}
    if not isinstance(metadata.get("name"), str):
        problems.append(".metadata.name: required")
    problems += [f".metadata.{key}: unknown field" for key in set(metadata) - OBJECT_META_FIELDS]
    body = {key: value for key, value in manifest.items() if key != "metadata"}
    return problems + schema_errors(body, crd_schema(crd_file))


# --- fixtures ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def raycluster() -> dict[str, Any]:
    return load_yaml(KUBERAY / "raycluster.yaml")


@pytest.fixture(scope="module")
def rayjob() -> dict[str, Any]:
    return load_yaml(KUBERAY / "rayjob.yaml")


@pytest.fixture(scope="module")
def job_template() -> dict[str, Any]:
    return json.loads((KUBERNETES / "base-job-template.json").read_text())


@pytest.fixture(scope="module")
def prefect_yaml() -> dict[str, Any]:
    return load_yaml(KUBERNETES / "prefect.yaml")


def ray_pod_specs(cluster_spec: dict[str, Any]) -> dict[str, dict[str, Any]]:
    pods = {"head": cluster_spec["headGroupSpec"]["template"]["spec"]}
    for group in cluster_spec["workerGroupSpecs"]:
        pods[group["groupName"]] = group["template"]["spec"]
    return pods


# --- the manifests validate -------------------------------------------------------------------


def test_raycluster_matches_the_crd(raycluster):
    assert manifest_errors(raycluster, "ray.io_rayclusters.yaml") == []


def test_rayjob_matches_the_crd(rayjob):
    assert manifest_errors(rayjob, "ray.io_rayjobs.yaml") == []


def _rename(tree: dict, key: str, new: str) -> None:
    tree[new] = tree.pop(key)


# Each mistake must be reported at its own path: proof that the validator bites.
MISTAKES = {
    "typo in a RayJob field": (
        "rayjob",
        lambda m: _rename(m["spec"], "shutdownAfterJobFinishes", "shutdownAfterJobFinish"),
        ".spec.shutdownAfterJobFinish: unknown field",
    ),
    "string replicas": (
        "raycluster",
        lambda m: m["spec"]["workerGroupSpecs"][0].__setitem__("replicas", "two"),
        ".spec.workerGroupSpecs[0].replicas: 'two' is not of type 'integer'",
    ),
    "typo deep in a pod template": (
        "raycluster",
        lambda m: _rename(
            m["spec"]["workerGroupSpecs"][1]["template"]["spec"]["containers"][0]["resources"],
            "limits",
            "limts",
        ),
        ".spec.workerGroupSpecs[1].template.spec.containers[0].resources.limts: unknown",
    ),
    "typo in the embedded cluster of a RayJob": (
        "rayjob",
        lambda m: _rename(m["spec"]["rayClusterSpec"], "enableInTreeAutoscaling", "autoscaling"),
        ".spec.rayClusterSpec.autoscaling: unknown field",
    ),
    "missing required field": (
        "raycluster",
        lambda m: m["spec"]["workerGroupSpecs"][0].pop("maxReplicas"),
        ".spec.workerGroupSpecs[0]: 'maxReplicas' is a required property",
    ),
    "value outside an enum": (
        "raycluster",
        lambda m: m["spec"]["autoscalerOptions"].__setitem__("upscalingMode", "Fast"),
        ".spec.autoscalerOptions.upscalingMode: 'Fast' is not one of",
    ),
    "int32 overflow": (
        "rayjob",
        lambda m: m["spec"].__setitem__("activeDeadlineSeconds", 2**31),
        ".spec.activeDeadlineSeconds: 2147483648 is not a 'int32'",
    ),
    "malformed quantity": (
        "raycluster",
        lambda m: m["spec"]["headGroupSpec"]["template"]["spec"]["containers"][0]["resources"][
            "limits"
        ].__setitem__("memory", "8 GB"),
        ".spec.headGroupSpec.template.spec.containers[0].resources.limits.memory: '8 GB'",
    ),
    "typo in metadata": (
        "rayjob",
        lambda m: _rename(m["metadata"], "labels", "lables"),
        ".metadata.lables: unknown field",
    ),
    "wrong kind": ("rayjob", lambda m: m.__setitem__("kind", "RayJobs"), ".kind: 'RayJobs'"),
    "field with unevaluated CEL rules": (
        "rayjob",
        lambda m: m["spec"].__setitem__("managedBy", "someone"),
        ".spec.managedBy: carries CEL rules",
    ),
}


@pytest.mark.parametrize("mistake", MISTAKES, ids=list(MISTAKES))
def test_a_mistake_fails_validation(mistake, raycluster, rayjob):
    which, mutate, expected = MISTAKES[mistake]
    manifest = copy.deepcopy(raycluster if which == "raycluster" else rayjob)
    mutate(manifest)
    errors = manifest_errors(manifest, f"ray.io_{which}s.yaml")
    assert any(error.startswith(expected) for error in errors), errors


# --- the manifests say what we mean -----------------------------------------------------------


def test_rayjob_runs_on_the_raycluster_we_validate(raycluster, rayjob):
    # One cluster definition: the RayJob's own cluster is exactly the standalone RayCluster.
    assert rayjob["spec"]["rayClusterSpec"] == raycluster["spec"]


def test_cluster_shape(raycluster):
    spec = raycluster["spec"]
    assert spec["enableInTreeAutoscaling"] is True
    groups = {group["groupName"]: group for group in spec["workerGroupSpecs"]}
    assert set(groups) == {"cpu", "gpu"}
    for group in groups.values():
        assert 0 <= group["minReplicas"] <= group["replicas"] <= group["maxReplicas"]
    assert groups["gpu"]["minReplicas"] == 0  # GPUs scale from zero
    # Training never lands on the head; the dashboard/job API listens on the pod's interface.
    assert spec["headGroupSpec"]["rayStartParams"]["num-cpus"] == "0"
    gpu_pod = groups["gpu"]["template"]["spec"]
    (gpu_container,) = gpu_pod["containers"]
    assert gpu_container["resources"]["limits"]["nvidia.com/gpu"] >= 1
    assert gpu_container["image"].endswith("-gpu")
    assert any(t["key"] == "nvidia.com/gpu" for t in gpu_pod["tolerations"])
    for name, pod in ray_pod_specs(spec).items():
        for container in pod["containers"]:
            resources = container["resources"]
            assert {"cpu", "memory"} <= set(resources["requests"]) <= set(resources["limits"]), name
            # Probes stay KubeRay's: it knows Ray's health endpoints.
            assert not {"livenessProbe", "readinessProbe"} & set(container), name
            if name != "gpu":
                assert container["image"].endswith("-cpu"), name


def test_one_ray_version_everywhere(raycluster):
    """Ray refuses to mix versions across nodes: manifests, image and constraints agree."""
    pinned = re.search(r"^ray==(\S+)$", (REPO_ROOT / "constraints.txt").read_text(), re.M)[1]
    assert raycluster["spec"]["rayVersion"] == pinned
    dockerfile = (KUBERAY / "Dockerfile").read_text()
    base = re.search(r"^ARG RAY_IMAGE=rayproject/ray:(\S+)$", dockerfile, re.M)[1]
    assert base == f"{pinned}-py311"
    assert f"RAY_IMAGE=rayproject/ray:{pinned}-py311-gpu" in dockerfile  # the documented variant
    assert re.search(r"^RUN pip install -c constraints\.txt \.", dockerfile, re.M)


def _env_entries(tree: Any):
    """Every container env entry anywhere in a manifest."""
    if isinstance(tree, dict):
        for key, value in tree.items():
            if key == "env" and isinstance(value, list):
                yield from value
            else:
                yield from _env_entries(value)
    elif isinstance(tree, list):
        for item in tree:
            yield from _env_entries(item)


def test_credentials_come_only_from_secrets(raycluster, rayjob, job_template):
    manifests = [raycluster, rayjob, job_template["job_configuration"]["job_manifest"]]
    entries = [entry for manifest in manifests for entry in _env_entries(manifest)]
    credentials = [entry for entry in entries if CREDENTIAL_NAME.search(entry["name"])]
    assert {entry["name"] for entry in credentials} >= {
        "AWS_ACCESS_KEY_ID",
        "AWS_SECRET_ACCESS_KEY",
    }
    for entry in credentials:
        assert "value" not in entry and "secretKeyRef" in entry["valueFrom"], entry
    config_map = load_yaml(KUBERAY / "trainflow-env.yaml")
    assert config_map["kind"] == "ConfigMap"
    assert not [key for key in config_map["data"] if CREDENTIAL_NAME.search(key)]
    # Every Ray container (driver and training workers alike) gets the keys and the endpoints.
    for pod in ray_pod_specs(raycluster["spec"]).values():
        for container in pod["containers"]:
            names = {entry["name"] for entry in container["env"]}
            assert {
                "RAY_USAGE_STATS_ENABLED",
                "AWS_ACCESS_KEY_ID",
                "AWS_SECRET_ACCESS_KEY",
            } <= names
            refs = [source["configMapRef"]["name"] for source in container["envFrom"]]
            assert refs == [config_map["metadata"]["name"]]


def test_rayjob_lifecycle(rayjob):
    spec = rayjob["spec"]
    assert spec["shutdownAfterJobFinishes"] is True
    assert spec["ttlSecondsAfterFinished"] > 0
    assert 0 < spec["preRunningDeadlineSeconds"] < spec["activeDeadlineSeconds"]
    assert spec["submissionMode"] == "K8sJobMode"
    assert spec["backoffLimit"] >= 0


def _entrypoint_config(entrypoint: str, extra: list[str] | None = None):
    """Parse the entrypoint with the real `trainflow run` options and load its configuration."""
    import shlex

    import typer

    from trainflow.cli import app

    argv = shlex.split(entrypoint)
    assert argv[:2] == ["trainflow", "run"], argv
    command = typer.main.get_command(app).commands["run"]
    params = command.make_context("run", argv[2:]).params
    config_file = str(params["config_file"])
    assert config_file.startswith(IMAGE_ROOT), "name configs by their path in the image"
    local = REPO_ROOT / config_file.removeprefix(IMAGE_ROOT)
    overrides = list(params["overrides"] or []) + (extra or [])
    overrides.append(f"ray.address={params['ray_address']}")
    return load_config(local, overrides), params


def test_rayjob_entrypoint_loads_with_load_config(rayjob):
    config, params = _entrypoint_config(rayjob["spec"]["entrypoint"])
    assert params["ray_address"] == "auto"  # join the RayJob's cluster, never start a local one
    assert params["run_id"]  # a retried attempt resumes the same run
    assert config.storage.root.startswith("s3://")  # every node reaches the same storage
    # The GPU variant documented in the manifest and the README loads too.
    gpu, _ = _entrypoint_config(
        rayjob["spec"]["entrypoint"], ["train.use_gpu=true", "train.backend=nccl"]
    )
    assert gpu.train.use_gpu and gpu.train.backend == "nccl"
    # The image holds what the entrypoint names: the repository under /app.
    dockerfile = (KUBERAY / "Dockerfile").read_text()
    assert re.search(r"^WORKDIR /app$", dockerfile, re.M)
    assert re.search(r"^COPY .*\bconfigs \./configs$", dockerfile, re.M)


# --- Prefect on Kubernetes --------------------------------------------------------------------


def _only_known(tree: dict[str, Any], model, where: str) -> None:
    known = set(model.model_fields) | {
        f.alias for f in model.model_fields.values() if f.alias is not None
    }
    assert set(tree) <= known, f"{where}: unknown keys {sorted(set(tree) - known)}"


def test_prefect_yaml_is_a_prefect_project(prefect_yaml):
    # Prefect's own model of prefect.yaml (it ignores unknown keys, so we check those ourselves).
    from prefect.cli.deploy._models import DeploymentConfig, PrefectYamlModel, WorkPoolConfig

    PrefectYamlModel.model_validate(prefect_yaml)
    _only_known(prefect_yaml, PrefectYamlModel, "prefect.yaml")
    (deployment,) = prefect_yaml["deployments"]
    _only_known(deployment, DeploymentConfig, "deployments[0]")
    _only_known(deployment["work_pool"], WorkPoolConfig, "deployments[0].work_pool")
    pool = deployment["work_pool"]["name"]
    text = (KUBERNETES / "prefect.yaml").read_text()
    assert f"prefect work-pool create {pool} --type kubernetes" in text


def test_prefect_entrypoint_is_our_flow(prefect_yaml):
    (deployment,) = prefect_yaml["deployments"]
    assert deployment["entrypoint"] == "flows/pipeline.py:pipeline"
    path, function = deployment["entrypoint"].split(":")
    tree = ast.parse((REPO_ROOT / path).read_text())
    (flow_def,) = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == function]
    decorators = [d.func.id for d in flow_def.decorator_list if isinstance(d, ast.Call)]
    assert "flow" in decorators
    arguments = {a.arg for a in flow_def.args.args}
    assert set(deployment["parameters"]) <= arguments
    # The pull step enters the image's copy of the repository, where the entrypoint lives.
    (step,) = prefect_yaml["pull"]
    assert step["prefect.deployments.steps.set_working_directory"]["directory"] == IMAGE_ROOT[:-1]


def test_prefect_parameters_load_with_load_config(prefect_yaml, raycluster, tmp_path):
    (deployment,) = prefect_yaml["deployments"]
    config_file = tmp_path / "parameters.yaml"
    config_file.write_text(yaml.safe_dump(deployment["parameters"]["config"]))
    config = load_config(config_file)
    assert config.storage.root.startswith("s3://")
    # The flow drives the RayCluster through Ray Client, at its head Service.
    meta = raycluster["metadata"]
    service = f"{meta['name']}-head-svc.{meta['namespace']}.svc.cluster.local"
    assert config.ray.address == f"ray://{service}:10001"
    assert deployment["work_pool"]["job_variables"]["namespace"] == meta["namespace"]


def test_job_variables_fit_the_work_pool_and_render(prefect_yaml, job_template, raycluster):
    from prefect.utilities.schema_tools import validate
    from prefect.utilities.templating import apply_values

    (deployment,) = prefect_yaml["deployments"]
    job_variables = deployment["work_pool"]["job_variables"]
    schema = job_template["variables"]
    # What the Prefect server checks when the deployment is created...
    validate(job_variables, schema, raise_on_error=True)
    # ...and what it lets through silently: a misspelt variable would just be ignored.
    assert set(job_variables) <= set(schema["properties"])
    # Render the job configuration the way a worker does: schema defaults, then job variables.
    values = {k: v["default"] for k, v in schema["properties"].items() if "default" in v}
    values |= job_variables
    rendered = apply_values(job_template["job_configuration"], values)
    manifest = rendered["job_manifest"]
    pod = manifest["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert container["image"] == job_variables["image"]
    assert manifest["metadata"]["namespace"] == raycluster["metadata"]["namespace"]
    assert pod["serviceAccountName"] == job_variables["service_account_name"]
    assert rendered["env"] == job_variables["env"]
    # prefect-kubernetes refuses a job manifest without these (its _get_base_job_manifest).
    assert (manifest["apiVersion"], manifest["kind"]) == ("batch/v1", "Job")
    assert (pod["parallelism"], pod["completions"], pod["restartPolicy"]) == (1, 1, "Never")
    assert container["name"] == "prefect-job"
    # The pod itself is a valid Kubernetes pod spec: the CRD embeds the PodSpec schema. The two
    # keys above are Prefect's quirk (the API server ignores them in a pod spec).
    pod_schema = crd_schema("ray.io_rayclusters.yaml")["properties"]["spec"]["properties"][
        "headGroupSpec"
    ]["properties"]["template"]["properties"]["spec"]
    plain_pod = {k: v for k, v in pod.items() if k not in ("parallelism", "completions")}
    assert schema_errors(plain_pod, pod_schema, ".spec.template.spec") == []
    # The flow-run pod reaches the token-protected RayCluster with the cluster's own Secret.
    token = next(e for e in container["env"] if e["name"] == "RAY_AUTH_TOKEN")
    secret = raycluster["spec"]["authOptions"]["secretName"]
    assert token["valueFrom"]["secretKeyRef"] == {"name": secret, "key": "auth_token"}
