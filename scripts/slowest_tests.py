"""The slowest tests of the last ctest run (build/Testing/Temporary/LastTest.log).

    /usr/bin/python3 scripts/slowest_tests.py [BUILD_DIR] [COUNT]
"""
import re
import sys

build = sys.argv[1] if len(sys.argv) > 1 else "build"
count = int(sys.argv[2]) if len(sys.argv) > 2 else 10
log = open(f"{build}/Testing/Temporary/LastTest.log", errors="replace").read()
names = re.findall(r"^\d+/\d+ Test: (\S+)", log, re.M)
times = [float(t) for t in re.findall(r"^Test time =\s*([\d.]+) sec", log, re.M)]
runs = sorted(zip(times, names), reverse=True)
print(f"slowest {min(count, len(runs))} of {len(runs)} tests ({sum(times):.0f} s in all):")
for t, n in runs[:count]:
    print(f"  {t:7.1f} s  {n}")
