"""deploy/k8s: the KubeRay manifests validated against KubeRay's RayJob CRD schema (vendored under
tests/data/kuberay), strictly: an unknown field is an error, as with `kubectl apply --validate=strict`.
The entrypoint's `rl` command line is checked by `rl grpo --print-config`."""

from __future__ import annotations

import copy
import json
import shlex
from pathlib import Path

import jsonschema
import pytest
import yaml

from rl_apps.cli import main

ROOT = Path(__file__).resolve().parents[2]
K8S = ROOT / "deploy" / "k8s"
SCHEMA = Path(__file__).resolve().parents[1] / "data" / "kuberay" / "rayjob_v1_openapi.json"


def strict(schema):
    """A copy of a Kubernetes structural schema in which objects with declared properties accept no
    others (the API server would drop unknown fields silently; strict validation rejects them)."""
    schema = copy.deepcopy(schema)

    def visit(node):
        if isinstance(node, dict):
            if ("properties" in node and "additionalProperties" not in node
                    and not node.get("x-kubernetes-preserve-unknown-fields")):
                node["additionalProperties"] = False
            for value in node.values():
                visit(value)
        elif isinstance(node, list):
            for value in node:
                visit(value)

    visit(schema)
    return schema


@pytest.fixture(scope="module")
def rayjob_schema():
    return strict(json.loads(SCHEMA.read_text()))


def manifest(name: str) -> dict:
    return yaml.safe_load((K8S / name).read_text())


def errors(schema: dict, document: dict) -> list[str]:
    validator = jsonschema.Draft7Validator(schema)
    return [f"{'.'.join(map(str, e.absolute_path))}: {e.message}" for e in validator.iter_errors(document)]


def cluster_errors(schema: dict, document: dict) -> list[str]:
    """A RayCluster: its spec against the RayJob's rayClusterSpec (the same schema in KubeRay)."""
    assert document["apiVersion"] == "ray.io/v1" and document["kind"] == "RayCluster"
    return errors(schema["properties"]["spec"]["properties"]["rayClusterSpec"], document["spec"])


def test_rayjob_matches_the_crd_schema(rayjob_schema):
    document = manifest("rayjob-grpo.yaml")
    assert document["apiVersion"] == "ray.io/v1" and document["kind"] == "RayJob"
    assert errors(rayjob_schema, document) == []


def test_raycluster_matches_the_crd_schema_and_the_rayjob_cluster(rayjob_schema):
    document = manifest("raycluster.yaml")
    assert cluster_errors(rayjob_schema, document) == []
    assert document["spec"] == manifest("rayjob-grpo.yaml")["spec"]["rayClusterSpec"]


def test_the_validation_catches_unknown_fields_and_wrong_types(rayjob_schema):
    typo = manifest("rayjob-grpo.yaml")
    typo["spec"]["rayClusterSpec"]["workerGroupSpecs"][0]["replica"] = 2
    assert any("'replica' was unexpected" in e for e in errors(rayjob_schema, typo))
    wrong_type = manifest("raycluster.yaml")
    wrong_type["spec"]["workerGroupSpecs"][0]["replicas"] = "two"
    assert any("workerGroupSpecs.0.replicas" in e for e in cluster_errors(rayjob_schema, wrong_type))


def pods(cluster_spec: dict) -> list[dict]:
    groups = [cluster_spec["headGroupSpec"], *cluster_spec["workerGroupSpecs"]]
    return [group["template"]["spec"] for group in groups]


def test_every_pod_runs_the_image_and_mounts_the_shared_checkpoint_volume():
    claim = manifest("checkpoints-pvc.yaml")
    assert claim["kind"] == "PersistentVolumeClaim" and claim["spec"]["accessModes"] == ["ReadWriteMany"]
    spec = manifest("rayjob-grpo.yaml")["spec"]
    images = set()
    for pod in pods(spec["rayClusterSpec"]):
        volumes = {v["name"]: v for v in pod["volumes"]}
        assert volumes["checkpoints"]["persistentVolumeClaim"]["claimName"] == claim["metadata"]["name"]
        for container in pod["containers"]:
            images.add(container["image"])
            assert {"name": "checkpoints", "mountPath": "/checkpoints"} in container["volumeMounts"]
    assert len(images) == 1


def test_worker_groups_advertise_the_resources_the_entrypoint_pins_to(capsys):
    spec = manifest("rayjob-grpo.yaml")["spec"]
    argv = shlex.split(spec["entrypoint"])
    assert argv[:2] == ["rl", "grpo"]
    assert any(a.startswith("output_dir=/checkpoints/") for a in argv)
    # The entrypoint's config is valid: every key exists and every value is allowed.
    overrides = [a for a in argv[2:] if a != "--max-restarts" and not a.isdigit()]
    assert main(["grpo", *overrides, "--print-config"]) == 0
    resolved = yaml.safe_load(capsys.readouterr().out)
    advertised = {name for group in spec["rayClusterSpec"]["workerGroupSpecs"]
                  for name in json.loads(json.loads(group["rayStartParams"]["resources"]))}
    asked = {name for resources in resolved["cluster"]["group_resources"].values() for name in resources}
    assert asked == advertised == {"trainer", "rollout"}
