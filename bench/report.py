#!/usr/bin/env python3
"""The side-by-side report of `make bench`: mxmoe's rows (the CSV of `mxmoe bench --csv`) joined with
each peer's (bench/peers/*.py --csv) by layer, routing and T; the ratio peer / mxmoe per row; issue 5's
targets for the Kimi-K3 layer, met or missed; and a PNG of achieved time against the roofline floor
over T (matplotlib; --no-plot skips it). The table needs only the standard library.

    python3 bench/report.py --mxmoe mxmoe.csv [--peer torch.csv ...] [--plot roofline.png | --no-plot]
"""
import argparse
import csv
import sys

# Issue 5, Kimi-K3 with uniform routing: (T, metric, at least %, and an absolute bound in µs or None).
TARGETS = [
    (1, "pct_read_roofline", 85, 81.0),
    (8, "pct_read_roofline", 85, None),
    (32, "pct_read_roofline", 85, None),
    (128, "pct_read_roofline", 80, None),
    (1024, "pct_read_roofline", 80, None),
    (4096, "pct_bf16_peak", 60, None),
    (16384, "pct_bf16_peak", 65, 35000.0),
]
TARGET_LAYER = "kimi-k3"
SKEW_ROUTING, SKEW_LIMIT = "heavy_hitters", 1.3  # skewed routing within 1.3x of uniform at the same T


def number(s):
    return float(s) if s not in (None, "") else None


def read_rows(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def key(row):
    return (row["layer"], row["routing"], int(row["tokens"]))


def fmt(v, spec, missing="-"):
    return missing if v is None else format(v, spec)


def print_table(rows, peers):
    names = sorted({p["peer"] for table in peers for p in table.values()})
    # Peers that also timed a CUDA graph replay (a graph_us column) get that ratio too, against
    # mxmoe's graph median.
    graphed = {p["peer"] for table in peers for p in table.values() if p.get("graph_us")}
    head = f"{'layer':13s} {'routing':13s} {'T':>6s} {'mxmoe us':>10s} {'%roof':>6s} {'bound':>6s}"
    for n in names:
        head += f" {n + ' us':>11s} {n + '/mxmoe':>12s} {n + ' err':>9s}"
        if n in graphed:
            head += f" {'graph ' + n + '/mxmoe':>19s}"
    head += "  config"
    print(head)
    for r in rows:
        us = number(r["us"])
        line = f"{r['layer']:13s} {r['routing']:13s} {int(r['tokens']):6d} "
        if r["check"] != "ok":  # FAILED (no speed is printed for it), or "not run" in a dry run
            line += f"{r['check']:>10s} {'':6s} {r['bound']:>6s}"
        else:
            line += f"{fmt(us, '10.1f')} {fmt(number(r['pct_roofline']), '6.1f')} {r['bound']:>6s}"
        for n in names:
            p = next((t[key(r)] for t in peers if key(r) in t and t[key(r)]["peer"] == n), None)
            pus = number(p["us"]) if p else None
            ratio = pus / us if (pus and us) else None
            err = number(p["normwise_err"]) if p else None
            line += f" {fmt(pus, '11.1f')} {fmt(ratio, '11.2f') + ('x' if ratio else ''):>12s} {fmt(err, '9.1e')}"
            if n in graphed:
                pg, mg = (number(p.get("graph_us")) if p else None), number(r.get("graph_us"))
                gratio = pg / mg if (pg and mg and r["check"] == "ok") else None
                line += f" {fmt(gratio, '18.2f') + ('x' if gratio else ''):>19s}"
        line += "  " + (r.get("config") or "-")  # (CSVs before the column existed: "-")
        print(line)


# The card the targets and the % columns are for, and its ceilings (SPEC section 6, measured there).
TARGET_CARD = "H200"
READ_CEILING, BF16_CEILING = "4.06 TB/s", "763 TFLOP/s"


def device_of(rows):
    """The GPU the rows ran on (mxmoe bench's `device` column), or None for CSVs from before it."""
    names = {r.get("device") for r in rows if r.get("device")}
    return ", ".join(sorted(names)) if names else None


def print_device(device):
    print(f"device: {device or 'not recorded'}; %roof against SPEC section 7's floors, from the {TARGET_CARD}'s "
          f"measured {READ_CEILING} and {BF16_CEILING} whatever the card")


def print_targets(rows, device):
    by_key = {key(r): r for r in rows if r["check"] == "ok" and number(r["us"])}
    # On another card the rows still compare against the H200's targets, but they do not decide them:
    # the verdicts say so in lower case ("MISSED" and "met" are the H200's own).
    other_card = device is not None and TARGET_CARD not in device
    met_word, missed_word = ("met on this card", "missed on this card") if other_card else ("met", "MISSED")
    lines = []
    for t, metric, pct, bound_us in TARGETS:
        r = by_key.get((TARGET_LAYER, "uniform", t))
        want = f">= {pct}% {'of read roofline' if metric == 'pct_read_roofline' else 'of bf16 peak'}"
        if bound_us:
            want += f", <= {bound_us:.0f} us"
        if r is None:
            lines.append(f"  T={t:<6d} {want:40s} not measured")
            continue
        got, us = number(r[metric]), number(r["us"])
        met = got >= pct and (bound_us is None or us <= bound_us)
        lines.append(f"  T={t:<6d} {want:40s} {got:5.1f}%, {us:.1f} us: {met_word if met else missed_word}")
    for (layer, routing, t), r in sorted(by_key.items()):
        if layer != TARGET_LAYER or routing != SKEW_ROUTING:
            continue
        u = by_key.get((layer, "uniform", t))
        if u is None:
            continue
        ratio = number(r["us"]) / number(u["us"])
        lines.append(f"  T={t:<6d} {SKEW_ROUTING} <= {SKEW_LIMIT}x uniform{'':18s} {ratio:5.2f}x: "
                     f"{met_word if ratio <= SKEW_LIMIT else missed_word}")
    print(f"\nissue 5 targets ({TARGET_LAYER}, uniform routing unless named):")
    if other_card:
        print(f"  (the targets are the {TARGET_CARD}'s; these rows ran on {device}, so they do not decide them)")
    print("\n".join(lines) if lines else "  no Kimi-K3 rows")


def plot(rows, peers, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    layers = list(dict.fromkeys(r["layer"] for r in rows))
    fig, axes = plt.subplots(2, len(layers), figsize=(5.5 * len(layers), 8), squeeze=False)
    for col, layer in enumerate(layers):
        top, bottom = axes[0][col], axes[1][col]
        mine = [r for r in rows if r["layer"] == layer]
        routings = list(dict.fromkeys(r["routing"] for r in mine))
        for routing, style in zip(routings, ["-", "--", ":", "-."]):
            rs = sorted((r for r in mine if r["routing"] == routing), key=lambda r: int(r["tokens"]))
            ts = [int(r["tokens"]) for r in rs]
            top.plot(ts, [number(r["floor_us"]) for r in rs], "k" + style, lw=1, label=f"roofline floor ({routing})")
            ok = [r for r in rs if r["check"] == "ok" and number(r["us"])]
            top.plot([int(r["tokens"]) for r in ok], [number(r["us"]) for r in ok], "o" + style, color="C0",
                     label=f"mxmoe ({routing})")
            bottom.plot([int(r["tokens"]) for r in ok], [number(r["pct_roofline"]) for r in ok], "o" + style,
                        color="C0", label=f"mxmoe ({routing})")
            for i, table in enumerate(peers):
                ps = [(int(r["tokens"]), number(table[key(r)]["us"]), number(r["floor_us"]))
                      for r in rs if key(r) in table and number(table[key(r)]["us"])]
                if not ps:
                    continue
                name = next(iter(table.values()))["peer"]
                top.plot([p[0] for p in ps], [p[1] for p in ps], "s" + style, color=f"C{i + 1}",
                         label=f"{name} ({routing})")
                bottom.plot([p[0] for p in ps], [100 * p[2] / p[1] for p in ps], "s" + style, color=f"C{i + 1}",
                            label=f"{name} ({routing})")
        top.set(title=layer, xscale="log", yscale="log", xlabel="tokens T", ylabel="µs per call (median)")
        bottom.set(xscale="log", xlabel="tokens T", ylabel="% of roofline (floor / time)", ylim=(0, 105))
        for ax in (top, bottom):
            ax.grid(True, which="both", alpha=0.3)
            ax.legend(fontsize=7)
    fig.suptitle(f"achieved vs roofline (floor = max(bytes / {READ_CEILING}, FLOPs / {BF16_CEILING}), SPEC section 7)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    print(f"wrote {path}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--mxmoe", required=True, help="the CSV of `mxmoe bench --csv`")
    ap.add_argument("--peer", action="append", default=[], help="a peer's CSV (repeatable)")
    ap.add_argument("--plot", help="the PNG to write")
    ap.add_argument("--no-plot", action="store_true", help="the table only (no matplotlib needed)")
    args = ap.parse_args()
    if not args.no_plot and not args.plot:
        ap.error("give --plot FILE.png or --no-plot")
    rows = read_rows(args.mxmoe)
    if not rows:
        sys.exit(f"report.py: --mxmoe {args.mxmoe} has no rows")
    peers = [{key(p): p for p in read_rows(path)} for path in args.peer]
    device = device_of(rows)
    print_device(device)
    print_table(rows, peers)
    print_targets(rows, device)
    if not args.no_plot:
        plot(rows, peers, args.plot)


if __name__ == "__main__":
    main()
