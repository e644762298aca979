"""deploy/ checked as far as this machine can: every YAML parses; every setting the gateway
configs and the WARMGATE_* environment name exists in the settings model (and the configs
validate); images, ports, host names, instance ids and volumes agree between the gateway
configs, compose and the Kubernetes manifests; the vLLM engines run with the flags of
warmgate's own launcher; the Kubernetes resources (the base, its ConfigMap and the vLLM
overlay as kustomize would render them) validate against the Kubernetes JSON schemas that
`kubernetes-validate` ships; `docker-compose config` accepts the compose file where that
tool is installed (CI installs it). Nothing is deployed: no image is built and no pod runs."""

from __future__ import annotations

import copy
import json
import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import pytest
import yaml
from pydantic import BaseModel

from gateway.config.settings import Settings
from gateway.launch.tiered import connector_config
from gateway.launch.vllm_fleet import FleetConfig, VllmEngine

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
COMPOSE = DEPLOY / "compose"
BASE = DEPLOY / "k8s" / "base"
VLLM = DEPLOY / "k8s" / "overlays" / "vllm"
EPP = DEPLOY / "k8s" / "overlays" / "epp"
# the kinds of the Gateway API and its Inference Extension: CRDs, whose schemas
# kubernetes-validate does not ship; test_endpoint_picker_pieces_agree checks them
CRD_KINDS = {"InferencePool", "HTTPRoute"}
K8S_VERSION = "1.31"
GATEWAY_CONFIGS = [
    DEPLOY / "gateway.example.yaml",
    COMPOSE / "gateway.yaml",
    BASE / "gateway.yaml",
]


def load_all(path: Path) -> list[Any]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d is not None]


def load(path: Path) -> Any:
    (doc,) = load_all(path)
    return doc


# -- the settings model ----------------------------------------------------------------------


def unknown_keys(model: type[BaseModel], data: Any, prefix: str = "") -> list[str]:
    """Keys of `data` that are not fields of `model`, recursively (lists of models too)."""
    if not isinstance(data, dict):
        return []
    out = []
    for key, value in data.items():
        field = model.model_fields.get(key)
        if field is None:
            out.append(prefix + key)
            continue
        inner = _model_of(field.annotation)
        if inner is None:
            continue
        items = value if isinstance(value, list) else [value]
        for item in items:
            out += unknown_keys(inner, item, f"{prefix}{key}.")
    return out


def _model_of(annotation: Any) -> type[BaseModel] | None:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in getattr(annotation, "__args__", ()):
        found = _model_of(arg)
        if found is not None:
            return found
    return None


def setting_of_env(name: str) -> str | None:
    """`WARMGATE_A__B` -> `a.b` if that is a setting, else None."""
    if name == "WARMGATE_CONFIG":
        return "config_file"  # read by the settings sources themselves
    path = name.removeprefix("WARMGATE_").lower().split("__")
    model: type[BaseModel] | None = Settings
    for part in path:
        if model is None or part not in model.model_fields:
            return None
        model = _model_of(model.model_fields[part].annotation)
    return ".".join(path)


@pytest.mark.parametrize("path", GATEWAY_CONFIGS, ids=lambda p: str(p.relative_to(DEPLOY)))
def test_gateway_configs_name_only_real_settings(
    path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in list(os.environ):
        if name.startswith("WARMGATE_"):
            monkeypatch.delenv(name)
    data = load(path)
    assert unknown_keys(Settings, data) == []
    settings = Settings(**data)
    assert settings.instances, "a deployment config names its engines"


def _compose_env_names() -> set[str]:
    names = set()
    for svc in load(COMPOSE / "compose.yaml")["services"].values():
        env = svc.get("environment") or {}
        names |= set(env) if isinstance(env, dict) else {e.split("=")[0] for e in env}
    return names


def _k8s_docs() -> list[dict[str, Any]]:
    docs = []
    for name in load(BASE / "kustomization.yaml")["resources"]:
        docs += load_all(BASE / name)
    return docs


def _containers(doc: dict[str, Any]) -> list[dict[str, Any]]:
    spec = doc.get("spec", {}).get("template", {}).get("spec", {})
    return list(spec.get("containers", []))


def test_every_warmgate_environment_variable_is_a_setting() -> None:
    names = {n for n in _compose_env_names() if n.startswith("WARMGATE_")}
    for doc in [*_k8s_docs(), load(VLLM / "engine-vllm.yaml"), *render(EPP)]:
        for c in _containers(doc):
            names |= {e["name"] for e in c.get("env", []) if e["name"].startswith("WARMGATE_")}
    names |= set(re.findall(r"(WARMGATE_[A-Z_]+)=", (DEPLOY / "Dockerfile").read_text()))
    assert len(names) >= 5
    assert {n: setting_of_env(n) for n in names if setting_of_env(n) is None} == {}


def test_every_yaml_under_deploy_parses() -> None:
    files = sorted(DEPLOY.rglob("*.yaml"))
    assert len(files) >= 14
    for f in files:
        assert load_all(f), f


# -- compose -------------------------------------------------------------------------------


def _flag(args: list[str], name: str) -> str:
    (value,) = [a.split("=", 1)[1] for a in args if a.startswith(name + "=")]
    return value


def test_compose_services_agree_with_the_gateway_config() -> None:
    compose = load(COMPOSE / "compose.yaml")
    services = compose["services"]
    config = load(COMPOSE / "gateway.yaml")
    gateways = [s for n, s in services.items() if n.startswith("gateway-")]
    assert len(gateways) == 2
    for g in gateways:
        assert g["image"] == "warmgate:latest"
        assert g["volumes"] == ["./gateway.yaml:/etc/warmgate/gateway.yaml:ro"]
        assert g["environment"]["WARMGATE_CONFIG"] == "/etc/warmgate/gateway.yaml"
        assert g["ports"][0].split(":")[1] == str(config["port"])
        for dep in g["depends_on"]:
            assert dep in services
    assert "EXPOSE 8000" in (DEPLOY / "Dockerfile").read_text() and config["port"] == 8000
    assert urlparse(config["state"]["redis_url"]).hostname in services
    names_by_alias: dict[str, dict[str, list[str]]] = {}
    for name, svc in services.items():
        for alias in svc.get("networks", {}).get("default", {}).get("aliases", []):
            for profile in svc["profiles"]:
                names_by_alias.setdefault(profile, {}).setdefault(alias, []).append(name)
    assert set(names_by_alias) == {"sim", "vllm"}
    array_mounts = set()
    for inst in config["instances"]:
        engine_url, tierd_url = urlparse(inst["url"]), urlparse(inst["tierd_url"])
        tierd = services[tierd_url.hostname]
        assert _flag(tierd["command"], "--port") == str(tierd_url.port)
        assert _flag(tierd["command"], "--instance-id") == inst["id"]
        sock_volume = next(v for v in tierd["volumes"] if v.endswith(":/run/warmgate"))
        array_mounts |= {v for v in tierd["volumes"] if v.endswith(":/var/lib/warmgate/array")}
        events = urlparse(inst["kv_events_endpoint"])
        assert events.hostname == engine_url.hostname
        tierd_events = urlparse(inst["tierd_events_endpoint"])  # host memory, array, snapshots
        assert tierd_events.hostname == tierd_url.hostname
        assert _flag(tierd["command"], "--events-endpoint") == f"tcp://*:{tierd_events.port}"
        for profile, aliases in names_by_alias.items():
            (engine_name,) = aliases[engine_url.hostname]  # one engine per name and profile
            engine = services[engine_name]
            args = engine["command"]
            assert _flag(args, "--port") == str(engine_url.port), (profile, engine_name)
            if profile == "sim":  # the simulated engine talks to its tierd over HTTP
                assert _flag(args, "--instance-id") == inst["id"]
                assert _flag(args, "--tierd-url") == inst["tierd_url"]
                assert _flag(args, "--kv-events-endpoint") == f"tcp://*:{events.port}"
            else:  # vLLM loads KV through tierd's connector on their shared socket
                assert sock_volume in engine["volumes"]
                kv_events = json.loads(_flag(args, "--kv-events-config"))
                assert kv_events["endpoint"] == f"tcp://*:{events.port}"
    assert array_mounts == {"array:/var/lib/warmgate/array"}, "one array volume for all tierds"
    assert set(compose["volumes"]) >= {"array", "kvsock-0", "kvsock-1"}
    assert (COMPOSE / ".env").read_text().count("COMPOSE_PROFILES=sim") == 1


def _launcher_flags() -> tuple[list[str], dict[str, Any]]:
    """The flags warmgate's own vLLM launcher passes (gateway/launch/vllm_fleet.py), less
    the per-machine ones (model path, name, address, CPU-only dtype and compile level)."""
    cfg = FleetConfig(model_dir=Path("/models/model"), python=Path("python"), kv_events_topic="x")
    argv = VllmEngine(cfg, 0, 8100, 0, Path("/run")).argv()[3:]
    per_machine = {"--model", "--served-model-name", "--host", "--port", "--dtype"}
    per_machine |= {"--uvicorn-log-level", "--kv-events-config", "--block-size"}
    flags, k = [], 0
    events: dict[str, Any] = {}
    while k < len(argv):
        name = argv[k]
        value = argv[k + 1] if k + 1 < len(argv) and not argv[k + 1].startswith("-") else None
        if name == "--kv-events-config":
            events = json.loads(argv[k + 1])
        if name not in per_machine and name != "-O0":
            flags.append(name if value is None else f"{name}={value}")
        k += 1 if value is None else 2
    return flags, events


def _check_vllm_args(args: list[str]) -> None:
    flags, events = _launcher_flags()
    assert flags and set(flags) <= set(args), set(flags) - set(args)
    ours = json.loads(_flag(args, "--kv-events-config"))
    assert {k: ours[k] for k in ("enable_kv_cache_events", "publisher")} == {
        k: events[k] for k in ("enable_kv_cache_events", "publisher")
    }
    assert ours["endpoint"].startswith("tcp://*:"), "vLLM binds only with *"
    expected = json.loads(connector_config(Path("/run/warmgate/tierd.sock"), None, "sync"))
    assert json.loads(_flag(args, "--kv-transfer-config")) == expected


def test_vllm_engines_run_with_the_launchers_flags() -> None:
    services = load(COMPOSE / "compose.yaml")["services"]
    for name in ("engine-0-vllm", "engine-1-vllm"):
        _check_vllm_args(services[name]["command"])
        assert services[name]["environment"]["PYTHONHASHSEED"] == "0"
    (engine,) = [c for c in _containers(load(VLLM / "engine-vllm.yaml")) if c["name"] == "engine"]
    _check_vllm_args(engine["args"])


@pytest.mark.skipif(
    shutil.which("docker-compose") is None and os.environ.get("CI") != "true",
    reason="docker-compose is not installed (apt-get install docker-compose)",  # CI has it
)
def test_docker_compose_accepts_the_file() -> None:
    for profile in ("sim", "vllm"):
        r = subprocess.run(
            ["docker-compose", "-f", str(COMPOSE / "compose.yaml"), "config", "-q"],
            env={**os.environ, "COMPOSE_PROFILES": profile},
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert r.returncode == 0, r.stderr


# -- Kubernetes ----------------------------------------------------------------------------


def _merge_named(base: list[Any], patch: list[Any]) -> list[Any]:
    """Strategic merge of lists keyed by `name` (containers, env, volumes, mounts, ports)."""
    out = [copy.deepcopy(b) for b in base]
    for item in patch:
        name = item.get("name") if isinstance(item, dict) else None
        hit = next((o for o in out if isinstance(o, dict) and o.get("name") == name), None)
        if name is None or hit is None:
            out.append(copy.deepcopy(item))
        else:
            out[out.index(hit)] = _merge(hit, item)
    return out


def _merge(base: Any, patch: Any) -> Any:
    if isinstance(base, dict) and isinstance(patch, dict):
        out = dict(base)
        for k, v in patch.items():
            out[k] = _merge(base[k], v) if k in base else copy.deepcopy(v)
        return out
    if (
        isinstance(base, list)
        and isinstance(patch, list)
        and all(isinstance(i, dict) and "name" in i for i in base + patch)
    ):
        return _merge_named(base, patch)
    return copy.deepcopy(patch)


def render(overlay: Path | None) -> list[dict[str, Any]]:
    """What `kubectl kustomize` renders, for the features these manifests use."""
    kust = load(BASE / "kustomization.yaml")
    docs = _k8s_docs()
    for gen in kust["configMapGenerator"]:
        data = {Path(f).name: (BASE / f).read_text() for f in gen["files"]}
        docs.append(
            {
                "apiVersion": "v1",
                "kind": "ConfigMap",
                "metadata": {"name": gen["name"]},
                "data": data,
            }
        )
    images = {i["name"]: i for i in kust["images"]}
    if overlay is not None:
        okust = load(overlay / "kustomization.yaml")
        docs += [
            d for r in okust["resources"] if not r.startswith("..") for d in load_all(overlay / r)
        ]
        for p in okust.get("patches", []):
            patch = load(overlay / p["path"])
            for k, d in enumerate(docs):
                if (d["kind"], d["metadata"]["name"]) == (patch["kind"], patch["metadata"]["name"]):
                    docs[k] = _merge(d, patch)
        images |= {i["name"]: i for i in okust.get("images", [])}
    for d in docs:
        d["metadata"].setdefault("namespace", kust["namespace"]) if d[
            "kind"
        ] != "Namespace" else None
        for c in _containers(d):
            if c["image"] in images:
                c["image"] = f"{c['image']}:{images[c['image']]['newTag']}"
    return docs


@pytest.mark.parametrize("overlay", [None, VLLM, EPP], ids=["base", "vllm", "epp"])
def test_kubernetes_resources_validate_against_the_schemas(overlay: Path | None) -> None:
    import kubernetes_validate

    docs = render(overlay)
    kinds = sorted(d["kind"] for d in docs)
    expected = ["ConfigMap", "Deployment", "Deployment", "Namespace", "PersistentVolumeClaim"]
    expected += ["PodDisruptionBudget", "Service", "Service", "Service", "StatefulSet"]
    if overlay == VLLM:
        expected.append("PersistentVolumeClaim")
    if overlay == EPP:
        expected += ["Deployment", "Service", "InferencePool", "HTTPRoute"]
    assert kinds == sorted(expected)
    for d in docs:
        if d["kind"] not in CRD_KINDS:
            kubernetes_validate.validate(d, K8S_VERSION, strict=True)


def test_kubernetes_pieces_agree() -> None:
    docs = {(d["kind"], d["metadata"]["name"]): d for d in render(VLLM)}
    config = yaml.safe_load(docs["ConfigMap", "warmgate-gateway"]["data"]["gateway.yaml"])
    gw = docs["Deployment", "warmgate-gateway"]
    (gc,) = _containers(gw)
    assert gc["image"] == "warmgate:latest"  # the image compose builds
    assert gc["ports"][0]["containerPort"] == config["port"]
    mount = gc["volumeMounts"][0]["mountPath"]
    assert gc["args"] == ["--config", f"{mount}/gateway.yaml"]
    svc = docs["Service", "warmgate-gateway"]
    assert svc["spec"]["ports"][0]["targetPort"] == gc["ports"][0]["name"]
    selector = gw["spec"]["selector"]["matchLabels"]
    assert svc["spec"]["selector"] == selector
    assert (
        docs["PodDisruptionBudget", "warmgate-gateway"]["spec"]["selector"]["matchLabels"]
        == selector
    )
    assert gw["spec"]["replicas"] >= 2
    assert urlparse(config["state"]["redis_url"]).hostname in {n for k, n in docs if k == "Service"}
    sts = docs["StatefulSet", "warmgate-engine"]
    headless = docs["Service", sts["spec"]["serviceName"]]
    assert headless["spec"]["clusterIP"] == "None"
    pods = {f"{sts['metadata']['name']}-{k}" for k in range(sts["spec"]["replicas"])}
    containers = {c["name"]: c for c in _containers(sts)}
    ports = {p["name"]: p["containerPort"] for c in containers.values() for p in c["ports"]}
    for inst in config["instances"]:
        assert inst["id"] in pods  # --instance-id=$(POD_NAME)
        for key, port_name in (
            ("url", "http"),
            ("tierd_url", "tierd"),
            ("kv_events_endpoint", "kv-events"),
            ("tierd_events_endpoint", "tierd-events"),
        ):
            u = urlparse(inst[key])
            assert u.hostname == f"{inst['id']}.{headless['metadata']['name']}"
            assert u.port == ports[port_name]
    tierd = containers["tierd"]
    assert "--instance-id=$(POD_NAME)" in tierd["args"]
    assert f"--events-endpoint=tcp://*:{ports['tierd-events']}" in tierd["args"]
    volumes = {v["name"]: v for v in sts["spec"]["template"]["spec"]["volumes"]}
    assert volumes["array"]["persistentVolumeClaim"]["claimName"] == "warmgate-array"
    assert docs["PersistentVolumeClaim", "warmgate-array"]["spec"]["accessModes"] == [
        "ReadWriteMany"
    ]
    for c in containers.values():  # engine and tierd share the pod's KV socket
        assert {"name": "kvsock", "mountPath": "/run/warmgate"} in c["volumeMounts"]
    assert any(m["name"] == "array" for m in tierd["volumeMounts"])


def _env(container: dict[str, Any]) -> dict[str, str]:
    return {e["name"]: e["value"] for e in container.get("env", []) if "value" in e}


def test_endpoint_picker_pieces_agree(monkeypatch: pytest.MonkeyPatch) -> None:
    """The InferencePool selects the engine pods on their OpenAI port and names the picker's
    Service, whose port reaches the picker container's gRPC port, which is the epp.port
    the gateway's settings give it; the HTTPRoute sends to the pool."""
    docs = {(d["kind"], d["metadata"]["name"]): d for d in render(EPP)}
    pool = docs["InferencePool", "warmgate-engines"]
    assert pool["apiVersion"] == "inference.networking.k8s.io/v1"
    spec = pool["spec"]
    assert set(spec) <= {"selector", "targetPorts", "appProtocol", "endpointPickerRef"}
    sts = docs["StatefulSet", "warmgate-engine"]
    pod_labels = sts["spec"]["template"]["metadata"]["labels"]
    assert spec["selector"]["matchLabels"].items() <= pod_labels.items()
    engine = {c["name"]: c for c in _containers(sts)}["engine"]
    http = {p["name"]: p["containerPort"] for p in engine["ports"]}["http"]
    assert [p["number"] for p in spec["targetPorts"]] == [http]
    ref = spec["endpointPickerRef"]
    assert set(ref) <= {"group", "kind", "name", "port", "failureMode"}
    assert ref.get("kind", "Service") == "Service" and ref.get("group", "") == ""
    assert ref["failureMode"] in {"FailOpen", "FailClose"}
    svc = docs["Service", ref["name"]]
    (svc_port,) = [p for p in svc["spec"]["ports"] if p["port"] == ref["port"]["number"]]
    assert svc_port["appProtocol"] == "kubernetes.io/h2c"  # ext_proc is gRPC
    epp = docs["Deployment", "warmgate-epp"]
    assert svc["spec"]["selector"] == epp["spec"]["selector"]["matchLabels"]
    assert epp["spec"]["template"]["metadata"]["labels"].items() >= svc["spec"]["selector"].items()
    (c,) = _containers(epp)
    grpc_port = {p["name"]: p["containerPort"] for p in c["ports"]}[svc_port["targetPort"]]
    for probe in (c["readinessProbe"], c["livenessProbe"]):
        assert probe["grpc"]["port"] == grpc_port
    gw = docs["Deployment", "warmgate-gateway"]
    assert c["image"] == _containers(gw)[0]["image"] and c["args"] == _containers(gw)[0]["args"]
    # the picker's settings: the base's ConfigMap plus its environment, as the gateway reads them
    for name in list(os.environ):
        if name.startswith("WARMGATE_"):
            monkeypatch.delenv(name)
    for name, value in _env(c).items():
        monkeypatch.setenv(name, value)
    config = yaml.safe_load(docs["ConfigMap", "warmgate-gateway"]["data"]["gateway.yaml"])
    settings = Settings(**config)
    assert settings.epp.port == grpc_port
    assert {urlparse(i.url).port for i in settings.instances} == {http}
    route = docs["HTTPRoute", "warmgate"]
    assert route["apiVersion"] == "gateway.networking.k8s.io/v1"
    backends = [b for r in route["spec"]["rules"] for b in r["backendRefs"]]
    pool_ref = {"group": "inference.networking.k8s.io", "kind": "InferencePool"}
    assert backends == [pool_ref | {"name": pool["metadata"]["name"]}]
