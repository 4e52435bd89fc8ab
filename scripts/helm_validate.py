"""Renders the Helm chart with Helm's own template engine and validates every
rendered object against the Kubernetes OpenAPI schemas.

Helm's engine comes from PyPI's `helm-python-sdk` (it bundles Helm v4's
library, so no `helm` binary is needed; none is packaged for Linux on PyPI
or Debian), the schemas from PyPI's `kubernetes-validate`. Also runs
`helm lint`. Usage: python3 scripts/helm_validate.py CHART KUBERNETES_VERSION
"""

import sys

import helm_python as helm
import kubernetes_validate
import yaml


def main(chart_dir: str, version: str) -> int:
    failures = 0
    lint = helm.lint(chart_dir)
    for message in lint.get("messages", []):
        print(f"lint: {message.get('path')}: {message.get('error')} (severity {message.get('severity')})")
    for error in lint.get("errors", []):
        print(f"LINT ERROR: {error}")
        failures += 1
    objects = 0
    with helm.Chart.load(chart_dir) as chart:
        rendered = chart.render({}, name="dilu", namespace="dilu-system")
    for name, text in sorted(rendered.items()):
        if not name.endswith((".yaml", ".yml")):
            continue
        for document in yaml.safe_load_all(text):
            if not document:
                continue
            objects += 1
            label = f"{name}: {document.get('kind')}/{document.get('metadata', {}).get('name')}"
            try:
                kubernetes_validate.validate(document, version, strict=True)
                print(f"valid   {label}")
            except kubernetes_validate.ValidationError as error:
                failures += 1
                print(f"INVALID {label}: {error.message} at {list(error.path)}")
    print(f"{max(objects - failures, 0)} passed, {failures} failed")
    return 1 if failures or objects == 0 else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2]))
