#!/usr/bin/env python3
"""Generates controlplane/src/controllers/deployment/gotypes.rs: the Go layout of
core/v1 PodTemplateSpec at Kubernetes 1.32 (field order, Go names, Go types, JSON names), which
the pod-template-hash needs to print a template as upstream's deep printer does.

Inputs are the API definitions of one release (k8s.io/api and k8s.io/apimachinery at v0.32.0):

    gen_gotypes.py core/v1/types.go meta/v1/types.go > gotypes.rs

Only types reachable from PodTemplateSpec are emitted. resource.Quantity, intstr.IntOrString,
meta/v1 Time and FieldsV1 are printed by hand-written code (their Go fields are not their JSON).
"""
import re
import sys

SPECIAL = {"resource.Quantity", "intstr.IntOrString", "meta.Time", "meta.FieldsV1"}
BASIC = {"string", "bool", "int", "int32", "int64", "uint64", "float64", "byte"}


def strip_comments(src):
    out = []
    for line in src.splitlines():
        # Comments never hold backquotes in these files; tags never hold "//" except in URLs of
        # comments, which come after the tag.
        i = line.find("//")
        if i >= 0 and line.count("`", 0, i) % 2 == 0:
            line = line[:i]
        out.append(line.rstrip())
    return out


def parse(path, pkg):
    """Returns {key: ("struct", [(go, json, type)]) | ("alias", type)} with keys `pkg.Name`."""
    lines = strip_comments(open(path).read())
    types = {}
    i = 0
    while i < len(lines):
        line = lines[i].strip()
        m = re.match(r"^type (\w+) struct \{$", line)
        if m:
            name = m.group(1)
            fields = []
            i += 1
            while lines[i].strip() != "}":
                f = lines[i].strip()
                i += 1
                if not f:
                    continue
                tag = ""
                tm = re.search(r"`([^`]*)`", f)
                if tm:
                    tag = tm.group(1)
                    f = f[: tm.start()].strip()
                parts = f.split()
                jm = re.search(r'json:"([^"]*)"', tag)
                json_name = jm.group(1).split(",")[0] if jm else None
                if len(parts) == 1:
                    ty = parts[0]
                    go = ty.lstrip("*").split(".")[-1]
                    if json_name is None:
                        json_name = ""
                else:
                    go, ty = parts[0], " ".join(parts[1:])
                    if json_name is None:
                        json_name = go
                fields.append((go, json_name, qualify(ty, pkg)))
            types[f"{pkg}.{name}"] = ("struct", fields)
        else:
            m = re.match(r"^type (\w+) (\S.*)$", line)
            if m and not m.group(2).startswith("struct") and not m.group(2).startswith("interface"):
                types[f"{pkg}.{m.group(1)}"] = ("alias", qualify(m.group(2), pkg))
        i += 1
    return types


def qualify(ty, pkg):
    """Go type expression -> the same with every named type as `pkg.Name`."""
    if ty.startswith("*"):
        return "*" + qualify(ty[1:], pkg)
    if ty.startswith("[]"):
        return "[]" + qualify(ty[2:], pkg)
    if ty.startswith("map["):
        depth, j = 0, 3
        for j in range(3, len(ty)):
            if ty[j] == "[":
                depth += 1
            elif ty[j] == "]":
                depth -= 1
                if depth == 0:
                    break
        return "map[" + qualify(ty[4:j], pkg) + "]" + qualify(ty[j + 1 :], pkg)
    if ty in BASIC:
        return ty
    if "." in ty:
        p, n = ty.split(".")
        p = {"metav1": "meta", "types": "types", "resource": "resource", "intstr": "intstr"}.get(p, p)
        return f"{p}.{n}"
    return f"{pkg}.{ty}"


def named_in(ty):
    if ty.startswith("*"):
        return named_in(ty[1:])
    if ty.startswith("[]"):
        return named_in(ty[2:])
    if ty.startswith("map["):
        depth = 0
        for j in range(3, len(ty)):
            if ty[j] == "[":
                depth += 1
            elif ty[j] == "]":
                depth -= 1
                if depth == 0:
                    break
        return named_in(ty[4:j]) + named_in(ty[j + 1 :])
    return [] if ty in BASIC else [ty]


def rust_ty(ty):
    if ty.startswith("*"):
        return f"Ty::Ptr(&{rust_ty(ty[1:])})"
    if ty.startswith("[]"):
        return f"Ty::Slice(&{rust_ty(ty[2:])})"
    if ty.startswith("map["):
        depth = 0
        for j in range(3, len(ty)):
            if ty[j] == "[":
                depth += 1
            elif ty[j] == "]":
                depth -= 1
                if depth == 0:
                    break
        return f"Ty::Map(&{rust_ty(ty[4:j])}, &{rust_ty(ty[j + 1:])})"
    if ty in BASIC:
        return f'Ty::Basic("{"uint8" if ty == "byte" else ty}")'
    return f'Ty::Named("{ty}")'


def main():
    args = sys.argv[1:]
    types = {}
    types.update(parse(args[0], "core"))
    types.update(parse(args[1], "meta"))
    types["types.UID"] = ("alias", "string")
    todo, seen = ["core.PodTemplateSpec"], []
    while todo:
        t = todo.pop()
        if t in seen:
            continue
        seen.append(t)
        if t in SPECIAL:
            continue
        kind, body = types[t]
        refs = [f[2] for f in body] if kind == "struct" else [body]
        for r in refs:
            todo.extend(named_in(r))
    print("//! Generated by `controlplane/tools/gen_gotypes.py` from the Kubernetes 1.32 API")
    print("//! definitions (k8s.io/api and k8s.io/apimachinery v0.32.0): the Go layout of every type")
    print("//! reachable from core/v1 PodTemplateSpec. Do not edit by hand.")
    print()
    print("use super::hash::{Field, Named, Ty};")
    print()
    print("/// The Go type `key` (`core.PodSpec`, `meta.ObjectMeta`, ...).")
    print("pub(super) fn named(key: &str) -> Option<Named> {")
    print("    Some(match key {")
    for t in sorted(seen):
        if t in SPECIAL:
            print(f'        "{t}" => Named::Special,')
            continue
        kind, body = types[t]
        if kind == "alias":
            print(f'        "{t}" => Named::Alias({rust_ty(body)}),')
        else:
            print(f'        "{t}" => Named::Struct(&[')
            for go, js, ty in body:
                print(f'            Field {{ go: "{go}", json: "{js}", ty: {rust_ty(ty)} }},')
            print("        ]),")
    print("        _ => return None,")
    print("    })")
    print("}")


main()
