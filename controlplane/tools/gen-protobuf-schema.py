#!/usr/bin/env python3
"""Generates controlplane/src/api/schema/table.rs, the type table of the served kinds.

Kubernetes' protobuf encoding numbers fields by the Go struct tags; the prost bindings of the
`k8s-pb` crate carry those numbers (`#[prost(string, optional, tag = "6")] pub pod_ip`) but only
snake_case field names. The JSON names come from the `k8s-openapi` crate's serde code
(`"podIP" => Field::Key_pod_ip`). List markers (`+listType=map`, `+patchMergeKey=name`, ...) come
from the k8s-pb doc comments.

Usage (both crates unpacked by cargo, e.g. after `cargo fetch` of a project depending on them):

    python3 controlplane/tools/gen-protobuf-schema.py K8S_PB_DIR K8S_OPENAPI_DIR \
        > controlplane/src/api/schema/table.rs

K8S_PB_DIR is the k8s-pb 0.9 crate root; K8S_OPENAPI_DIR the k8s-openapi 0.26 crate root (its
`src/v1_34` tree is read). The output is deterministic.
"""

import os
import re
import sys

# Group versions whose kinds the decoder accepts as top-level objects.
SERVED = {
    "v1",
    "apps/v1",
    "batch/v1",
    "autoscaling/v1",
    "autoscaling/v2",
    "coordination.k8s.io/v1",
    "policy/v1",
    "discovery.k8s.io/v1",
    "events.k8s.io/v1",
    "networking.k8s.io/v1",
    "node.k8s.io/v1",
    "scheduling.k8s.io/v1",
    "rbac.authorization.k8s.io/v1",
    "certificates.k8s.io/v1",
    "authentication.k8s.io/v1",
    "authorization.k8s.io/v1",
    "storage.k8s.io/v1",
    "admissionregistration.k8s.io/v1",
}

# Request bodies of subresources: (apiVersion, kind, message).
EXTRA_KINDS = [
    ("authentication.k8s.io/v1", "TokenRequest", "k8s.io.api.authentication.v1.TokenRequest"),
    ("policy/v1", "Eviction", "k8s.io.api.policy.v1.Eviction"),
    ("v1", "Binding", "k8s.io.api.core.v1.Binding"),
    ("autoscaling/v1", "Scale", "k8s.io.api.autoscaling.v1.Scale"),
]

# metav1 messages the server encodes or decodes directly, whatever the request's group version:
# DeleteOptions bodies, Status answers, the ListMeta of lists and the frames of watch streams.
META_MESSAGES = [
    "k8s.io.apimachinery.pkg.apis.meta.v1.DeleteOptions",
    "k8s.io.apimachinery.pkg.apis.meta.v1.ListMeta",
    "k8s.io.apimachinery.pkg.apis.meta.v1.Status",
    "k8s.io.apimachinery.pkg.apis.meta.v1.WatchEvent",
]

# Messages with a JSON form of their own (see `Special` in schema/mod.rs); their fields are not walked.
SPECIAL = {
    "k8s.io.apimachinery.pkg.apis.meta.v1.Time": "Time",
    "k8s.io.apimachinery.pkg.apis.meta.v1.MicroTime": "MicroTime",
    "k8s.io.apimachinery.pkg.apis.meta.v1.Duration": "Duration",
    "k8s.io.apimachinery.pkg.apis.meta.v1.FieldsV1": "RawJson",
    "k8s.io.apimachinery.pkg.runtime.RawExtension": "RawJson",
    "k8s.io.apimachinery.pkg.api.resource.Quantity": "Quantity",
    "k8s.io.apimachinery.pkg.util.intstr.IntOrString": "IntOrString",
}

SCALARS = {
    "string": "Str",
    "bytes": "Bytes",
    "bool": "Bool",
    "int32": "Int",
    "int64": "Int",
    "double": "Double",
}


def norm(name):
    return name.replace("_", "").replace("r#", "").lower()


def read_openapi_names(root):
    """Map of lower-cased struct name -> {normalised rust field: json name}, and a global map."""
    per_struct, global_names = {}, {}
    for dirpath, _, files in os.walk(os.path.join(root, "src", "v1_34")):
        for f in sorted(files):
            if not f.endswith(".rs"):
                continue
            text = open(os.path.join(dirpath, f), encoding="utf-8").read()
            for m in re.finditer(r"pub struct (\w+) \{", text):
                names = per_struct.setdefault(m.group(1).lower(), {})
                for j, key in re.findall(r'"([A-Za-z0-9$]+)" => Field::Key_(\w+),', text):
                    names[norm(key)] = j
                    global_names.setdefault(norm(key), set()).add(j)
                break
    return per_struct, global_names


def module_of(path, root):
    rel = os.path.relpath(os.path.dirname(path), os.path.join(root, "src"))
    return [] if rel == "." else rel.split(os.sep)


def proto_package(module):
    """k8s-pb module path -> the Go/proto package (k8s.io.api.core.v1, k8s.io.apimachinery...)."""
    if module[0] == "api":
        return "k8s.io.api." + ".".join(module[1:])
    if module[0] == "apimachinery":
        return "k8s.io.apimachinery." + ".".join(module[1:])
    return "k8s.io." + ".".join(module)


def resolve(type_path, module):
    """Resolves a Rust type path used in module to (module, struct)."""
    parts = [p for p in type_path.split("::") if p]
    mod = list(module)
    if parts[0] == "crate":
        mod, parts = [], parts[1:]
    while parts and parts[0] == "super":
        mod = mod[:-1]
        parts = parts[1:]
    return mod + parts[:-1], parts[-1]


def inner_type(decl):
    """The message type inside Option<...>, Vec<...>, Box<...> or the value of a BTreeMap."""
    t = decl.replace(" ", "").replace(",>", ">")
    for wrapper in ("::core::option::Option<", "::prost::alloc::vec::Vec<", "::prost::alloc::boxed::Box<"):
        while t.startswith(wrapper):
            t = t[len(wrapper) : -1]
    if t.startswith("::prost::alloc::collections::BTreeMap<"):
        t = t[len("::prost::alloc::collections::BTreeMap<") : -1]
        t = t.split(",", 1)[1]
    return t.rstrip(",")


def parse_pb(root):
    messages, kinds = {}, []
    for dirpath, _, files in os.walk(os.path.join(root, "src")):
        for f in files:
            if f != "mod.rs":
                continue
            path = os.path.join(dirpath, f)
            module = module_of(path, root)
            if not module:
                continue
            lines = open(path, encoding="utf-8").read().split("\n")
            pkg = proto_package(module)
            i, struct, docs, attr = 0, None, [], None
            while i < len(lines):
                line = lines[i].strip()
                m = re.match(r"pub struct (\w+) \{$", line)
                if m:
                    struct = m.group(1)
                    messages[pkg + "." + struct] = {"module": module, "struct": struct, "fields": []}
                    docs, attr = [], None
                elif struct and line == "}":
                    struct = None
                elif struct and line.startswith("///"):
                    docs.append(line[3:].strip())
                elif struct and line.startswith("#[prost("):
                    attr = line[len("#[prost(") : -2]
                elif struct and attr and line.startswith("pub "):
                    decl = line
                    while not decl.endswith(",") or decl.count("<") != decl.count(">"):
                        i += 1
                        decl += lines[i].strip()
                    name, ty = decl[4:-1].split(":", 1)
                    messages[pkg + "." + struct]["fields"].append((name, attr, ty, docs))
                    docs, attr = [], None
                m = re.match(r"impl crate::Resource for (\w+) \{$", line)
                if m:
                    api_version = re.search(r'"(.*)"', lines[i + 1]).group(1)
                    kind = re.search(r'"(.*)"', lines[i + 4]).group(1)
                    kinds.append((api_version, kind, pkg + "." + m.group(1)))
                i += 1
    return messages, kinds


def json_name(struct, field, per_struct, global_names):
    key = norm(field)
    own = per_struct.get(struct.lower(), {})
    if key in own:
        return own[key]
    candidates = global_names.get(key, set())
    if len(candidates) == 1:
        return next(iter(candidates))
    # Not in k8s-openapi (or ambiguous): lowerCamelCase of the snake name.
    print(f"warning: no JSON name for {struct}.{field}; using lowerCamelCase", file=sys.stderr)
    parts = field.replace("r#", "").split("_")
    return parts[0] + "".join(p[:1].upper() + p[1:] for p in parts[1:])


def markers(docs):
    out = {}
    for d in docs:
        m = re.match(r"\+(patchStrategy|patchMergeKey|listType|listMapKey)=(\S+)", d)
        if m:
            if m.group(1) == "listMapKey":
                out.setdefault("listMapKey", []).append(m.group(2))
            else:
                out[m.group(1)] = m.group(2)
    return out


def main():
    pb_root, openapi_root = sys.argv[1], sys.argv[2]
    per_struct, global_names = read_openapi_names(openapi_root)
    messages, kinds = parse_pb(pb_root)
    top = [(a, k, msg) for a, k, msg in kinds if a in SERVED]
    # Subresource bodies without a Resource impl in k8s-pb.
    for extra in EXTRA_KINDS:
        if extra not in top:
            top.append(extra)
    top = sorted(set(top))

    # Messages reachable from the served kinds (plus metav1 types the server decodes directly).
    wanted, queue = set(), [m for _, _, m in top]
    queue += META_MESSAGES + ["k8s.io.api.policy.v1.Eviction"]
    fields_of = {}
    while queue:
        name = queue.pop()
        if name in wanted:
            continue
        wanted.add(name)
        if name in SPECIAL:
            continue
        msg = messages[name]
        out = []
        for field, attr, ty, docs in msg["fields"]:
            tag = int(re.search(r'tag = "(\d+)"', attr).group(1))
            repeated = ", repeated" in attr
            mapm = re.match(r'btree_map = "string, (\w+)"', attr)
            scalar = attr.split(",")[0].split(" ")[0]
            if mapm:
                value = mapm.group(1)
                if value == "message":
                    mod, struct = resolve(inner_type(ty), msg["module"])
                    ref = proto_package(mod) + "." + struct
                    queue.append(ref)
                    kind = ("Map", ("Msg", ref))
                else:
                    kind = ("Map", (SCALARS[value],))
            elif scalar == "message":
                mod, struct = resolve(inner_type(ty), msg["module"])
                ref = proto_package(mod) + "." + struct
                queue.append(ref)
                kind = ("Msg", ref)
                # A Go embedded struct (`json:",inline"`): its fields belong to the parent object.
                # Its protobuf name is the struct's (`volumeSource`) or another one (Probe's
                # `handler` is a ProbeHandler): then the parent's JSON fields include all of its.
                own = per_struct.get(msg["struct"].lower(), {})
                inner = [norm(f) for f, _, _, _ in messages[ref]["fields"]]
                inlined = norm(field) == norm(struct) or (own and inner and all(f in own for f in inner))
                if inlined and norm(field) not in own:
                    out.append((tag, "", kind, repeated, markers(docs)))
                    continue
            elif scalar in SCALARS:
                kind = (SCALARS[scalar],)
            else:
                raise SystemExit(f"unhandled prost attribute {attr!r} in {name}.{field}")
            out.append((tag, json_name(msg["struct"], field, per_struct, global_names), kind, repeated, markers(docs)))
        fields_of[name] = sorted(out)

    order = sorted(wanted)
    index = {name: i for i, name in enumerate(order)}

    def kind_src(kind):
        if kind[0] == "Msg":
            return f"K::Msg({index[kind[1]]})"
        if kind[0] == "Map":
            return f"K::Map(&{kind_src(kind[1])})"
        return f"K::{kind[0]}"

    print("// @generated by controlplane/tools/gen-protobuf-schema.py from k8s-pb 0.9 (field numbers, list")
    print("// markers) and k8s-openapi 0.26 / Kubernetes 1.34 (JSON names). Do not edit by hand.")
    print("use super::{Field as F, Kind as K, Message as M};")
    print()
    print("pub(crate) static MESSAGES: &[M] = &[")
    for name in order:
        special = SPECIAL.get(name)
        print(f'    M {{ name: "{name}", special: {"Some(super::Special::" + special + ")" if special else "None"}, fields: &[')
        for tag, json, kind, repeated, mk in fields_of.get(name, []):
            keys = ", ".join(f'"{k}"' for k in mk.get("listMapKey", []))
            print(
                f'        F {{ tag: {tag}, json: "{json}", kind: {kind_src(kind)}, repeated: {str(repeated).lower()}, '
                f'list_type: "{mk.get("listType", "")}", patch_strategy: "{mk.get("patchStrategy", "")}", '
                f'merge_key: "{mk.get("patchMergeKey", "")}", map_keys: &[{keys}] }},'
            )
        print("    ] },")
    print("];")
    print()
    print("/// (apiVersion, kind, index into MESSAGES) of every top-level kind, sorted.")
    print("pub(crate) static KINDS: &[(&str, &str, usize)] = &[")
    for api_version, kind, msg in top:
        print(f'    ("{api_version}", "{kind}", {index[msg]}),')
    print("];")


if __name__ == "__main__":
    main()
