#!/usr/bin/env python3
"""Generates interposer/src/table/driver_api.rs from NVIDIA's CUDA headers.

For every driver function the interposer hooks (each ABI name of
interposer/src/table/rows.rs) or calls itself (CALLED below), the file gets
the Rust type of its `cudaTypedefs.h` typedef, `PFN_<ABI name>`, and a slot
for it in `RealDriver`, the one table of real-driver functions
(`crate::table::REAL`). Which typedef an ABI name has is derived as
scripts/gen-proc-table.py derives simgpu's table: the k-th version of a base
name is `<base>_v<k>`, its `_ptds`/`_ptsz` variant the per-thread one.

C types become Rust types this way: `int`, `unsigned int`, `char`, `size_t`,
... the `core::ffi` / primitive types of the same width; every C enum
`c_uint` (a driver may write values the bindings do not know, which a Rust
enum must never hold); a versioned alias (`CUdeviceptr_v2`) the name
`cuda.h` gives it (`CUdeviceptr`), or its integer type where it has none
(`CUdeviceptr_v1` is `unsigned int`); anything else the `dilu_abi::cuda::sys`
type of the same name.

It also writes interposer/src/driver/nvml_api.rs: `PFN_<name>` of the NVML
functions the interposer calls or hooks (NVML below), from their
declarations in `nvml.h`, with NVML's types as `driver/nvml.rs` spells them.

The headers are those scripts/install-cudart.sh installs (CUDA 12.9 first,
then 13.2 for names only it has; nvml.h of CUDA 12.9).

    scripts/gen-driver-types.py [--cudart-dir DIR] [--check]

DIR as for gen-proc-table.py. --check writes nothing and fails if either file
differs from what the headers and rows.rs give (CI runs it). The output is
passed through rustfmt, so that `cargo fmt` leaves it as it is.
"""

import importlib.util
import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ROWS = os.path.join(ROOT, "interposer", "src", "table", "rows.rs")
OUT = os.path.join(ROOT, "interposer", "src", "table", "driver_api.rs")
OUT_NVML = os.path.join(ROOT, "interposer", "src", "driver", "nvml_api.rs")

spec = importlib.util.spec_from_file_location(
    "gen_proc_table", os.path.join(ROOT, "scripts", "gen-proc-table.py")
)
gen = importlib.util.module_from_spec(spec)
spec.loader.exec_module(gen)

# Driver functions the interposer calls that it does not hook, in the order
# the file lists them.
CALLED = [
    "cuGetProcAddress",
    "cuGetProcAddress_v2",
    "cuInit",
    "cuDeviceGetCount",
    "cuDeviceGetAttribute",
    "cuDeviceGetGraphMemAttribute",
    "cuCtxGetDevice",
    "cuCtxGetCurrent",
    "cuCtxSetCurrent",
    "cuCtxPushCurrent_v2",
    "cuCtxPopCurrent_v2",
    "cuStreamGetCtx",
    "cuStreamIsCapturing",
    "cuStreamIsCapturing_ptsz",
    "cuEventCreate",
    "cuEventRecord",
    "cuEventRecord_ptsz",
    "cuStreamWaitEvent",
    "cuStreamWaitEvent_ptsz",
    "cuEventQuery",
    "cuEventElapsedTime",
    "cuStreamQuery",
    "cuStreamQuery_ptsz",
    "cuDeviceGetUuid",
    "cuLaunchHostFunc",
    "cuLaunchHostFunc_ptsz",
]

# NVML functions the interposer calls or hooks.
NVML = [
    "nvmlInit_v2",
    "nvmlDeviceGetCount_v2",
    "nvmlDeviceGetHandleByIndex_v2",
    "nvmlDeviceGetPciInfo_v3",
    "nvmlDeviceGetProcessUtilization",
    "nvmlDeviceGetMemoryInfo",
    "nvmlDeviceGetMemoryInfo_v2",
    "nvmlDeviceGetUUID",
]
# NVML's types, as driver/nvml.rs names them.
NVML_TYPES = {
    "nvmlDevice_t": "NvmlDevice",
    "nvmlMemory_t": "NvmlMemory",
    "nvmlMemory_v2_t": "NvmlMemoryV2",
    "nvmlPciInfo_t": "NvmlPciInfo",
    "nvmlProcessUtilizationSample_t": "ProcessUtilizationSample",
}
NVML_DECLARATION = re.compile(r"^nvmlReturn_t DECLDIR (\w+)\(([^;]*)\);", re.M)

TYPEDEF = re.compile(r"\(CUDAAPI \*PFN_(\w+)\)\s*\(([^;]*)\);")
ENUM = re.compile(r"typedef\s+enum\s+\w*\s*\{[^}]*\}\s*(\w+)\s*;", re.S)
ALIAS = re.compile(r"^\s*typedef\s+(?:enum\s+|struct\s+)?([\w ]+?)\s+(\w+)\s*;", re.M)

# C scalar types and their Rust spelling.
SCALAR = {
    "void": "c_void",
    "char": "c_char",
    "int": "c_int",
    "unsigned int": "c_uint",
    "unsigned long long": "c_ulonglong",
    "size_t": "usize",
    "float": "f32",
}
FFI_NAMES = {"c_void", "c_char", "c_int", "c_uint", "c_ulonglong"}
RUST_KEYWORDS = {"fn", "type", "ref", "mod", "move", "match", "impl", "use", "in", "loop"}


class Types:
    """What cuda.h says about the type names a typedef's parameters use."""

    def __init__(self, cuda_h):
        self.enums = set(ENUM.findall(cuda_h))
        self.alias = {}  # name -> the type it is defined as
        for target, name in ALIAS.findall(cuda_h):
            self.alias.setdefault(name, target.strip())
        # `typedef X_v2 X;`: the plain name of a versioned one.
        self.plain = {}
        for name, target in self.alias.items():
            if re.fullmatch(re.escape(name) + r"_v\d+", target):
                self.plain.setdefault(target, name)

    def is_enum(self, name):
        seen = set()
        while name not in seen:
            seen.add(name)
            if name in self.enums or name.endswith("_enum"):
                return True
            name = self.alias.get(name, "")
        return False

    def rust(self, name):
        """Rust spelling of a C type name (no pointers)."""
        if name in SCALAR:
            return SCALAR[name]
        if self.is_enum(name):
            return "c_uint"
        if name in self.plain:
            return self.plain[name]
        if re.search(r"_v\d+$", name) and self.alias.get(name) in SCALAR:
            return SCALAR[self.alias[name]]
        return name


def param(text, types, index):
    """(name, Rust type) of one C parameter."""
    text = text.strip()
    words = text.replace("*", " * ").split()
    depth = words.count("*")
    const_pointee = depth > 0 and "const" in words[: words.index("*")]
    words = [w for w in words if w not in ("*", "const")]
    name = f"arg{index}"
    if len(words) > 1 and words[-1] not in ("int", "long", "char"):
        name = words.pop()
    if name in RUST_KEYWORDS:
        name += "_"
    ty = types.rust(" ".join(words))
    for level in range(depth):
        ty = ("*const " if const_pointee and level == 0 else "*mut ") + ty
    return name, ty


def hooked_names():
    text = open(ROWS, encoding="utf-8").read()
    row = re.compile(r"=>\s*fn\s+(\w+)\s*(?:/\s*(\w+))?\s*\(", re.S)
    for name, ptsz in row.findall(text):
        yield name
        if ptsz:
            yield ptsz


def signature(params, types, used):
    """The Rust parameter list of a C one; adds the Rust types it names to `used`."""
    args = [
        param(p, types, i)
        for i, p in enumerate(params.split(","))
        if p.strip() and p.strip() != "void"
    ]
    for _, ty in args:
        used.add(ty.split()[-1])
    return ", ".join(f"{n}: {t}" for n, t in args)


def render(functions, types, typedef_of, params_of):
    used = set()
    lines = []
    for name in functions:
        pfn = typedef_of[name]
        sig = signature(params_of[pfn], types, used)
        lines.append(f"/// `PFN_{pfn}` of cudaTypedefs.h.\n")
        lines.append(f'pub type PFN_{name} = unsafe extern "C" fn({sig}) -> CUresult;\n')
    ffi = sorted(u for u in used if u in FFI_NAMES)
    sys_types = sorted(u for u in used if u not in FFI_NAMES and u not in ("usize", "f32"))
    out = [
        "// Generated by scripts/gen-driver-types.py from NVIDIA's cudaTypedefs.h and\n",
        "// cuda.h (CUDA 12.9, then 13.2) and the rows of table/rows.rs: do not edit,\n",
        "// rerun the generator.\n",
        "\n",
        "//! The C type of every real driver function the interposer hooks or calls\n",
        "//! (`PFN_<ABI name>`, from its typedef in cudaTypedefs.h), and [`RealDriver`],\n",
        "//! the one table of their real addresses ([`REAL`]).\n",
        "\n",
        "#![allow(non_camel_case_types, non_snake_case)]\n",
        "\n",
        f"use core::ffi::{{CStr, {', '.join(ffi)}}};\n",
        "\n",
        "use dilu_abi::cuda::CUresult;\n",
        f"use dilu_abi::cuda::sys::{{{', '.join(sys_types)}}};\n",
        "\n",
        "use super::real::RealFn;\n",
        "\n",
    ]
    out += lines
    out.append("\n/// The real driver's function for every ABI name above (unresolved until\n")
    out.append("/// `crate::driver` loads the driver).\n")
    out.append("pub struct RealDriver {\n")
    out += [f"    pub {n}: RealFn<PFN_{n}>,\n" for n in functions]
    out.append("}\n\n/// The real driver's functions.\n")
    out.append("pub static REAL: RealDriver = RealDriver {\n")
    out += [f"    {n}: RealFn::new(),\n" for n in functions]
    out.append("};\n\nimpl RealDriver {\n")
    out.append("    /// Resolves every function with `lookup` (its C name to its address, 0 if\n")
    out.append("    /// absent); returns how many were found.\n")
    out.append("    ///\n    /// # Safety\n")
    out.append("    /// `lookup` returns the real driver's function of exactly that name (or 0).\n")
    out.append("    pub unsafe fn resolve(&self, mut lookup: impl FnMut(&CStr) -> usize) -> usize {\n")
    out.append("        // SAFETY: each field gets what `lookup` gives for its own name, which\n")
    out.append("        // the caller promises is that function, of the field's type.\n")
    out.append("        unsafe {\n            [\n")
    out += [f'                self.{n}.set(lookup(c"{n}")),\n' for n in functions]
    out.append("            ]\n            .into_iter()\n            .filter(|&found| found)\n            .count()\n        }\n    }\n}\n")
    return rustfmt("".join(out))


class NvmlTypes:
    """NVML's type names as driver/nvml.rs spells them, then C scalars."""

    def rust(self, name):
        if name in NVML_TYPES:
            return NVML_TYPES[name]
        if name in SCALAR:
            return SCALAR[name]
        sys.exit(f"gen-driver-types: no Rust type for nvml.h's `{name}` (add it to NVML_TYPES)")


def render_nvml(nvml_h):
    declared = dict(NVML_DECLARATION.findall(nvml_h))
    missing = [f for f in NVML if f not in declared]
    if missing:
        sys.exit(f"gen-driver-types: nvml.h does not declare {', '.join(missing)}")
    types, used, lines = NvmlTypes(), set(), []
    for name in NVML:
        sig = signature(declared[name], types, used)
        lines.append(f"/// `{name}` of nvml.h.\n")
        lines.append(f'pub type PFN_{name} = unsafe extern "C" fn({sig}) -> NvmlReturn;\n')
    ffi = sorted(u for u in used if u in FFI_NAMES)
    ours = sorted(u for u in used if u in NVML_TYPES.values())
    out = [
        "// Generated by scripts/gen-driver-types.py from NVIDIA's nvml.h (CUDA 12.9):\n",
        "// do not edit, rerun the generator.\n",
        "\n",
        "//! The C type of every NVML function the interposer calls or hooks\n",
        "//! (`PFN_<name>`, from its declaration in nvml.h), for `RealNvml`.\n",
        "\n",
        "#![allow(non_camel_case_types, non_snake_case)]\n",
        "\n",
    ]
    if ffi:
        out.append(f"use core::ffi::{{{', '.join(ffi)}}};\n\n")
    out.append(f"use super::nvml_types::{{{', '.join(['NvmlReturn', *ours])}}};\n\n")
    return rustfmt("".join(out + lines))


def rustfmt(text):
    """The text as `cargo fmt` leaves it, so that it stays what --check expects."""
    done = subprocess.run(
        ["rustfmt", "--edition", "2024", "--emit", "stdout"],
        input=text, capture_output=True, text=True, check=True,
    )
    return done.stdout


def main():
    args, base, includes = gen.command_line("gen-driver-types", __doc__)
    _, table = gen.rows(includes)
    params_of, cuda_h = {}, ""
    for include in includes:
        for header in gen.HEADERS:
            with open(os.path.join(include, header), encoding="utf-8") as f:
                for pfn, params in TYPEDEF.findall(f.read()):
                    params_of.setdefault(pfn, params)
        with open(os.path.join(include, "cuda.h"), encoding="utf-8") as f:
            cuda_h += f.read() + "\n"
    typedef_of = {}
    for b, variants in table.items():
        for since, symbol, per_thread in variants:
            typedef_of.setdefault(symbol, f"{b}_v{since}")
            if per_thread:
                pt_since, pt_symbol = per_thread
                typedef_of.setdefault(pt_symbol, f"{b}_v{pt_since}_{pt_symbol.rsplit('_', 1)[1]}")
    functions = list(dict.fromkeys([*hooked_names(), *CALLED]))
    missing = [f for f in functions if typedef_of.get(f) not in params_of]
    if missing:
        sys.exit(f"gen-driver-types: no typedef in the headers for {', '.join(missing)}")
    nvml_h = os.path.join(base, "nvidia", "nvml_dev", "include", "nvml.h")
    if not os.path.exists(nvml_h):
        sys.exit(f"gen-driver-types: no {nvml_h} (run scripts/install-cudart.sh)")
    with open(nvml_h, encoding="utf-8") as f:
        nvml_text = render_nvml(f.read())
    outputs = [
        (OUT, render(functions, Types(cuda_h), typedef_of, params_of), len(functions)),
        (OUT_NVML, nvml_text, len(NVML)),
    ]
    for out, text, count in outputs:
        gen.write_or_check("gen-driver-types", out, text, args.check, f"{count} functions")


if __name__ == "__main__":
    main()
