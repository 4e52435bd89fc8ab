"""PyTorch on simgpu, step by step (run by scripts/torch-sim-check.sh under
`dilu run --sim`). Every step is tried even when an earlier one failed; each
prints one JSON line {"step", "ok", "detail"}.

    python torch_sim_check.py checks BUDGET_BYTES   the functional steps
    python torch_sim_check.py loop SECONDS          elementwise kernels in a loop

simgpu computes no kernel results, so only what does not depend on them is
checked (copies, memory, errors, launches, timing).
"""

import json
import sys
import time
import traceback


def report(step, ok, detail=""):
    print(json.dumps({"step": step, "ok": bool(ok), "detail": str(detail)}), flush=True)


def attempt(step, fn):
    try:
        ok, detail = fn()
    except BaseException as e:  # noqa: BLE001 - every failure is reported
        ok, detail = False, f"{type(e).__name__}: {e}".strip()
        tb = traceback.format_exc().strip().splitlines()
        if tb:
            detail += f" (at {tb[-3].strip() if len(tb) > 2 else tb[-1]})"
    report(step, ok, detail)
    return ok


def checks(budget):
    import torch

    report("versions", True, f"torch {torch.__version__}, built for CUDA {torch.version.cuda}")
    attempt("torch.cuda.is_available", lambda: (torch.cuda.is_available(), torch.cuda.device_count()))

    def props():
        p = torch.cuda.get_device_properties(0)
        return True, f"{p.name}, {p.total_memory} B, {p.multi_processor_count} SMs, cc {p.major}.{p.minor}"

    attempt("device properties", props)

    def round_trip():
        host = torch.arange(1 << 20, dtype=torch.float32)
        dev = host.to("cuda")
        back = dev.cpu()
        same = torch.equal(host, back)
        del dev
        return same, f"{host.numel()} floats host->device->host, equal={same}"

    attempt("tensor copy round trip", round_trip)

    def create_free():
        ts = [torch.empty(1 << 24, device="cuda") for _ in range(4)]
        used = torch.cuda.memory_allocated()
        del ts
        torch.cuda.empty_cache()
        left = torch.cuda.memory_allocated()
        return used >= 4 * (1 << 26) and left == 0, f"allocated {used} B, after free {left} B"

    attempt("tensors created and freed", create_free)

    def mem_info():
        free, total = torch.cuda.mem_get_info()
        return total == budget, f"free {free} B, total {total} B, --mem budget {budget} B"

    attempt("torch.cuda.mem_get_info shows the --mem budget", mem_info)

    def oom():
        try:
            torch.empty(budget + (1 << 30), dtype=torch.uint8, device="cuda")
        except torch.cuda.OutOfMemoryError as e:
            first = str(e).splitlines()[0]
            after = torch.empty(1 << 20, device="cuda")
            del after
            return True, f"OutOfMemoryError ({first[:120]}), then a 4 MiB tensor allocated fine"
        return False, "no error past the budget"

    attempt("allocation past the budget raises OutOfMemoryError", oom)

    def elementwise():
        x = torch.empty(1 << 20, device="cuda")
        for _ in range(100):
            x = x * 2 + 1
        torch.cuda.synchronize()
        return True, "100 x (mul, add) on 1M floats, synchronised"

    attempt("elementwise kernels", elementwise)

    def heuristic():
        # The smallest reproducer of the old failure: cuBLASLt alone (the
        # library PyTorch loads), asked for algorithms for a float32 GEMM.
        import ctypes
        import os
        import nvidia

        lib_dir = next(os.path.join(p, "cu13", "lib") for p in nvidia.__path__)
        lt = ctypes.CDLL(os.path.join(lib_dir, "libcublasLt.so.13"))
        handle, desc, pref = ctypes.c_void_p(), ctypes.c_void_p(), ctypes.c_void_p()
        layouts = [ctypes.c_void_p() for _ in range(4)]
        assert lt.cublasLtCreate(ctypes.byref(handle)) == 0
        # CUBLAS_COMPUTE_32F = 68, CUDA_R_32F = 0
        assert lt.cublasLtMatmulDescCreate(ctypes.byref(desc), 68, 0) == 0
        for layout in layouts:
            n = ctypes.c_uint64(256)
            assert lt.cublasLtMatrixLayoutCreate(ctypes.byref(layout), 0, n, n, ctypes.c_int64(256)) == 0
        assert lt.cublasLtMatmulPreferenceCreate(ctypes.byref(pref)) == 0
        results = ctypes.create_string_buffer(96 * 8)  # 8 cublasLtMatmulHeuristicResult_t
        count = ctypes.c_int()
        status = lt.cublasLtMatmulAlgoGetHeuristic(
            handle, desc, *layouts, pref, 8, results, ctypes.byref(count))
        lt.cublasLtDestroy(handle)
        return status == 0 and count.value > 0, (
            f"cublasLtMatmulAlgoGetHeuristic (256^3 float32) -> status {status}, {count.value} algorithms")

    attempt("cuBLASLt heuristic query (ctypes)", heuristic)

    def matmul():
        a = torch.empty(512, 512, device="cuda")
        b = torch.empty(512, 512, device="cuda")
        c = a @ b
        torch.cuda.synchronize()
        return True, f"512x512 float32 matmul, result shape {tuple(c.shape)}"

    attempt("cuBLAS matmul", matmul)

    def half_matmul():
        a = torch.empty(512, 256, device="cuda", dtype=torch.float16)
        b = torch.empty(256, 128, device="cuda", dtype=torch.float16)
        c = a @ b
        torch.cuda.synchronize()
        return True, f"512x256 @ 256x128 float16 matmul, result shape {tuple(c.shape)}"

    attempt("cuBLAS half-precision matmul", half_matmul)

    def linear_backward():
        layer = torch.nn.Linear(256, 64).cuda()
        x = torch.empty(32, 256, device="cuda", requires_grad=True)
        layer(x).relu().sum().backward()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            y = layer(x)
        torch.cuda.synchronize()
        return True, (
            f"nn.Linear(256, 64) forward and backward (weight grad {tuple(layer.weight.grad.shape)}), "
            f"then a bfloat16 autocast forward ({y.dtype})"
        )

    attempt("nn.Linear forward, backward and bfloat16 autocast", linear_backward)
    attempt("torch.multiprocessing shares a CUDA tensor, charged once", share_with_child)


def shared_tensor_child(inbox, outbox):
    """The other process of share_with_child: receives the tensor (CUDA IPC
    handles for its memory and its event) and says what it sees."""
    import torch

    free_before, _ = torch.cuda.mem_get_info()
    t = inbox.get()
    free, _ = torch.cuda.mem_get_info()
    outbox.put({"shape": list(t.shape), "free_before": free_before, "free": free})
    del t
    inbox.get()


def share_with_child():
    """A 256 MiB tensor sent to a spawned process: the child maps it without
    being charged (its free memory is what it was before it received the
    tensor), and the parent's charge does not change by sharing."""
    import torch
    import torch.multiprocessing as mp

    ctx = mp.get_context("spawn")
    x = torch.empty(64 << 20, device="cuda")  # 256 MiB of float32
    torch.cuda.synchronize()
    free_allocated, _ = torch.cuda.mem_get_info()
    inbox, outbox = ctx.Queue(), ctx.Queue()
    child = ctx.Process(target=shared_tensor_child, args=(inbox, outbox))
    child.start()
    inbox.put(x)
    seen = outbox.get(timeout=300)
    free_shared, _ = torch.cuda.mem_get_info()
    inbox.put("done")
    child.join(timeout=120)
    ok = (
        seen["shape"] == [64 << 20]
        and seen["free"] == seen["free_before"]
        and free_shared == free_allocated
        and child.exitcode == 0
    )
    mib = lambda b: f"{b / (1 << 20):.0f} MiB"
    return ok, (
        f"child saw shape {seen['shape']} with {mib(seen['free'])} free "
        f"({mib(seen['free_before'])} before); parent {mib(free_allocated)} free after allocating, "
        f"{mib(free_shared)} after sharing; child exit {child.exitcode}"
    )


def loop(seconds):
    import torch

    x = torch.empty(1 << 22, device="cuda")
    n = 0
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        for _ in range(20):
            x.mul_(1.0001)
            n += 1
        torch.cuda.synchronize()
    report("elementwise loop", True, f"{n} kernels in {seconds} s")


if __name__ == "__main__":
    if sys.argv[1] == "checks":
        checks(int(sys.argv[2]))
    else:
        loop(float(sys.argv[2]))
