"""Writes op_table.gen.hpp (constexpr descriptors) from mla_export/ops/table.json, the one
declaration of the mla_export ops. Run by CMake at build time; the C++ never restates the table.

usage: gen_op_table.py TABLE_JSON OUT_HPP
"""

import json
import re
import sys

TYPES = {"float": "float_", "cache": "cache", "index": "index", "any": "any", "f32": "f32", "u8": "u8", "i32": "i32"}
ATTR_TYPES = {"float": "f32", "int": "i64", "string": "str"}
CHECKS = {None: "none", "kv_dtype": "kv_dtype", "weight_bits": "weight_bits"}


def fail(msg: str):
    sys.exit(f"gen_op_table.py: {msg}")


def c_str(s: str) -> str:
    return json.dumps(s)  # a JSON string is a valid C string literal for this table's ASCII text


def dim_term(term, inputs: list, attrs: list, where: str) -> str:
    """One output dimension: an int, "input[k]", "input[:-1]" (its leading dims) or "@attr"."""
    if isinstance(term, int):
        return f"{{DimKind::constant, 0, 0, {term}}}"
    if term.startswith("@"):
        names = [a["name"] for a in attrs]
        if term[1:] not in names:
            fail(f"{where}: shape term {term!r} names no attribute")
        return f"{{DimKind::attribute, {names.index(term[1:])}, 0, 0}}"
    m = re.fullmatch(r"(\w+)\[(:-1|\d+)\]", term)
    names = [i["name"] for i in inputs]
    if not m or m.group(1) not in names:
        fail(f"{where}: shape term {term!r} is not input[k], input[:-1] or @attr")
    if m.group(2) == ":-1":
        return f"{{DimKind::leading, {names.index(m.group(1))}, 0, 0}}"
    return f"{{DimKind::input_dim, {names.index(m.group(1))}, {m.group(2)}, 0}}"


def main(src: str, out: str) -> None:
    table = json.load(open(src))
    lines = ["// Generated from mla_export/ops/table.json by gen_op_table.py: do not edit.", "#pragma once", "// Included by op_table.hpp, after the descriptor types.", "",
             "namespace mla::ops {", ""]
    lines.append(f"inline constexpr const char* kDomain = {c_str(table['domain'])};")
    lines.append(f"inline constexpr int kOpset = {int(table['opset'])};")
    ids, specs = [], []
    for op in table["ops"]:
        n, ins, attrs, outs = op["name"], op["inputs"], op["attributes"], op["outputs"]
        rows = []
        for i in ins:
            if i["type"] not in TYPES:
                fail(f"{n}.{i['name']}: unknown type {i['type']!r}")
            rank = -1 if i.get("rank") is None else int(i["rank"])
            rows.append(f"    {{{c_str(i['name'])}, TypeClass::{TYPES[i['type']]}, {rank}, "
                        f"{str(bool(i.get('optional'))).lower()}, {str(bool(i.get('variadic'))).lower()}, "
                        f"{str(bool(i.get('exact_i64'))).lower()}}},")
        lines += [f"inline constexpr InputSpec k{n}Inputs[] = {{", *rows, "};"]
        arows = []
        for k, a in enumerate(attrs):
            allowed = a.get("allowed", [])
            tag = f"k{n}Attr{k}"
            if a["type"] == "string":
                lines.append(f"inline constexpr const char* {tag}S[] = {{{', '.join(map(c_str, allowed)) or 'nullptr'}}};")
                lines.append(f"inline constexpr int64_t {tag}I[] = {{0}};")
            else:
                lines.append(f"inline constexpr const char* {tag}S[] = {{nullptr}};")
                lines.append(f"inline constexpr int64_t {tag}I[] = {{{', '.join(str(int(v)) for v in allowed) or '0'}}};")
            d = a.get("default")
            has = "default" in a
            dv_f = float(d) if has and a["type"] == "float" else 0.0
            dv_i = int(d) if has and a["type"] == "int" else 0
            dv_s = c_str(d) if has and a["type"] == "string" else '""'
            mn = a.get("min")
            arows.append(f"    {{{c_str(a['name'])}, AttrType::{ATTR_TYPES[a['type']]}, {str(has).lower()}, {dv_f!r}f, "
                         f"{dv_i}, {dv_s}, {len(allowed)}, {tag}I, {tag}S, {str(mn is not None).lower()}, "
                         f"{int(mn or 0)}, AttrCheck::{CHECKS[a.get('check')]}}},")
        if arows:
            lines += [f"inline constexpr AttrSpec k{n}Attrs[] = {{", *arows, "};"]
        orows = []
        for k, o in enumerate(outs):
            terms = [dim_term(t, ins, attrs, f"{n}.{o['name']}") for t in o["shape"]]
            lines.append(f"inline constexpr DimTerm k{n}Out{k}Shape[] = {{{', '.join(terms)}}};")
            t = o["type"]
            if t.startswith("="):
                names = [i["name"] for i in ins]
                if t[1:] not in names:
                    fail(f"{n}.{o['name']}: type {t!r} names no input")
                like, cls = names.index(t[1:]), "any"
            else:
                like, cls = -1, TYPES[t]
            orows.append(f"    {{{c_str(o['name'])}, TypeClass::{cls}, {like}, k{n}Out{k}Shape, {len(terms)}}},")
        lines += [f"inline constexpr OutputSpec k{n}Outputs[] = {{", *orows, "};", ""]
        ids.append(n)
        specs.append(f"    {{{c_str(n)}, k{n}Inputs, {len(ins)}, {f'k{n}Attrs' if arows else 'nullptr'}, {len(attrs)}, "
                     f"k{n}Outputs, {len(outs)}}},")
    lines.append("// The ops in the table's order (OpId indexes kOps).")
    lines.append(f"enum class OpId : int {{ {', '.join(ids)} }};")
    lines.append(f"inline constexpr int kNumOps = {len(ids)};")
    lines += ["inline constexpr OpSpec kOps[] = {", *specs, "};", "", "}  // namespace mla::ops", ""]
    text = "\n".join(lines)
    with open(out, "w") as f:
        f.write(text)


if __name__ == "__main__":
    if len(sys.argv) != 3:
        fail("usage: gen_op_table.py TABLE_JSON OUT_HPP")
    main(sys.argv[1], sys.argv[2])
