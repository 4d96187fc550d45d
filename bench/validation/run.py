"""Kernel validation: tern's simulated latency of each published NKI kernel
measurement (measurements.toml) on the chip it was measured on, the error,
and the mean absolute error over the scored rows.

    PYTHONPATH=build/python /usr/bin/python3 bench/validation/run.py [--markdown] [--json]
        [--max-mae PCT] [--max-row PCT] [--only KERNEL,...]

Timing only (no data). Exits non-zero when a bound given is exceeded.
"""
import argparse
import json
import math
import os
import sys
import tomllib

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "kernels"))

import tern.nki as tn  # noqa: E402

tn.install()

import neuronxcc.nki as nki  # noqa: E402

import layernorm  # noqa: E402
import mamba  # noqa: E402
import scalar_chain  # noqa: E402

F32 = "float32"


def mamba_args(channels, seq_len, batch=1, state=16):
    shape = (batch, channels, seq_len)
    return (tn.spec(shape, F32), tn.spec(shape, F32), tn.spec((channels, state), F32),
            tn.spec((batch, state, seq_len), F32), tn.spec((batch, state, seq_len), F32))


def latency_us(kernel, chip, args):
    return nki.benchmark(kernel, platform_target=chip)(*args)["latency_us"]


def predict(row):
    """tern's latency in us for one measurement row (seq_len a number)."""
    k, chip = row["kernel"], row["chip"]
    if k.startswith("mamba_"):
        return latency_us(getattr(mamba, k), chip, mamba_args(row["channels"], row["seq_len"]))
    if k.startswith("layernorm_"):
        r, c = row["rows"], row["cols"]
        args = (tn.spec((r, c), F32), 1e-5, tn.spec((c,), F32), tn.spec((c,), F32))
        return latency_us(getattr(layernorm, k), chip, args)
    if k == "scalar_chain":
        x = tn.spec((128, 1), F32)
        t = [latency_us(scalar_chain.scalar_chain, chip, (x, n)) for n in (64, 128)]
        return (t[1] - t[0]) / 64
    raise SystemExit(f"measurements.toml: unknown kernel {k!r}")


def expand(rows):
    """One entry per measurement: list-valued seq_len / measured_us pair up."""
    for r in rows:
        if isinstance(r.get("measured_us"), list):
            if len(r["seq_len"]) != len(r["measured_us"]):
                raise SystemExit(f"measurements.toml: {r['kernel']}: seq_len and measured_us "
                                 "differ in length")
            for s, m in zip(r["seq_len"], r["measured_us"]):
                yield dict(r, seq_len=s, measured_us=m)
        else:
            yield r


def config(r):
    keys = [k for k in ("channels", "seq_len", "rows", "cols") if k in r]
    return ", ".join(f"{k} {r[k]}" for k in keys) or "-"


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--markdown", action="store_true")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--max-mae", type=float)
    ap.add_argument("--max-row", type=float)
    ap.add_argument("--only", help="comma-separated kernel names")
    a = ap.parse_args(argv)
    with open(os.path.join(HERE, "measurements.toml"), "rb") as f:
        rows = list(expand(tomllib.load(f)["row"]))
    if a.only:
        rows = [r for r in rows if r["kernel"] in a.only.split(",")]
    out = []
    for r in rows:
        entry = dict(source=r["source"], chip=r["chip"], kernel=r["kernel"], config=config(r),
                     measured_us=r["measured_us"], scored=r.get("scored", True))
        try:
            p = predict(r)
            entry.update(predicted_us=p, error_percent=(p - r["measured_us"]) / r["measured_us"]
                         * 100)
        except RuntimeError as e:  # tern refused the kernel: shown, not scored
            entry.update(predicted_us=None, error_percent=None, scored=False,
                         note=str(e).splitlines()[-1])
        if os.isatty(2):
            print(f"\r{len(out) + 1}/{len(rows)} {entry['kernel']} {entry['config']}",
                  end="", file=sys.stderr, flush=True)
        out.append(entry)
    if os.isatty(2):
        print(file=sys.stderr)
    scored = [e for e in out if e["scored"]]
    errs = [abs(e["error_percent"]) for e in scored]
    mae = sum(errs) / len(errs) if errs else math.nan
    worst = max(errs) if errs else math.nan
    chips = sorted({e["chip"] for e in scored})
    if a.json:
        print(json.dumps(dict(rows=out, mean_absolute_error_percent=mae,
                              worst_row_percent=worst, chips=chips), indent=1))
    else:
        md = a.markdown
        print("| source | chip | kernel | configuration | measured (us) | tern (us) | error |"
              if md else f"{'source':13} {'chip':5} {'kernel':13} {'configuration':26} "
              f"{'measured us':>12} {'tern us':>10} {'error':>8}")
        if md:
            print("|---|---|---|---|---:|---:|---:|")
        for e in out:
            p = "-" if e["predicted_us"] is None else f"{e['predicted_us']:.4g}"
            err = "-" if e["error_percent"] is None else f"{e['error_percent']:+.1f} %"
            if not e["scored"]:
                err += " (not scored)"
            cells = [e["source"], e["chip"], e["kernel"], e["config"],
                     f"{e['measured_us']:.4g}", p, err]
            print("| " + " | ".join(cells) + " |" if md else
                  f"{cells[0]:13} {cells[1]:5} {cells[2]:13} {cells[3]:26} {cells[4]:>12} "
                  f"{cells[5]:>10} {cells[6]:>8}")
        print(f"\nMean absolute error over {len(scored)} scored rows on {', '.join(chips)}: "
              f"{mae:.1f} %; worst row {worst:.1f} %")
    bad = []
    if a.max_mae is not None and not mae <= a.max_mae:
        bad.append(f"mean absolute error {mae:.1f} % exceeds --max-mae {a.max_mae}")
    if a.max_row is not None and not worst <= a.max_row:
        bad.append(f"worst row {worst:.1f} % exceeds --max-row {a.max_row}")
    for b in bad:
        print(f"run.py: {b}", file=sys.stderr)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
