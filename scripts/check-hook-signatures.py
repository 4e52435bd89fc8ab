#!/usr/bin/env python3
"""Checks the interposer's hooked signatures against NVIDIA's headers.

Every row of interposer/src/table/rows.rs names an exact ABI symbol and its C
signature, written by hand. This finds the typedef that `cudaTypedefs.h`
(CUDA 12.9, then 13.2) gives that symbol: the k-th version of a base name is
`<base>_v<k>`, its `_ptds`/`_ptsz` variant the per-thread one, exactly as
scripts/gen-proc-table.py derives simgpu's table; and compares, parameter by
parameter, what matters at the ABI: how many there are, pointer or not (and
how deep), and the width of every integer. Names and `const` are not
compared (the interposer passes some pointers as `*const c_void`).

    scripts/check-hook-signatures.py [--cudart-dir DIR]

Exits 1 on any difference (CI runs it). DIR as for gen-proc-table.py.
"""

import importlib.util
import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ROWS = os.path.join(ROOT, "interposer", "src", "table", "rows.rs")

spec = importlib.util.spec_from_file_location(
    "gen_proc_table", os.path.join(ROOT, "scripts", "gen-proc-table.py")
)
gen = importlib.util.module_from_spec(spec)
spec.loader.exec_module(gen)

TYPEDEF = re.compile(r"\(CUDAAPI \*PFN_(\w+)\)\s*\(([^;]*)\);")

# Integer widths in bytes (4: int, unsigned int and every C enum).
C_WIDTH = {
    "char": 1,
    "size_t": 8,
    "unsigned int": 4,
    "int": 4,
    "unsigned long long": 8,
    "cuuint64_t": 8,
    "CUdeviceptr": 8,
    "CUdeviceptr_v2": 8,
    "CUdeviceptr_v1": 4,
    "CUdevice": 4,
    "CUdevice_v1": 4,
    "CUmemGenericAllocationHandle": 8,
    "CUmemGenericAllocationHandle_v1": 8,
}
RUST_WIDTH = {
    "c_char": 1,
    "usize": 8,
    "c_uint": 4,
    "c_int": 4,
    "c_ulonglong": 8,
    "CUdeviceptr": 8,
    "CUdevice": 4,
    "CUmemGenericAllocationHandle": 8,
}


def c_shape(param):
    """(pointer depth, integer width or type name) of one C parameter."""
    param = re.sub(r"\bconst\b", " ", param).strip()
    depth = param.count("*")
    words = param.replace("*", " ").split()
    # Drop the parameter name when there is one after the type.
    if len(words) > 1 and words[-1] not in ("int", "long"):
        words = words[:-1]
    ctype = " ".join(words)
    if ctype in C_WIDTH:
        return (depth, C_WIDTH[ctype])
    return (depth, "void" if ctype == "void" and depth else re.sub(r"_v\d+$", "", ctype))


def rust_shape(ty):
    ty = ty.strip()
    depth = 0
    while ty.startswith("*"):
        ty = re.sub(r"^\*\s*(mut|const)\s+", "", ty)
        depth += 1
    if ty in RUST_WIDTH:
        return (depth, RUST_WIDTH[ty])
    return (depth, "void" if ty == "c_void" and depth else ty)


def same(c, r):
    if c == r:
        return True
    # An enum (C) passed as a 4-byte integer (Rust).
    if c[0] == r[0] == 0 and isinstance(c[1], str) and r[1] == 4:
        return True
    # A typed pointer passed as void (Rust), same depth.
    if c[0] == r[0] > 0 and r[1] == "void":
        return True
    return False


def hook_rows():
    text = open(ROWS, encoding="utf-8").read()
    row = re.compile(r"=>\s*fn\s+(\w+)\s*(?:/\s*(\w+))?\s*\(([^;]*?)\)\s*;", re.S)
    for name, ptsz, args in row.findall(text):
        types = [a.split(":", 1)[1] for a in args.split(",") if ":" in a]
        yield name, types
        if ptsz:
            yield ptsz, types


def main():
    base = os.environ.get("DILU_CUDART_DIR")
    if "--cudart-dir" in sys.argv:
        base = sys.argv[sys.argv.index("--cudart-dir") + 1]
    base = base or os.path.join(
        os.environ.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache")), "dilu", "cudart"
    )
    includes = [
        os.path.join(base, "nvidia", "cuda_runtime", "include"),
        os.path.join(base, "nvidia", "cu13", "include"),
    ]
    _, table = gen.rows(includes)
    typedefs = {}
    for include in includes:
        for header in gen.HEADERS:
            with open(os.path.join(include, header), encoding="utf-8") as f:
                for pfn, params in TYPEDEF.findall(f.read()):
                    typedefs.setdefault(pfn, params)
    # ABI symbol -> its typedef's name.
    pfn_of = {}
    for b, variants in table.items():
        for since, symbol, per_thread in variants:
            pfn_of[symbol] = f"{b}_v{since}"
            if per_thread:
                pt_since, pt_symbol = per_thread
                pfn_of[pt_symbol] = f"{b}_v{pt_since}_{pt_symbol.rsplit('_', 1)[1]}"
    failures, checked = [], 0
    for name, types in hook_rows():
        pfn = pfn_of.get(name)
        params = typedefs.get(pfn) if pfn else None
        if params is None:
            failures.append(f"{name}: no typedef in the headers ({pfn})")
            continue
        c = [p for p in params.split(",") if p.strip() and p.strip() != "void"]
        if len(c) != len(types):
            failures.append(f"{name}: {len(types)} parameters, PFN_{pfn} has {len(c)}")
            continue
        for i, (cp, rt) in enumerate(zip(c, types)):
            if not same(c_shape(cp), rust_shape(rt)):
                failures.append(f"{name}: parameter {i + 1} is `{rt.strip()}`, PFN_{pfn} says `{cp.strip()}`")
        checked += 1
    for failure in failures:
        print("check-hook-signatures:", failure)
    if failures:
        sys.exit(1)
    print(f"check-hook-signatures: {checked} hooked ABI names match cudaTypedefs.h")


if __name__ == "__main__":
    main()
