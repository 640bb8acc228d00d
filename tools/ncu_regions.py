#!/usr/bin/env python3
"""Where a kernel's instructions and stalls go, from an ncu source export.

    ncu -o rep --set full --import-source no -k regex:NAME ... PROGRAM
    ncu --import rep.ncu-rep --page source --csv --print-source sass > src.csv
    python3 tools/ncu_regions.py src.csv[.gz] [MIN_SHARE]

For each profiled kernel in the export: executed warp instructions, the
stall reasons' shares of the warp samples, the opcode mix, and the SASS
regions -- runs of consecutive instructions with the same execution count,
i.e. basic blocks executed equally often -- that hold at least MIN_SHARE
(default 0.004) of the instructions, with their share of the samples.  A
loop body shows as regions with the loop's count; what runs once per block
or per warp shows with the launch's counts (run M1, docs/GPU_NOTES.md: a
third of the expert tiles' instructions outside their stage loop).
"""
import collections
import csv
import gzip
import sys


def kernels(path):
    """(name, header, rows) per kernel of the export."""
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt") as f:
        rows = list(csv.reader(f))
    out, cur = [], None
    for r in rows:
        if r and r[0] == "Kernel Name":
            cur = [r[1], None, []]
            out.append(cur)
        elif r and r[0] == "Address" and cur:
            cur[1] = r
        elif cur and cur[1] and len(r) == len(cur[1]):
            cur[2].append(r)
    return [k for k in out if k[1]]


def num(x):
    try:
        return int(x.replace(",", ""))
    except ValueError:
        return 0


def opcode(src):
    t = src.split()
    if not t:
        return "?"
    op = t[1] if t[0].startswith("@") and len(t) > 1 else t[0]
    return op.split(".")[0]


def report(name, hdr, rows, min_share):
    ix = {h: i for i, h in enumerate(hdr)}
    stalls = [h for h in hdr if h.startswith("stall_") and "Not Issued" not in h]
    lines = [(r[ix["Source"]].strip(), num(r[ix["Instructions Executed"]]),
              num(r[ix["Warp Stall Sampling (All Samples)"]]), r) for r in rows]
    ninst = sum(l[1] for l in lines) or 1
    nsamp = sum(l[2] for l in lines) or 1
    print(f"== {name}: {ninst:,} warp instructions, {nsamp:,} samples")
    st = collections.Counter()
    for _, _, _, r in lines:
        for c in stalls:
            st[c] += num(r[ix[c]])
    print("stalls: " + ", ".join(f"{c[6:]} {100 * v / nsamp:.1f}%" for c, v in st.most_common(8)))
    ops, osamp = collections.Counter(), collections.Counter()
    for src, n, s, _ in lines:
        ops[opcode(src)] += n
        osamp[opcode(src)] += s
    print("opcodes (instructions, samples): " + ", ".join(
        f"{o} {100 * v / ninst:.1f}/{100 * osamp[o] / nsamp:.1f}%" for o, v in ops.most_common(14)))
    regions, start = [], 0
    for i in range(1, len(lines) + 1):
        if i == len(lines) or lines[i][1] != lines[start][1]:
            seg = lines[start:i]
            regions.append((start, i - 1, lines[start][1], sum(l[1] for l in seg),
                            sum(l[2] for l in seg), collections.Counter(opcode(l[0]) for l in seg)))
            start = i
    print("region (SASS lines)   executions  instructions  samples  opcodes")
    for a, b, n, ins, smp, oc in regions:
        if ins >= min_share * ninst:
            print(f"{a:5d}-{b:5d} {n:16,d} {100 * ins / ninst:11.1f}% {100 * smp / nsamp:7.1f}%  " +
                  " ".join(f"{k}:{v}" for k, v in oc.most_common(6)))


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    min_share = float(sys.argv[2]) if len(sys.argv) > 2 else 0.004
    seen = set()
    for name, hdr, rows in kernels(sys.argv[1]):
        # (the export can list a result twice: the same rows again)
        key = (name, len(rows), sum(num(r[hdr.index("Instructions Executed")]) for r in rows))
        if key in seen:
            continue
        seen.add(key)
        report(name, hdr, rows, min_share)


if __name__ == "__main__":
    main()
