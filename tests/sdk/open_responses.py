"""Responses objects and streaming events against the Open Responses
schema: the subset of the public OpenAPI document that `ResponseResource`
and the streaming events reach, kept at ../shared/specs/ beside the
repository (PORTCULLIS_OPEN_RESPONSES_SCHEMA names another copy).

As a module: `Checker().response(obj)`, `.event(ev)`, `.sse(text)`, each
returning the problems found (an empty list: valid).

As a script, run by tests/tests/golden.rs: one JSON line per value on
standard input, `{"where": ..., "kind": "response" | "event", "value": ...}`;
prints `{"checked": N, "failures": [...]}`.

`openai_upstream=True`: one difference between OpenAI and Open Responses
is allowed, in objects the gateway passes through from an OpenAI provider
untouched: OpenAI echoes a `json_schema` text format with its schema,
where the published schema allows only `null` there.
"""
import copy
import json
import os
import pathlib
import sys

import jsonschema

HERE = pathlib.Path(__file__).resolve().parent
DEFAULT = HERE.parent.parent.parent / "shared" / "specs" / "openresponses-responses-subset.json"


def load_document():
    path = pathlib.Path(os.environ.get("PORTCULLIS_OPEN_RESPONSES_SCHEMA", DEFAULT))
    with open(path) as f:
        return json.load(f)


class Checker:
    def __init__(self, openai_upstream=False):
        doc = load_document()
        components = copy.deepcopy(doc["components"])
        if openai_upstream:
            fmt = components["schemas"]["JsonSchemaResponseFormat"]["properties"]
            fmt["schema"] = {"anyOf": [{"type": "object"}, {"type": "null"}]}
        self.components = components
        self.validators = {}
        # Each event's schema, by the `type` it names.
        self.events = {}
        for name, schema in components["schemas"].items():
            if name.endswith("StreamingEvent"):
                kind = schema["properties"]["type"].get("enum", [None])[0]
                if kind:
                    self.events[kind] = name

    def validator(self, name):
        v = self.validators.get(name)
        if v is None:
            root = {"$ref": f"#/components/schemas/{name}", "components": self.components}
            v = jsonschema.Draft202012Validator(root)
            self.validators[name] = v
        return v

    def problems(self, name, value, where):
        return [
            f"{where}: {'/'.join(str(p) for p in e.absolute_path) or '(root)'}: {e.message[:300]}"
            for e in self.validator(name).iter_errors(value)
        ]

    def response(self, obj, where="response"):
        return self.problems("ResponseResource", obj, where)

    def event(self, ev, where="event"):
        kind = ev.get("type") if isinstance(ev, dict) else None
        name = self.events.get(kind)
        if name is None:
            return [f"{where}: an event of no published type: {kind!r}"]
        return self.problems(name, ev, f"{where} ({kind})")

    def sse(self, text, where="stream"):
        """Every `data:` event of a Responses stream."""
        out, n = [], 0
        for block in text.replace("\r\n", "\n").split("\n\n"):
            data = [line[5:].lstrip() for line in block.split("\n") if line.startswith("data:")]
            if not data:
                continue
            n += 1
            try:
                ev = json.loads("\n".join(data))
            except ValueError as e:
                out.append(f"{where} event {n}: not JSON ({e})")
                continue
            out.extend(self.event(ev, f"{where} event {n}"))
        if n == 0:
            out.append(f"{where}: no events")
        return out


def main():
    checker = Checker()
    checked, failures = 0, []
    for line in sys.stdin:
        if not line.strip():
            continue
        item = json.loads(line)
        checked += 1
        if item["kind"] == "response":
            failures.extend(checker.response(item["value"], item["where"]))
        else:
            failures.extend(checker.event(item["value"], item["where"]))
    print(json.dumps({"checked": checked, "failures": failures}))


if __name__ == "__main__":
    main()
