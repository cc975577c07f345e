#!/usr/bin/env python3
"""Medians of a decode call's kernel timeline (src/cuda/kernel_timeline.cuh).

Reads the "mxmoe timeline: <kind> <start> <waited> <end>" lines a build with
-DMXMOE_KERNEL_TIMELINE prints at exit (run one shape and token count per process), orders them by
start, and cuts them into calls at each routing record. For every kind of kernel in a call it
prints the median over calls of its first CTA's start, of when that CTA's dependency wait returned
and of when it ended, in µs from the call's routing start. A build with -DMXMOE_KERNEL_TIMELINE=2
records every CTA of the GEMM kernels: then it also prints the medians of their ends' spread (the
fastest CTA, 10%, half, 90%, the last) and the SMs' last ends against the CTAs each SM ran.

  build-tl/bin/mxmoe bench --shapes kimi-k3 --tokens 1 2>&1 | python3 scripts/timeline_report.py
"""
import statistics
import sys

KINDS = {0: "route", 1: "fc1", 2: "fc2", 3: "combine"}


def med(values):
    return statistics.median(values) if values else float("nan")


def quantile(sorted_values, q):
    return sorted_values[min(len(sorted_values) - 1, int(q * (len(sorted_values) - 1) + 0.5))]


def main():
    records = []
    for line in sys.stdin:
        if not line.startswith("mxmoe timeline: "):
            continue
        fields = line.split()[2:]
        if len(fields) != 4 or not all(f.isdigit() for f in fields):
            print(line.rstrip())  # (the table's overflow note)
            continue
        tag, start, waited, end = (int(f) for f in fields)
        records.append((start, waited, end, tag & 0xFF, (tag >> 8) & 0xFFF, tag >> 20))
    records.sort()
    calls = []
    for start, waited, end, kind, sm, cta in records:
        if kind == 0:
            calls.append({})
        if calls:
            calls[-1].setdefault(kind, []).append((start, waited, end, sm, cta))
    by_shape = {}
    for call in calls:
        by_shape.setdefault(tuple(sorted(call)), []).append(call)
    for kinds, group in sorted(by_shape.items(), key=lambda kv: -len(kv[1])):
        print(f"{len(group)} calls with kernels {' '.join(KINDS.get(k, str(k)) for k in kinds)} "
              "(µs from the routing's start, medians over calls):")
        print(f"  {'kernel':8} {'start':>8} {'waited':>8} {'end':>8}   CTAs' ends: first  10%  50%  90%  last"
              "   (CTAs)")
        for k in kinds:
            rows = {i: [] for i in range(8)}
            ctas = []
            for c in group:
                t0 = c[0][0][0]
                recs = c[k]
                first = min(recs, key=lambda r: r[4])  # CTA 0 (the only one below level 2)
                rows[0].append((first[0] - t0) / 1e3)
                rows[1].append((first[1] - t0) / 1e3)
                rows[2].append((first[2] - t0) / 1e3)
                ends = sorted((r[2] - t0) / 1e3 for r in recs if r[2] != 0)
                ctas.append(len(recs))
                if k in (1, 2) and max(r[4] for r in recs) > 0:
                    for i, q in enumerate((0.0, 0.1, 0.5, 0.9, 1.0)):
                        rows[3 + i].append(quantile(ends, q))
            line = f"  {KINDS.get(k, str(k)):8} {med(rows[0]):8.1f} {med(rows[1]):8.1f} {med(rows[2]):8.1f}"
            if rows[3]:
                line += "            " + " ".join(f"{med(rows[i]):5.1f}" for i in range(3, 8))
                line += f"   ({med(ctas):.0f})"
            print(line)
        span = med([(max(r[2] for v in c.values() for r in v) - c[0][0][0]) / 1e3 for c in group])
        print(f"  span (last end) {span:.1f} µs")
        # Level 2: per SM, the CTAs it ran and its last end, for the GEMMs (medians over calls of
        # the mean last end of the SMs that ran n CTAs).
        for k in kinds:
            if k not in (1, 2) or max(r[4] for c in group for r in c[k]) == 0:
                continue
            by_count = {}
            for c in group:
                t0 = c[0][0][0]
                per_sm = {}
                for r in c[k]:
                    if r[2] == 0:
                        continue
                    n, last = per_sm.get(r[3], (0, 0.0))
                    per_sm[r[3]] = (n + 1, max(last, (r[2] - t0) / 1e3))
                for n, last in per_sm.values():
                    by_count.setdefault(n, []).append(last)
            print(f"  {KINDS[k]}: SMs' last end by the CTAs (with a tile) they ran: " +
                  ", ".join(f"{n} CTAs: {statistics.mean(v):.1f} µs ({len(v) / len(group):.0f} SMs)"
                            for n, v in sorted(by_count.items())))
        times = sorted({t for c in group for v in c.values() for r in v for t in r[:3] if t})
        steps = [b - a for a, b in zip(times, times[1:]) if b > a]
        if steps:
            print(f"  smallest step between recorded times: {min(steps)} ns")


if __name__ == "__main__":
    main()
