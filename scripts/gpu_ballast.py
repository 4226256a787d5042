"""Holds GPU memory so that a larger GPU looks like a smaller one to the test suite: with --as-gib 80 on a 141 GB
H200, the other processes have what an 80 GB H100 leaves them. For checking the suite's memory plan (tests/conftest.py,
gpu_memory) on whatever GPU is lent. Runs until killed.

Usage: python3 scripts/gpu_ballast.py --as-gib 80 &
"""

import argparse
import time

import torch


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--as-gib", type=float, required=True, help="the device size to leave to others, in GiB")
    a = p.parse_args()
    total = torch.cuda.get_device_properties(0).total_memory
    hold = total - int(a.as_gib * (1 << 30))
    if hold <= 0:
        print(f"gpu_ballast: the device has {total / (1 << 30):.1f} GiB, nothing to hold", flush=True)
        return
    ballast = torch.empty(hold, dtype=torch.uint8, device="cuda")
    print(f"gpu_ballast: holding {hold / (1 << 30):.1f} GiB of {total / (1 << 30):.1f}", flush=True)
    while ballast.numel():  # the tensor stays referenced, and held, until the process is killed
        time.sleep(60)


if __name__ == "__main__":
    main()
