"""PyTorch check run by scripts/gpu-check.sh, directly and under `dilu run`.

Prints one JSON line: the device, what torch.cuda.mem_get_info() reports,
whether an allocation of --alloc-gib succeeds, and the rate of a matmul loop.
"""
import argparse
import json
import time

import torch


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--alloc-gib", type=float, default=1.0)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--size", type=int, default=4096)
    args = parser.parse_args()

    device = torch.device("cuda:0")
    free, total = torch.cuda.mem_get_info(device)
    result = {"device": torch.cuda.get_device_name(device), "mem_free": free, "mem_total": total}
    try:
        block = torch.empty(int(args.alloc_gib * (1 << 30)), dtype=torch.uint8, device=device)
        result["alloc_ok"] = True
        del block
    except torch.OutOfMemoryError as error:
        result["alloc_ok"] = False
        result["alloc_error"] = str(error).splitlines()[0]
    torch.cuda.empty_cache()

    a = torch.randn(args.size, args.size, device=device)
    b = torch.randn(args.size, args.size, device=device)
    torch.cuda.synchronize()
    iterations = 0
    started = time.perf_counter()
    while time.perf_counter() - started < args.seconds:
        for _ in range(10):
            a = torch.matmul(a, b) * 1e-3
        torch.cuda.synchronize()
        iterations += 10
    elapsed = time.perf_counter() - started
    result["matmul_per_second"] = iterations / elapsed
    print(json.dumps(result))


if __name__ == "__main__":
    main()
