#!/usr/bin/env bash
# Validates CDI spec files against the CDI JSON schema (dra/cdi-schema/):
#   bash scripts/cdi-validate.sh SPEC.json...
# Uses python3's jsonschema where installed, else installs it from PyPI into
# a virtual environment under target/.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
python=python3
if ! python3 -c 'import jsonschema, referencing' 2>/dev/null; then
  venv="$root/target/cdi-venv"
  if [ ! -x "$venv/bin/python" ] || ! "$venv/bin/python" -c 'import jsonschema, referencing' 2>/dev/null; then
    python3 -m venv "$venv"
    "$venv/bin/pip" install --quiet jsonschema==4.23.0
  fi
  python="$venv/bin/python"
fi
exec "$python" "$root/scripts/cdi_validate.py" "$root/dra/cdi-schema" "$@"
