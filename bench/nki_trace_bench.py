"""Tracing overhead of tern.nki: trace + simulate, timing only, an
NKI kernel of about 10^4 instructions; goal < 1 s on the development machine.

    PYTHONPATH=build/python /usr/bin/python3 bench/nki_trace_bench.py
"""
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples", "nki"))

import matmul  # noqa: E402

import tern.nki as nki  # noqa: E402
import tern.nki.language as nl  # noqa: E402


def main():
    m, k, n = 2048, 8192, 2048
    runs = []
    for _ in range(3):
        t0 = time.perf_counter()
        s = nki.benchmark(matmul.matmul_optimized, platform_target="trn3")(nki.spec((k, m), nl.bfloat16),
                                                                            nki.spec((k, n), nl.bfloat16))
        runs.append(time.perf_counter() - t0)
    best = min(runs)
    print(f"matmul_optimized [{m},{k}] x [{k},{n}] bf16: {s['instructions']} instructions traced and simulated "
          f"(timing only) in {best:.3f} s (best of 3; goal < 1 s), {s['instructions'] / best:.0f} instructions/s")


if __name__ == "__main__":
    main()
