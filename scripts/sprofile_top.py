#!/usr/bin/env python3
"""Summarizes Nsight Compute's per-instruction source page (scripts/device-gpu.sh sprofile).

    python3 scripts/sprofile_top.py sprofile.csv [N]

Reads the CSV that `ncu --import REPORT --page source --csv --print-source sass` writes, and prints
the total of the warp stall samples, the samples per opcode (the instruction's first word, without
its predicate and modifiers), and the N instructions with the most samples, with their stall reasons
where the CSV has a column per reason.
"""
import collections
import csv
import sys


def number(text):
    try:
        return float(text.replace(",", ""))
    except ValueError:
        return 0.0


def opcode(source):
    words = source.split()
    if words and words[0].startswith("@"):
        words = words[1:]
    return words[0].split(".")[0] if words else "?"


def main(argv):
    if len(argv) < 2:
        print(__doc__.strip())
        return 2
    top = int(argv[2]) if len(argv) > 2 else 40
    with open(argv[1], newline="") as f:
        rows = list(csv.reader(f))
    header_at = next((i for i, r in enumerate(rows) if "Source" in r), None)
    if header_at is None:
        print(f"sprofile: no header with a 'Source' column in {argv[1]}")
        return 1
    header = rows[header_at]
    src = header.index("Source")
    samples = next((i for i, h in enumerate(header) if h.startswith("Warp Stall Sampling (All")), None)
    if samples is None:
        print(f"sprofile: no 'Warp Stall Sampling (All Samples)' column; columns: {header}")
        return 1
    address = header.index("Address") if "Address" in header else None
    reasons = [i for i, h in enumerate(header) if h.startswith("stall_") and "Not Issued" not in h]
    body = [r for r in rows[header_at + 1:] if len(r) == len(header)]
    total = sum(number(r[samples]) for r in body)
    if total <= 0:
        print("sprofile: no samples")
        return 1
    print(f"sprofile: {total:.0f} warp stall samples over {len(body)} instructions")
    by_op = collections.Counter()
    for r in body:
        by_op[opcode(r[src])] += number(r[samples])
    print("  by opcode: " + ", ".join(f"{op} {100 * n / total:.1f}%" for op, n in by_op.most_common(12)))
    for r in sorted(body, key=lambda r: -number(r[samples]))[:top]:
        n = number(r[samples])
        why = sorted(((number(r[i]), header[i]) for i in reasons), reverse=True)[:2]
        why_text = " ".join(f"{name}={value:.0f}" for value, name in why if value > 0)
        where = r[address] if address is not None else ""
        print(f"  {100 * n / total:5.2f}% {where:>8} {r[src].strip()[:70]:<70} {why_text}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
