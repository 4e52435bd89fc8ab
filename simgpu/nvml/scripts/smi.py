#!/usr/bin/env python3
"""An nvidia-smi-style report of every GPU through pynvml (nvidia-ml-py),
used to check simgpu's simulated NVML with a client no one here wrote.

Prints one `key=value` line per fact, so tests can read it:
  count=N
  gpu.I.name=... gpu.I.uuid=... gpu.I.bus_id=... gpu.I.total=... gpu.I.used=...
  gpu.I.free=... gpu.I.util=... gpu.I.by_uuid=I gpu.I.by_bus_id=I
  gpu.I.proc.PID=USED_BYTES       (nvmlDeviceGetComputeRunningProcesses)
  gpu.I.sm.PID=PERCENT            (nvmlDeviceGetProcessUtilization)
  gpu.I.temperature=not supported
Usage: smi.py [--sleep SECONDS]   (wait between nvmlInit and the queries)
"""
import sys
import time

import pynvml as nv


def text(v):
    return v.decode() if isinstance(v, bytes) else v


def main():
    pause = float(sys.argv[2]) if len(sys.argv) > 2 and sys.argv[1] == "--sleep" else 0.0
    nv.nvmlInit()
    if pause:
        time.sleep(pause)
    print(f"driver={text(nv.nvmlSystemGetDriverVersion())}")
    n = nv.nvmlDeviceGetCount()
    print(f"count={n}")
    for i in range(n):
        h = nv.nvmlDeviceGetHandleByIndex(i)
        uuid = text(nv.nvmlDeviceGetUUID(h))
        pci = nv.nvmlDeviceGetPciInfo(h)
        bus_id = text(pci.busId)
        mem = nv.nvmlDeviceGetMemoryInfo(h)
        util = nv.nvmlDeviceGetUtilizationRates(h)
        print(f"gpu.{i}.name={text(nv.nvmlDeviceGetName(h))}")
        print(f"gpu.{i}.uuid={uuid}")
        print(f"gpu.{i}.bus_id={bus_id}")
        print(f"gpu.{i}.total={mem.total}")
        print(f"gpu.{i}.used={mem.used}")
        print(f"gpu.{i}.free={mem.free}")
        print(f"gpu.{i}.util={util.gpu}")
        print(f"gpu.{i}.by_uuid={nv.nvmlDeviceGetIndex(nv.nvmlDeviceGetHandleByUUID(uuid))}")
        by_bus = nv.nvmlDeviceGetHandleByPciBusId(bus_id)
        print(f"gpu.{i}.by_bus_id={nv.nvmlDeviceGetIndex(by_bus)}")
        for p in nv.nvmlDeviceGetComputeRunningProcesses(h):
            print(f"gpu.{i}.proc.{p.pid}={p.usedGpuMemory}")
        try:
            for s in nv.nvmlDeviceGetProcessUtilization(h, 0):
                print(f"gpu.{i}.sm.{s.pid}={s.smUtil}")
        except nv.NVMLError_NotFound:
            pass  # no process ran kernels: NVML has no samples
        try:
            nv.nvmlDeviceGetTemperature(h, nv.NVML_TEMPERATURE_GPU)
            print(f"gpu.{i}.temperature=supported")
        except nv.NVMLError_NotSupported:
            print(f"gpu.{i}.temperature=not supported")
    nv.nvmlShutdown()


if __name__ == "__main__":
    main()
