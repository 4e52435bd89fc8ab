"""Renders the Helm chart with Helm's own template engine and validates every
rendered object against the Kubernetes OpenAPI schemas, with the defaults,
with every optional object on and with the DRA driver on (validated against
Kubernetes 1.34, the first with resource.k8s.io/v1, as are the DRA examples
in deploy/examples); checks that the metrics Service, annotations and
ServiceMonitor reach the node manager's /metrics port, that the DRA
driver's directories are mounted where its flags point, and that values
the chart must refuse are refused.

Helm's engine comes from PyPI's `helm-python-sdk` (it bundles Helm v4's
library, so no `helm` binary is needed; none is packaged for Linux on PyPI
or Debian), the schemas from PyPI's `kubernetes-validate`. Also runs
`helm lint`. Usage: python3 scripts/helm_validate.py CHART KUBERNETES_VERSION
"""

import sys

import helm_python as helm
import kubernetes_validate
import yaml


# Values CI renders besides the defaults: every optional object on.
ALL_ON = {
    "scheduler": {"replicas": 2},
    "node": {"runtimeClassName": ""},
    "metrics": {"serviceMonitor": {"enabled": True, "labels": {"release": "prometheus"}}},
    "autoscaler": {"namespace": "serving"},
}
# The DRA driver on (its DeviceClass, RBAC and DaemonSet container).
DRA_ON = {"dra": {"enabled": True}}
# The first Kubernetes version with resource.k8s.io/v1 (DeviceClass, claims).
DRA_VERSION = "1.34"
DRA_EXAMPLES = ["deploy/examples/dra-inference.yaml", "deploy/examples/dra-training.yaml"]
# Values the chart must refuse to render.
REFUSED = {
    "several schedulers without leader election": {
        "scheduler": {"replicas": 2, "leaderElection": False}
    },
}
# Kinds of CRDs, which Kubernetes' schemas do not know: checked by
# metrics_wiring below instead.
CRD_KINDS = {"ServiceMonitor"}


def render(chart_dir: str, values: dict) -> list:
    with helm.Chart.load(chart_dir) as chart:
        rendered = chart.render(values, name="dilu", namespace="dilu-system")
    documents = []
    for name, text in sorted(rendered.items()):
        if name.endswith((".yaml", ".yml")):
            documents += [(name, d) for d in yaml.safe_load_all(text) if d]
    return documents


def find(documents: list, kind: str, name: str):
    for _, d in documents:
        if d["kind"] == kind and d["metadata"]["name"] == name:
            return d
    return None


def metrics_wiring(documents: list) -> list:
    """What would leave /metrics unscraped: the Service selecting no node
    pod, a port that is not the one the node manager listens on, a
    ServiceMonitor selecting no Service."""
    problems = []
    daemonset = find(documents, "DaemonSet", "dilu-node")
    service = find(documents, "Service", "dilu-node-metrics")
    config = find(documents, "ConfigMap", "dilu-node-config")
    if not (daemonset and service and config):
        return ["the node DaemonSet, its metrics Service or its ConfigMap is missing"]
    pod = daemonset["spec"]["template"]
    labels = pod["metadata"]["labels"]
    if any(labels.get(k) != v for k, v in service["spec"]["selector"].items()):
        problems.append(f"Service selector {service['spec']['selector']} matches no node pod {labels}")
    nodemgr = next(c for c in pod["spec"]["containers"] if c["name"] == "nodemgr")
    ports = {p["name"]: p["containerPort"] for p in nodemgr.get("ports", [])}
    port = service["spec"]["ports"][0]
    if ports.get(port["targetPort"]) != port["port"]:
        problems.append(f"Service port {port} is not the nodemgr container's {ports}")
    listen = [l for l in config["data"]["nodemgr.toml"].splitlines() if l.startswith("metrics")]
    if not listen or not listen[0].rstrip('"').endswith(f":{port['port']}") or "127.0.0.1" in listen[0]:
        problems.append(f"the node manager listens on {listen}, not on all addresses at port {port['port']}")
    annotations = pod["metadata"].get("annotations", {})
    if annotations and annotations.get("prometheus.io/port") != str(port["port"]):
        problems.append(f"scrape annotations name port {annotations.get('prometheus.io/port')}")
    monitor = find(documents, "ServiceMonitor", "dilu-node")
    if monitor:
        selector = monitor["spec"]["selector"]["matchLabels"]
        service_labels = service["metadata"]["labels"]
        if any(service_labels.get(k) != v for k, v in selector.items()):
            problems.append(f"ServiceMonitor selector {selector} does not match the Service's labels")
        if any(e["port"] != port["name"] for e in monitor["spec"]["endpoints"]):
            problems.append("a ServiceMonitor endpoint names a port the Service does not have")
    return problems


def dra_wiring(documents: list, enabled: bool) -> list:
    """What would leave the DRA driver unreachable or half-installed: its
    container without the directories its flags name mounted, no
    DeviceClass selecting its driver, no permission to publish slices; or,
    with DRA off, any of it rendered."""
    daemonset = find(documents, "DaemonSet", "dilu-node")
    containers = {c["name"]: c for c in daemonset["spec"]["template"]["spec"]["containers"]}
    classes = [d for _, d in documents if d["kind"] == "DeviceClass"]
    if not enabled:
        if "dra-plugin" in containers or classes:
            return ["DRA is off but its container or DeviceClass is rendered"]
        return []
    problems = []
    plugin = containers.get("dra-plugin")
    if plugin is None:
        return ["DRA is on but the node DaemonSet has no dra-plugin container"]
    mounts = [m["mountPath"] for m in plugin.get("volumeMounts", [])]
    command = plugin["command"]
    for flag in ["--registry-dir", "--plugin-dir", "--cdi-dir", "--socket-dir"]:
        if flag not in command:
            problems.append(f"dra-plugin is started without {flag}")
            continue
        path = command[command.index(flag) + 1]
        if path not in mounts:
            problems.append(f"dra-plugin's {flag} {path} is not mounted ({mounts})")
    selects = [c for c in classes
               if any('device.driver == "gpu.dilu.io"' in s.get("cel", {}).get("expression", "")
                      for s in c["spec"].get("selectors", []))]
    if not selects:
        problems.append("no DeviceClass selects the gpu.dilu.io driver's devices")
    role = find(documents, "ClusterRole", "dilu-node")
    granted = {r for rule in role["rules"] if "resource.k8s.io" in rule.get("apiGroups", [])
               for r in rule["resources"]}
    for resource in ["resourceslices", "resourceclaims"]:
        if resource not in granted:
            problems.append(f"the node's ClusterRole does not grant {resource}")
    return problems


def schema_valid(document: dict, version: str, where: str) -> bool:
    """One object against Kubernetes' schema of `version`; prints its line."""
    what = f"{where}: {document.get('kind')}/{document.get('metadata', {}).get('name')}"
    if document.get("kind") in CRD_KINDS:
        print(f"crd     {what} (checked by the metrics wiring)")
        return True
    try:
        kubernetes_validate.validate(document, version, strict=True)
        print(f"valid   {what}")
        return True
    except kubernetes_validate.ValidationError as error:
        print(f"INVALID {what}: {error.message} at {list(error.path)}")
        return False


def validate(documents: list, version: str, label: str) -> tuple:
    objects, failures = 0, 0
    for name, document in documents:
        objects += 1
        failures += not schema_valid(document, version, f"{label}: {name}")
    for problem in metrics_wiring(documents) + dra_wiring(documents, label == "dra on"):
        failures += 1
        print(f"WIRING  {label}: {problem}")
    return objects, failures


def examples(paths: list, version: str) -> tuple:
    """The DRA example manifests, against Kubernetes' schemas."""
    documents = []
    for path in paths:
        with open(path) as f:
            documents += [(path, d) for d in yaml.safe_load_all(f) if d]
    failures = sum(not schema_valid(d, version, f"example: {name}") for name, d in documents)
    return len(documents), failures


def main(chart_dir: str, version: str) -> int:
    failures = 0
    lint = helm.lint(chart_dir)
    for message in lint.get("messages", []):
        print(f"lint: {message.get('path')}: {message.get('error')} (severity {message.get('severity')})")
    for error in lint.get("errors", []):
        print(f"LINT ERROR: {error}")
        failures += 1
    objects = 0
    dra_version = max(version, DRA_VERSION, key=lambda v: tuple(map(int, v.split("."))))
    for label, values, at in [
        ("defaults", {}, version),
        ("all options on", ALL_ON, version),
        ("dra on", DRA_ON, dra_version),
    ]:
        counted, failed = validate(render(chart_dir, values), at, label)
        objects += counted
        failures += failed
    counted, failed = examples(DRA_EXAMPLES, dra_version)
    objects += counted
    failures += failed
    for why, values in REFUSED.items():
        try:
            render(chart_dir, values)
            failures += 1
            print(f"RENDERED {why}: the chart must refuse it")
        except Exception as error:  # Helm's engine reports a template failure as an exception
            print(f"refused {why}: {str(error).splitlines()[0][:160]}")
    print(f"{max(objects - failures, 0)} passed, {failures} failed")
    return 1 if failures or objects == 0 else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2]))
