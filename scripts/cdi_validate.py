"""Validates CDI spec files against the Container Device Interface's JSON
schema (dra/cdi-schema/, vendored from the CDI project), with `jsonschema`.
Usage: python3 scripts/cdi_validate.py SCHEMA_DIR SPEC.json...
Prints one line per file; exits 1 if any is invalid.
"""

import json
import pathlib
import sys

import jsonschema
from referencing import Registry, Resource
from referencing.jsonschema import DRAFT7


def main(schema_dir: str, specs: list) -> int:
    directory = pathlib.Path(schema_dir)
    schema = json.loads((directory / "schema.json").read_text())
    defs = json.loads((directory / "defs.json").read_text())
    # schema.json refers to "defs.json#/definitions/...".
    registry = Registry().with_resource("defs.json", Resource.from_contents(defs, default_specification=DRAFT7))
    validator = jsonschema.Draft7Validator(schema, registry=registry)
    failures = 0
    for path in specs:
        document = json.loads(pathlib.Path(path).read_text())
        errors = sorted(validator.iter_errors(document), key=lambda e: list(e.path))
        if errors:
            failures += 1
            for error in errors:
                print(f"INVALID {path}: {error.message} at {list(error.path)}")
        else:
            print(f"valid   {path}")
    return 1 if failures or not specs else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2:]))
