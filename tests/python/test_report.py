"""bench/report.py, the report of `make bench`: issue 5's verdicts are the H200's, and a run on another
card says that its rows do not decide them. Only the standard library and the script are needed."""

import csv
import os
import subprocess
import sys

import pytest

REPORT = os.path.join(os.path.dirname(__file__), "..", "..", "bench", "report.py")
# The columns of `mxmoe bench --csv` (bench/sweep.cpp) that the report reads.
COLUMNS = ["layer", "routing", "tokens", "floor_us", "bound", "us", "graph_us", "pct_read_roofline",
           "pct_bf16_peak", "pct_roofline", "check", "config", "device"]


def row(tokens, routing, us, pct_read, device):
    return {"layer": "kimi-k3", "routing": routing, "tokens": tokens, "floor_us": 69.0, "bound": "memory",
            "us": us, "graph_us": us, "pct_read_roofline": pct_read, "pct_bf16_peak": 0.1,
            "pct_roofline": pct_read, "check": "ok", "config": "n8c2", "device": device}


def report(tmp_path, rows, columns=COLUMNS):
    path = tmp_path / "mxmoe.csv"
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=columns, extrasaction="ignore")
        w.writeheader()
        w.writerows(rows)
    out = subprocess.run([sys.executable, REPORT, "--mxmoe", str(path), "--no-plot"], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    return out.stdout


# T = 1 (>= 85% of the read roofline, within 81 µs) met at 75 µs / 92%; T = 8 (>= 85%) missed at 60%;
# heavy hitters at T = 8 1.11x uniform, within 1.3x.
ROWS = [(1, "uniform", 75.0, 92.0), (8, "uniform", 900.0, 60.0), (8, "heavy_hitters", 1000.0, 55.0)]


@pytest.mark.parametrize("device", ["NVIDIA H200", "NVIDIA H100 80GB HBM3"])
def test_verdicts_name_the_card(tmp_path, device):
    out = report(tmp_path, [row(t, r, us, pct, device) for t, r, us, pct in ROWS])
    assert f"device: {device};" in out
    t1 = next(line for line in out.splitlines() if line.startswith("  T=1 "))
    t8 = next(line for line in out.splitlines() if line.startswith("  T=8 ") and "of read roofline" in line)
    skew = next(line for line in out.splitlines() if "heavy_hitters <=" in line)
    if "H200" in device:
        assert t1.endswith(": met") and t8.endswith(": MISSED") and skew.endswith(": met")
        assert "do not decide" not in out
    else:
        # The same comparisons, worded so that they cannot be read as the H200's.
        assert t1.endswith(": met on this card") and t8.endswith(": missed on this card")
        assert skew.endswith(": met on this card")
        assert "MISSED" not in out
        assert f"these rows ran on {device}, so they do not decide them" in out


def test_csv_without_a_device_column_reads_as_before(tmp_path):
    # CSVs written before the column existed: the H200's verdicts, the device not recorded.
    columns = [c for c in COLUMNS if c != "device"]
    out = report(tmp_path, [row(t, r, us, pct, None) for t, r, us, pct in ROWS], columns)
    assert "device: not recorded;" in out
    assert any(line.startswith("  T=8 ") and line.endswith(": MISSED") for line in out.splitlines())
