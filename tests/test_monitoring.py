"""The monitoring add-ons: the Grafana dashboard asks only for metrics the service exports, and the
compose profile's Prometheus and Grafana find their files and the service's port."""

from __future__ import annotations

import json
import re

import yaml
from prometheus_client.parser import text_string_to_metric_families

from tests.conftest import ROOT

DOCKER = ROOT / "docker"
DASHBOARD = DOCKER / "grafana" / "dashboards" / "edgetpu-serve.json"
SUFFIXES = {"counter": ("_total",), "histogram": ("_bucket", "_count", "_sum"), "summary": ("_count", "_sum")}


def exported_names(text: str) -> set[str]:
    names = set()
    for family in text_string_to_metric_families(text):
        names.add(family.name)
        names.update(family.name + suffix for suffix in SUFFIXES.get(family.type, ()))
    return names


def dashboard_exprs() -> list[str]:
    doc = json.loads(DASHBOARD.read_text())
    exprs = [t["expr"] for p in doc["panels"] for t in p["targets"]]
    exprs += [v["query"]["query"] for v in doc["templating"]["list"]]
    return exprs


def test_every_metric_the_dashboard_reads_is_exported(client):
    exported = exported_names(client.get("/metrics").text)
    wanted = {name for expr in dashboard_exprs() for name in re.findall(r"\b(?:edgetpu_serve|process)_[a-z_]+", expr)}
    assert len(wanted) >= 12
    assert wanted <= exported, sorted(wanted - exported)


def test_compose_monitoring_profile():
    compose = yaml.safe_load((DOCKER / "compose.yaml").read_text())
    services = compose["services"]
    assert services["prometheus"]["profiles"] == services["grafana"]["profiles"] == ["monitoring"]
    for name in ("prometheus", "grafana"):
        for volume in services[name]["volumes"]:
            source = volume.split(":")[0]
            assert (DOCKER / source).exists(), f"{name}: {source} is missing"
        assert all(port.startswith("127.0.0.1:") for port in services[name]["ports"])  # not on every interface
    scrape = yaml.safe_load((DOCKER / "prometheus" / "prometheus.yml").read_text())["scrape_configs"][0]
    assert scrape["metrics_path"] == "/metrics"
    published = services["usb"]["ports"][0].rsplit(":", 1)[1]
    targets = scrape["static_configs"][0]["targets"]
    assert targets == [f"{name}:{published}" for name in ("usb", "devboard")]
    datasource = yaml.safe_load((DOCKER / "grafana" / "provisioning" / "datasources" / "prometheus.yaml").read_text())
    uid = datasource["datasources"][0]["uid"]
    doc = json.loads(DASHBOARD.read_text())
    assert {p["datasource"]["uid"] for p in doc["panels"]} == {uid}
