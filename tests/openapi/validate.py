"""Check the HTTP API's real answers against its OpenAPI document with the `jsonschema`
package's Draft 2020-12 validator (OpenAPI 3.1's schema dialect), strictly: an object a
definition describes may hold no property it does not list (`unevaluatedProperties: false`
added to every definition in `components/schemas` that lists properties), so a field the
service answers but the document leaves out fails as surely as a wrong type.

    python3 validate.py CASES.json

CASES.json: {"document": the document, "cases": [{"where": "GET /api/...", "schema": {...},
"instance": the answer}]}. Prints one line per failure and exits 1 if any.
"""
import copy
import json
import sys

try:
    from jsonschema import Draft202012Validator
except ImportError as e:
    sys.exit(f"{e}: ./test installs mcp==2.3.0 (which brings jsonschema) into .venv")


def strict(definitions):
    for schema in definitions.values():
        if isinstance(schema, dict) and "properties" in schema:
            schema.setdefault("unevaluatedProperties", False)
    return definitions


def main():
    with open(sys.argv[1], encoding="utf-8") as f:
        given = json.load(f)
    components = copy.deepcopy(given["document"].get("components", {}))
    strict(components.get("schemas", {}))
    failures = 0
    for case in given["cases"]:
        schema = dict(case["schema"])
        schema["components"] = components
        validator = Draft202012Validator(schema)
        for error in sorted(validator.iter_errors(case["instance"]), key=lambda e: list(e.absolute_path)):
            failures += 1
            where = "/".join(str(p) for p in error.absolute_path)
            print(f"{case['where']}: at /{where}: {error.message[:300]}")
    print(f"{len(given['cases'])} answers checked, {failures} failures", file=sys.stderr)
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
