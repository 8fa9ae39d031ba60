#!/usr/bin/env python3
"""Write docs/config-reference.md from the plugin config's serde structs
(filter/core/src/compile/raw.rs): every key the filter accepts, by section,
with its type, its default and its doc comment.

    python3 scripts/gen-config-ref.py          # write the reference
    python3 scripts/gen-config-ref.py --check  # fail if it is stale, or a key has no doc comment

The structs are the only list of keys (the filter's unknown-key check reads
the same fields), so a new key lands in the reference when this runs, and
`make lint` and tests/tests/config_reference.rs fail until it has.
"""
import pathlib
import re
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
RAW = ROOT / "filter/core/src/compile/raw.rs"
OUT = ROOT / "docs/config-reference.md"

STRUCT = re.compile(r"^pub\(super\) struct (Raw\w+) \{$")
FIELD = re.compile(r"^pub\(super\) (\w+): (.+),$")
DEFAULT_FN = re.compile(r"^fn (default_\w+)\(\) -> [^{]+\{$")
CONST = re.compile(r"^pub\(super\) const (\w+): [^=]+= (.+);$")


def parse(src):
    lines = src.split("\n")
    structs, order, fns, consts = {}, [], {}, {}
    cur, doc, attrs = None, [], []
    i = 0
    while i < len(lines):
        line = lines[i].strip()
        m = DEFAULT_FN.match(line)
        if m and i + 2 < len(lines) and lines[i + 2].strip() == "}":
            fns[m.group(1)] = lines[i + 1].strip()
        m = CONST.match(line)
        if m:
            consts[m.group(1)] = m.group(2)
        m = STRUCT.match(line)
        if m:
            cur = m.group(1)
            structs[cur] = []
            order.append(cur)
            doc, attrs = [], []
        elif cur:
            if line == "}":
                cur = None
            elif line.startswith("///"):
                doc.append(line[3:].strip())
            elif line.startswith("#["):
                attrs.append(line)
            else:
                m = FIELD.match(line)
                if m:
                    a = " ".join(attrs)
                    renamed = re.search(r'rename = "(\w+)"', a)
                    structs[cur].append(
                        {
                            "name": renamed.group(1) if renamed else m.group(1),
                            "type": m.group(2),
                            "doc": " ".join(doc),
                            "attrs": a,
                        }
                    )
                doc, attrs = [], []
        i += 1
    return structs, order, fns, consts


def inner(t):
    for wrap in ("Option<", "Vec<", "Box<"):
        if t.startswith(wrap) and t.endswith(">"):
            return inner(t[len(wrap):-1])
    m = re.match(r"(?:std::collections::)?(?:Hash|BTree)Map<String, (.+)>$", t)
    if m:
        return inner(m.group(1))
    return t


def type_name(t):
    if t.startswith("Option<") and t.endswith(">"):
        return type_name(t[7:-1])
    if t.startswith("Box<") and t.endswith(">"):
        return type_name(t[4:-1])
    if t.startswith("Vec<") and t.endswith(">"):
        return "list of " + type_name(t[4:-1])
    m = re.match(r"(?:std::collections::)?(?:Hash|BTree)Map<String, (.+)>$", t)
    if m:
        return "map of " + type_name(m.group(1))
    return {
        "String": "string",
        "bool": "boolean",
        "u64": "integer",
        "u32": "integer",
        "usize": "integer",
        "i64": "integer",
        "f64": "number",
        "serde_yaml::Value": "any YAML",
    }.get(t, "section" if t.startswith("Raw") else t)


def default_of(field, fns, consts):
    a = field["attrs"]
    m = re.search(r'default = "(\w+)"', a)
    if m:
        expr = fns.get(m.group(1), "")
        expr = consts.get(expr, expr)
        expr = expr.replace(".into()", "").replace(".to_string()", "")
        shift = re.fullmatch(r"(\d+) << (\d+)", expr)
        if shift:
            return str(int(shift.group(1)) << int(shift.group(2)))
        return expr.replace("_", "") if re.fullmatch(r"[\d_]+", expr) else expr or "see text"
    if "default" in a or field["type"].startswith("Option<"):
        t = field["type"]
        if t.startswith("Vec<") or "Map<" in t:
            return "empty"
        if t == "bool":
            return "false"
        if t == "String":
            return "empty"
        if t in ("u64", "u32", "usize", "f64"):
            return "0"
        return "none" if t.startswith("Option<") or t.startswith("Raw") else "—"
    return "required"


def sections(structs, fns, consts):
    """The sections in the order a reader meets them: depth first from the
    top level, each struct under the first key path that reaches it."""
    out, seen = [], set()

    def walk(name, path):
        if name in seen or name not in structs:
            return
        seen.add(name)
        rows, children = [], []
        for f in structs[name]:
            if "flatten" in f["attrs"]:
                for g in structs.get(inner(f["type"]), []):
                    rows.append(g)
                seen.add(inner(f["type"]))
                continue
            rows.append(f)
            t = inner(f["type"])
            if t.startswith("Raw"):
                many = f["type"].startswith("Vec<") or f["type"].startswith("Option<Vec<")
                mapped = "Map<" in f["type"]
                key = f["name"] + ("[]" if many else "") + (".<name>" if mapped else "")
                children.append((t, f"{path}.{key}" if path else key))
        out.append((path or "(top level)", name, rows))
        for t, p in children:
            walk(t, p)

    walk("RawConfig", "")
    return out


def render(structs, fns, consts):
    lines = [
        "# Plugin config reference",
        "",
        "Every key of the plugin config (`envoy/plugin.yaml`, or the ECDS resource",
        "that carries it), by section, generated from the config's serde structs",
        "(`filter/core/src/compile/raw.rs`) by `python3 scripts/gen-config-ref.py`;",
        "`make lint` and `tests/tests/config_reference.rs` fail when it is stale",
        "or a key has no doc comment. A bad config is refused whole, with one",
        "message listing every problem, and the previous one keeps serving.",
        "",
        "`required` keys have no default; `none` means unset (the text says what",
        "that does); a `section` key is described in its own table below, at the",
        "first place it occurs (`guardrails.output[]` takes the checks of",
        "`guardrails.input[]`, `teams[].limits` the keys of `clients[].limits`,",
        "the top-level `breaker` those of `providers[].breaker`, `prices.<model>`",
        "those of `providers[].models[].price`).",
        "",
    ]
    for path, name, rows in sections(structs, fns, consts):
        lines.append(f"## `{path}`")
        lines.append("")
        lines.append("| key | type | default | what it does |")
        lines.append("|---|---|---|---|")
        for f in rows:
            doc = f["doc"].replace("|", "\\|")
            lines.append(f"| `{f['name']}` | {type_name(f['type'])} | {default_of(f, fns, consts)} | {doc} |")
        lines.append("")
    return "\n".join(lines)


def main():
    structs, order, fns, consts = parse(RAW.read_text())
    listed = {n for _, n, _ in sections(structs, fns, consts)}
    missing = [
        f"{s}.{f['name']}" for s in order if s in listed or any(
            "flatten" in g["attrs"] and inner(g["type"]) == s for t in structs.values() for g in t
        ) for f in structs[s] if not f["doc"] and "flatten" not in f["attrs"]
    ]
    text = render(structs, fns, consts)
    if "--check" in sys.argv:
        problems = []
        if missing:
            problems.append("keys without a doc comment in raw.rs: " + ", ".join(missing))
        if not OUT.exists() or OUT.read_text() != text:
            problems.append(f"{OUT.relative_to(ROOT)} is stale: run python3 scripts/gen-config-ref.py")
        if problems:
            print("\n".join(problems), file=sys.stderr)
            sys.exit(1)
        return
    if missing:
        print("keys without a doc comment: " + ", ".join(missing), file=sys.stderr)
    OUT.write_text(text)


if __name__ == "__main__":
    main()
