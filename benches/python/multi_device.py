"""Costs of several pjrt devices in one process (RFC 0046), with four XLA CPU devices:
a copy of 4 Mi float32 (16 MiB) from one device to another, against the same copy through
host memory; and an all_reduce (sum) of 4 Mi float32 on each of 4 devices as one replicated
program, against staging through host memory (read each device's tensor, add on the host, write
the sum back to each device). Prints the median of each over 20 runs, in milliseconds.

    TORCH_PJRT_CLIENT_OPTIONS=cpu_device_count=4 python benches/python/multi_device.py
"""

import statistics
import time

import torch
import torch_pjrt
from torch_pjrt import comm

ELEMENTS = 4 * 1024 * 1024
RUNS = 20


def median_ms(step) -> float:
    step()  # compiles and warms up
    times = []
    for _ in range(RUNS):
        torch_pjrt.sync()
        start = time.perf_counter()
        step()
        torch_pjrt.sync()
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def main() -> None:
    assert torch.pjrt.device_count() >= 4, "set TORCH_PJRT_CLIENT_OPTIONS=cpu_device_count=4"
    xs = [torch.randn(ELEMENTS).to(f"pjrt:{d}") for d in range(4)]
    torch_pjrt.sync()

    def device_to_device():
        comm.buffer_device(xs[0].to("pjrt:1"))

    def through_host():
        comm.buffer_device(xs[0].cpu().to("pjrt:1"))

    def all_reduce():
        comm.all_reduce(xs)

    def host_staged():
        total = sum(x.cpu() for x in xs)
        for d in range(4):
            comm.buffer_device(total.to(f"pjrt:{d}"))

    print(f"copy of {ELEMENTS * 4 >> 20} MiB between devices")
    print(f"  device to device (PJRT CopyToDevice): {median_ms(device_to_device):.2f} ms")
    print(f"  through the host:                     {median_ms(through_host):.2f} ms")
    print(f"all_reduce (sum) of {ELEMENTS >> 20} Mi float32 across 4 devices")
    print(f"  one replicated program:               {median_ms(all_reduce):.2f} ms")
    print(f"  staged through the host:              {median_ms(host_staged):.2f} ms")
    m = torch_pjrt.metrics()
    print(f"  device_collectives={m['device_collectives']:.0f} "
          f"device_collective_compiles={m['device_collective_compiles']:.0f}")


if __name__ == "__main__":
    main()
