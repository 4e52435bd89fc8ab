"""Memory that LLM servers give back, under `dilu run --sim --mem` (run by
scripts/llm-bench.sh after its rows; prints a Markdown section).

    python llm_memory_check.py sleep --dilu BIN --python PY --driver-dir DIR --model DIR
        vLLM's sleep mode (`--enable-sleep-mode`, its dev endpoints /sleep,
        /is_sleeping, /wake_up): the server and a second process share one
        tenant's budget; what the server releases when it sleeps must be
        allocatable by the other process, and the server must wake within
        the budget and answer again.

    python llm_memory_check.py expandable --dilu BIN --python PY --driver-dir DIR
        PyTorch's expandable segments (PYTORCH_CUDA_ALLOC_CONF=
        expandable_segments:True, which maps memory with cuMemCreate and
        cuMemMap) under --mem: the budget holds, and what the allocator
        releases returns to it.

    python llm_memory_check.py expandable-inside BUDGET_BYTES
        (the part that runs under dilu run; prints JSON lines)
"""

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request

GIB = 1 << 30
PORT = 18912


def row(results, ok, check):
    results.append((ok, check))


def nvml_used(args, env):
    """Device memory each process holds on the simulated GPU, from simgpu's
    NVML read by a process outside dilu: {pid: bytes}."""
    code = ("import json, pynvml\n"
            "pynvml.nvmlInit(); h = pynvml.nvmlDeviceGetHandleByIndex(0)\n"
            "print(json.dumps({p.pid: p.usedGpuMemory for p in pynvml.nvmlDeviceGetComputeRunningProcesses(h)}))\n")
    out = subprocess.run([args.python, "-c", code], env=dict(env, LD_LIBRARY_PATH=args.driver_dir),
                         capture_output=True, text=True, timeout=120)
    if out.returncode != 0:
        raise RuntimeError(f"NVML query failed: {out.stderr.strip()[-300:]}")
    return {int(k): v for k, v in json.loads(out.stdout).items()}


def http(method, path, body=None, timeout=120):
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(f"http://127.0.0.1:{PORT}{path}", data=data, method=method,
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=timeout) as response:
        return response.status, response.read().decode()


def allocate_once(args, env, tenant, budget, nbytes):
    """A second process of the tenant allocates nbytes with PyTorch: 'ok' or the error's first line."""
    code = (f"import torch\n"
            f"try:\n"
            f"    x = torch.empty({nbytes}, dtype=torch.uint8, device='cuda'); torch.cuda.synchronize(); print('ok')\n"
            f"except torch.OutOfMemoryError as e:\n"
            f"    print('OutOfMemoryError: ' + str(e).splitlines()[0][:160])\n")
    out = subprocess.run([args.dilu, "run", "--sim", "--tenant", tenant, "--mem", budget, "--",
                          args.python, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    return (out.stdout.strip().splitlines() or [f"exit {out.returncode}: {out.stderr.strip()[-200:]}"])[-1]


def sleep_check(args):
    results = []
    instance = f"llm-sleep-{os.getpid()}"
    tenant = f"llm-sleep-{os.getpid()}"
    budget, budget_bytes = "8GiB", 8 * GIB
    env = dict(os.environ, SIMGPU_INSTANCE=instance, VLLM_SERVER_DEV_MODE="1",
               VLLM_USE_FLASHINFER_SAMPLER="0", VLLM_USE_V2_MODEL_RUNNER="0")
    for name in ("DILU_MEM_LIMIT", "DILU_SM_LIMIT", "DILU_TENANT", "CUDA_VISIBLE_DEVICES", "DILU_NODEMGR_SOCKET"):
        env.pop(name, None)
    log = tempfile.NamedTemporaryFile("w", prefix="dilu-llm-sleep-", suffix=".log", delete=False)
    server = subprocess.Popen(
        [args.dilu, "run", "--sim", "--tenant", tenant, "--mem", budget, "--",
         os.path.join(os.path.dirname(args.python), "vllm"), "serve", args.model, "--load-format", "dummy",
         "--skip-tokenizer-init", "--enforce-eager", "--enable-sleep-mode", "--gpu-memory-utilization", "0.6",
         "--max-model-len", "1024", "--port", str(PORT), "--host", "127.0.0.1"],
        env=env, stdout=log, stderr=log, stdin=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.monotonic() + 900
        while True:
            try:
                if http("GET", "/v1/models", timeout=5)[0] == 200:
                    break
            except OSError:
                pass
            if server.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the server did not start (see {log.name})")
            time.sleep(1)
        awake = sum(nvml_used(args, env).values())
        row(results, 0 < awake <= budget_bytes,
            f"awake, `--enable-sleep-mode`, utilisation 0.6 of `--mem {budget}`: NVML shows the server's "
            f"processes holding {awake / GIB:.2f} GiB (within the budget)")
        spare = budget_bytes - awake
        ask = spare + GIB
        refused = allocate_once(args, env, tenant, budget, ask)
        row(results, refused.startswith("OutOfMemoryError"),
            f"another process of the tenant asks {ask / GIB:.2f} GiB (1 GiB more than the budget has left): {refused}")
        status, _ = http("POST", "/sleep?level=1")
        sleeping = http("GET", "/is_sleeping")[1]
        asleep = sum(nvml_used(args, env).values())
        row(results, status == 200 and "true" in sleeping and asleep < awake,
            f"`POST /sleep?level=1` (weights to host memory, KV cache dropped): HTTP {status}, is_sleeping {sleeping.strip()}; "
            f"NVML: {asleep / GIB:.2f} GiB held, {(awake - asleep) / GIB:.2f} GiB released")
        granted = allocate_once(args, env, tenant, budget, ask)
        row(results, granted == "ok",
            f"the same {ask / GIB:.2f} GiB asked again while the server sleeps: {granted} "
            f"(what the server released went back to the budget)")
        status, _ = http("POST", "/wake_up")
        woken = sum(nvml_used(args, env).values())
        row(results, status == 200 and 0 < woken <= budget_bytes,
            f"`POST /wake_up`: HTTP {status}; NVML: {woken / GIB:.2f} GiB held (within the budget; {awake / GIB:.2f} before the sleep)")
        status, body = http("POST", "/v1/completions", {"model": args.model, "prompt": list(range(3, 40)),
                                                        "max_tokens": 16, "min_tokens": 16, "ignore_eos": True})
        tokens = json.loads(body)["usage"]["completion_tokens"] if status == 200 else 0
        row(results, status == 200 and tokens == 16, f"a completion after waking: HTTP {status}, {tokens} tokens")
    except Exception as e:  # noqa: BLE001 - the table says what failed
        row(results, False, f"stopped: {type(e).__name__}: {e}")
    finally:
        if server.poll() is None:
            os.killpg(server.pid, signal.SIGINT)
            try:
                server.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(server.pid, signal.SIGKILL)
                server.wait()
    exited = server.returncode
    row(results, exited == 0, f"the server exits at Ctrl-C: status {exited}")
    return results


def expandable_inside(budget):
    """Under dilu run --mem: fill the budget in 256 MiB tensors, release, fill again."""
    import torch

    chunk = 256 << 20

    def fill():
        held = []
        try:
            while True:
                held.append(torch.empty(chunk, dtype=torch.uint8, device="cuda"))
        except torch.OutOfMemoryError:
            pass
        return held

    first = fill()
    free, total = torch.cuda.mem_get_info()
    print(json.dumps({"step": "filled", "bytes": len(first) * chunk, "total": total, "free": free,
                      "reserved": torch.cuda.memory_reserved()}), flush=True)
    del first
    torch.cuda.empty_cache()
    free, total = torch.cuda.mem_get_info()
    print(json.dumps({"step": "released", "free": free, "total": total,
                      "reserved": torch.cuda.memory_reserved()}), flush=True)
    second = fill()
    print(json.dumps({"step": "refilled", "bytes": len(second) * chunk}), flush=True)


def expandable_check(args):
    results = []
    budget, budget_bytes = "2GiB", 2 * GIB
    env = dict(os.environ, SIMGPU_INSTANCE=f"llm-expandable-{os.getpid()}",
               PYTORCH_CUDA_ALLOC_CONF="expandable_segments:True")
    for name in ("DILU_MEM_LIMIT", "DILU_SM_LIMIT", "DILU_TENANT", "CUDA_VISIBLE_DEVICES", "DILU_NODEMGR_SOCKET"):
        env.pop(name, None)
    out = subprocess.run([args.dilu, "run", "--sim", "--mem", budget, "--", args.python,
                          os.path.abspath(__file__), "expandable-inside", str(budget_bytes)],
                         env=env, capture_output=True, text=True, timeout=600)
    steps = {}
    for line in out.stdout.splitlines():
        if line.startswith("{"):
            step = json.loads(line)
            steps[step["step"]] = step
    if set(steps) != {"filled", "released", "refilled"}:
        row(results, False, f"expandable segments: exit {out.returncode}: {out.stderr.strip()[-300:]}")
        return results
    filled, released, refilled = steps["filled"], steps["released"], steps["refilled"]
    row(results, filled["total"] == budget_bytes and budget_bytes - 512 * (1 << 20) <= filled["bytes"] <= budget_bytes,
        f"`PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True` under `--mem {budget}`: 256 MiB tensors until "
        f"`torch.OutOfMemoryError`: {filled['bytes'] / GIB:.2f} GiB held; `mem_get_info` total "
        f"{filled['total'] / GIB:.2f} GiB, free {filled['free'] / GIB:.2f} GiB")
    row(results, released["reserved"] == 0 and released["free"] >= budget_bytes - 512 * (1 << 20),
        f"after `del` and `torch.cuda.empty_cache()` (segments unmapped, `cuMemRelease`): reserved "
        f"{released['reserved']} B, `mem_get_info` free {released['free'] / GIB:.2f} GiB of the budget")
    row(results, refilled["bytes"] == filled["bytes"],
        f"filled again: {refilled['bytes'] / GIB:.2f} GiB (all of it came back)")
    row(results, out.returncode == 0, f"exit status {out.returncode}")
    return results


def markdown(title, results):
    lines = [f"### {title}", "", "| result | check |", "|---|---|"]
    lines += [f"| {'pass' if ok else 'FAIL'} | {check} |" for ok, check in results]
    return "\n".join(lines) + "\n"


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("what", choices=["sleep", "expandable", "expandable-inside"])
    parser.add_argument("budget", nargs="?", type=int)
    parser.add_argument("--dilu")
    parser.add_argument("--python", default=sys.executable)
    parser.add_argument("--driver-dir")
    parser.add_argument("--model")
    args = parser.parse_args()
    if args.what == "expandable-inside":
        expandable_inside(args.budget)
        return
    if args.what == "sleep":
        results = sleep_check(args)
        print(markdown("vLLM's sleep mode under `--mem`", results))
    else:
        results = expandable_check(args)
        print(markdown("PyTorch's expandable segments under `--mem`", results))
    sys.exit(0 if all(ok for ok, _ in results) else 1)


if __name__ == "__main__":
    main()
