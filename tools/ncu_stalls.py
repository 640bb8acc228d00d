#!/usr/bin/env python3
"""Per kernel of a step: time, instructions and what its warps wait on.

    ncu --csv --clock-control none --graph-profiling node \\
        --metrics "$(python3 tools/ncu_stalls.py --metrics)" \\
        --launch-skip N --launch-count M PROGRAM > stalls.csv
    python3 tools/ncu_stalls.py stalls.csv[.gz]

Groups the profiled launches by kernel name (template arguments kept)
and prints, per kernel, the launches, the time they took (serialized by
ncu: read shares, not step time), instructions a launch and, for each
stall reason, the cycles an issued instruction waited on it, averaged
over the launches.  "no instruction" large next to the rest says the
kernel waits on instruction fetch (run H6: the router at 43% of its
samples, its code unrolled to 98.5 KB), "barrier" / "membar" on block or
cluster barriers and their fences, "long scoreboard" on global memory.
"""
import collections
import csv
import gzip
import sys

REASONS = ["no_instruction", "long_scoreboard", "wait", "short_scoreboard", "barrier", "membar"]
STALL = "smsp__average_warps_issue_stalled_%s_per_issue_active.ratio"
TIME, INST = "gpu__time_duration.sum", "smsp__inst_executed.sum"


def metrics():
    return ",".join([TIME, INST] + [STALL % r for r in REASONS])


def num(x):
    return float(x.replace(",", "")) if x not in ("", "n/a") else 0.0


def launches(path):
    """{launch id: (kernel, {metric: value})} in launch order."""
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt") as f:
        rows = list(csv.reader(f))
    head = next((r for r in rows if r and r[0] == "ID"), None)
    if head is None:
        sys.exit("%s: no ncu CSV header (a row starting with ID)" % path)
    col = {name: i for i, name in enumerate(head)}
    need = ("Kernel Name", "Metric Name", "Metric Value")
    if any(n not in col for n in need):
        sys.exit("%s: expected columns %s" % (path, ", ".join(need)))
    out = collections.OrderedDict()
    for r in rows:
        if len(r) != len(head) or r[0] == "ID":
            continue
        name = r[col["Kernel Name"]].split("(")[0].replace("void ", "")
        out.setdefault(r[0], (name, {}))[1][r[col["Metric Name"]]] = num(r[col["Metric Value"]])
    return out


def main(argv):
    if argv[1:] == ["--metrics"]:
        print(metrics())
        return 0
    if len(argv) != 2:
        print(__doc__.strip(), file=sys.stderr)
        return 2
    by = collections.OrderedDict()
    for name, m in launches(argv[1]).values():
        by.setdefault(name, []).append(m)
    if not by:
        sys.exit("%s: no profiled launches" % argv[1])
    total = sum(m.get(TIME, 0) for ms in by.values() for m in ms) / 1e3
    print("%d launches, %.1f us of kernel time (serialized)" %
          (sum(len(v) for v in by.values()), total))
    print("%-44s %4s %9s %11s  %s" % ("kernel", "n", "us", "inst/launch",
                                     "  ".join("%7s" % r[:7] for r in REASONS)))
    rows = []
    for name, ms in by.items():
        n = len(ms)
        rows.append((sum(m.get(TIME, 0) for m in ms) / 1e3, name, n,
                     sum(m.get(INST, 0) for m in ms) / n,
                     [sum(m.get(STALL % r, 0) for m in ms) / n for r in REASONS]))
    for us, name, n, inst, st in sorted(rows, key=lambda t: -t[0]):
        print("%-44s %4d %9.1f %11.0f  %s" % (name[:44], n, us, inst,
                                             "  ".join("%7.2f" % v for v in st)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
