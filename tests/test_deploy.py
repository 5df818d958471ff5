"""The Kubernetes and KServe manifests, without a cluster: their structure, and that the image,
ports, probes and settings they name are the app's real ones (probes are asked of a running service)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from app.engines import BACKENDS
from app.faces.location import IMAGE_DATA_DIR
from app.settings import Settings, variable_names
from tests.conftest import ROOT

DEPLOY = ROOT / "deploy"
COMPOSE = ROOT / "docker" / "compose.yaml"
PROBES = ("livenessProbe", "readinessProbe", "startupProbe")


def documents(path: Path) -> list[dict]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def by_kind() -> dict[str, dict]:
    found = {}
    for path in sorted(DEPLOY.rglob("*.yaml")):
        for doc in documents(path):
            assert {"apiVersion", "kind", "metadata"} <= set(doc), f"{path}: not a Kubernetes object"
            assert doc["kind"] not in found, f"{path}: a second {doc['kind']}"
            found[doc["kind"]] = doc
    return found


MANIFESTS = by_kind()


def containers() -> list[dict]:
    return [MANIFESTS["ServingRuntime"]["spec"]["containers"][0],
            MANIFESTS["Deployment"]["spec"]["template"]["spec"]["containers"][0]]


def test_the_expected_objects():
    assert {k: v["apiVersion"] for k, v in MANIFESTS.items()} == {
        "ServingRuntime": "serving.kserve.io/v1alpha1", "InferenceService": "serving.kserve.io/v1beta1",
        "Deployment": "apps/v1", "Service": "v1"}


def test_the_image_is_the_one_compose_builds():
    image = yaml.safe_load(COMPOSE.read_text())["services"]["usb"]["image"]
    assert [c["image"] for c in containers()] == [image, image]


@pytest.mark.parametrize("container", containers(), ids=["kserve", "deployment"])
def test_env_is_real_settings_and_ports_and_probes_agree(container, monkeypatch):
    env = {e["name"]: e["value"] for e in container["env"]}
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    settings = Settings()  # bad values fail here, the plug-ins' own just below
    for plugin in BACKENDS.values():
        settings.plugin_settings(plugin)
    assert set(env) <= variable_names(BACKENDS.values())  # no name the service does not read
    assert settings.host == "0.0.0.0"
    ports = {p.get("name"): p["containerPort"] for p in container["ports"]}
    assert list(ports.values()) == [settings.port]
    for probe in PROBES:
        port = container[probe]["httpGet"]["port"]
        assert ports.get(port, port) == settings.port, probe


def probe_paths() -> set[str]:
    paths = {c[probe]["httpGet"]["path"] for c in containers() for probe in PROBES}
    paths.add(MANIFESTS["ServingRuntime"]["spec"]["annotations"]["prometheus.kserve.io/path"])
    paths.add(MANIFESTS["Deployment"]["spec"]["template"]["metadata"]["annotations"]["prometheus.io/path"])
    return paths


@pytest.mark.parametrize("path", sorted(probe_paths()))
def test_probe_and_metrics_paths_answer_on_the_running_service(client, path):
    assert client.get(path).status_code == 200


def test_readiness_is_the_v2_ready_route():
    assert {c["readinessProbe"]["httpGet"]["path"] for c in containers()} == {"/v2/health/ready"}


def test_inference_service_names_the_runtime_and_its_format():
    runtime, isvc = MANIFESTS["ServingRuntime"], MANIFESTS["InferenceService"]
    model = isvc["spec"]["predictor"]["model"]
    assert model["runtime"] == runtime["metadata"]["name"]
    assert model["modelFormat"]["name"] in [f["name"] for f in runtime["spec"]["supportedModelFormats"]]
    assert model["protocolVersion"] == "v2" and "v2" in runtime["spec"]["protocolVersions"]
    env = {e["name"]: e["value"] for e in runtime["spec"]["containers"][0]["env"]}
    assert env["EDGETPU_SERVE_MODEL_DIR"] == "/mnt/models"  # where KServe's storage initializer puts storageUri
    port = runtime["spec"]["containers"][0]["ports"][0]["containerPort"]
    assert runtime["spec"]["annotations"]["prometheus.kserve.io/port"] == str(port)


def test_the_deployment_keeps_the_face_gallery_on_a_claim_its_user_may_write():
    """Kubernetes ignores the image's VOLUME: the gallery's directory is a PersistentVolumeClaim, made writable for the
    image's user (uid and gid 10001) by the pod's fsGroup."""
    spec = MANIFESTS["Deployment"]["spec"]["template"]["spec"]
    mounts = {m["name"]: m["mountPath"] for m in spec["containers"][0]["volumeMounts"]}
    volumes = {v["name"]: v for v in spec["volumes"]}
    assert mounts["faces"] == str(IMAGE_DATA_DIR)
    assert volumes["faces"]["persistentVolumeClaim"]["claimName"] == "edgetpu-serve-faces"
    assert spec["securityContext"]["fsGroup"] == 10001


def test_deployment_and_service_select_the_pods_and_mount_the_devices():
    deployment, service = MANIFESTS["Deployment"], MANIFESTS["Service"]
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert deployment["spec"]["selector"]["matchLabels"].items() <= labels.items()
    assert service["spec"]["selector"].items() <= labels.items()
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    names = {p.get("name") for p in container["ports"]}
    assert {p["targetPort"] for p in service["spec"]["ports"]} <= names
    volumes = {v["name"]: v for v in deployment["spec"]["template"]["spec"]["volumes"]}
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    assert set(mounts) == set(volumes)
    assert volumes["tpu"]["hostPath"]["path"] == mounts["tpu"] == "/dev/bus/usb"  # the whole bus: it re-enumerates
    env = {e["name"]: e["value"] for e in container["env"]}
    assert mounts["models"] == env["EDGETPU_SERVE_MODEL_DIR"]
