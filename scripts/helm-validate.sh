#!/usr/bin/env bash
# Validates the Helm chart (deploy/helm/dilu): renders it with Helm's engine
# and checks every object against Kubernetes' schemas (scripts/helm_validate.py).
# Installs its two PyPI packages into a virtual environment under target/.
set -euo pipefail
cd "$(dirname "$0")/.."
venv=target/helm-venv
if [ ! -x "$venv/bin/python" ] || ! "$venv/bin/python" -c 'import helm_python, kubernetes_validate, yaml' 2>/dev/null; then
  python3 -m venv "$venv"
  "$venv/bin/pip" install --quiet helm-python-sdk==0.2.2 kubernetes-validate==1.37.0 pyyaml
fi
"$venv/bin/python" scripts/helm_validate.py deploy/helm/dilu "${KUBERNETES_VERSION:-1.32}"
