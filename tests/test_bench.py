"""The benchmark report's arithmetic and its bar (fastact/bench.py): byte counts, figures, the speed-ups' geometric
mean, and what ``--check`` counts as a miss on each device; then one small report run end to end on the CPU.

The bar (docs/performance.md, "The bar"): on CUDA a fraction of the measured limit per kind of case; on every device no
case slower than torch or torch.compile and the per-call overhead within 10% of torch's; on the CPU, instead of the
fractions, the geometric mean of the speed-ups over torch eager at least 1.5."""

import json

import pytest
import torch

from fastact import bench as B

F32, BF16 = torch.float32, torch.bfloat16


@pytest.mark.parametrize(
    "case, want",
    [
        # softmax fwd: read x, write y; with dtype=: x in bf16, y in float
        (B.Case("softmax", "fwd", F32, (8, 128)), 2 * 1024 * 4),
        (B.Case("softmax", "fwd", BF16, (8, 128), out_dtype=F32), 1024 * 2 + 1024 * 4),
        # bwd: read dy and y (float under the cast), write dx (bf16 under the cast)
        (B.Case("log_softmax", "bwd", F32, (8, 128)), 3 * 1024 * 4),
        (B.Case("log_softmax", "bwd", BF16, (8, 128), out_dtype=F32), 2 * 1024 * 4 + 1024 * 2),
        (B.Case("gelu", "fwd", BF16, (8, 128)), 2 * 1024 * 2),
        (B.Case("sigmoid", "bwd", F32, (8, 128)), 3 * 1024 * 4),
        # bias_gelu: the bias read once (fwd), and read and its gradient written once (bwd)
        (B.Case("bias_gelu", "fwd", F32, (8, 128)), 2 * 1024 * 4 + 128 * 4),
        (B.Case("bias_gelu", "bwd", BF16, (8, 128)), 3 * 1024 * 2 + 2 * 128 * 2),
    ],
)
def test_case_bytes(case, want):
    assert case.nbytes == want


def test_case_kinds_and_names():
    assert B.Case("softmax", "fwd", F32, (4, 8, 16), dim=1).kind == "strided"
    assert B.Case("softmax", "fwd", F32, (4, 8, 16), dim=-1).kind == "softmax"
    assert B.Case("softmax", "fwd", F32, (4, 8, 16), dim=2).kind == "softmax"
    assert B.Case("gelu_tanh", "bwd", F32, (4, 8)).kind == "elementwise"
    assert B.Case("bias_gelu", "bwd", F32, (4, 8)).kind == "bias_gelu"
    assert B.Case("log_softmax", "bwd", F32, (32, 1024, 2048), dim=1).name == "log_softmax-bwd-f32-32x1024x2048-dim1"
    assert B.Case("softmax", "fwd", BF16, (4, 8), out_dtype=F32).name == "softmax-fwd-bf16>f32-4x8"


@pytest.mark.parametrize("device_type", ["cpu", "cuda"])
@pytest.mark.parametrize("mode", ["quick", "full"])
def test_grid_names_unique_and_bars_known(device_type, mode):
    for grid in ("bar", "irregular", "wide"):
        cases = B.cases(mode, device_type, grid)
        assert cases
        names = [c.name for c in cases]
        assert len(names) == len(set(names)), grid
        for c in cases:
            assert (c.kind, c.direction) in B.BARS
            assert c.numel > 0


CASE = B.Case("softmax", "fwd", F32, (1024, 1024))  # 8 MiB moved


def summarised(fastact_s, torch_s=None, compile_s=None, limit_gbps=10.0, case=CASE):
    rows = {"fastact": {"seconds": fastact_s}}
    if torch_s is not None:
        rows["torch"] = {"seconds": torch_s}
    if compile_s is not None:
        rows["torch.compile"] = {"seconds": compile_s}
    return B.summarise({"case": case, "rows": rows, "skipped": {}, "errors": {}, "mismatch": {}, "explain": None},
                       limit_gbps)


def test_figures_and_speedup():
    r = summarised(1e-3, torch_s=3e-3, compile_s=2e-3)
    fa = r["rows"]["fastact"]
    assert fa["gbps"] == pytest.approx(CASE.nbytes / 1e-3 / 1e9)
    assert fa["fraction"] == pytest.approx(fa["gbps"] / 10.0)
    assert fa["time_us"] == pytest.approx(1000.0)
    assert r["speedup"] == pytest.approx(2.0)  # over the better of the two
    assert r["best_torch_s"] == pytest.approx(2e-3)


def test_fraction_bar_is_cudas_alone():
    assert B.fraction_bar(CASE, "cuda") == B.BARS[("softmax", "fwd")]
    assert B.fraction_bar(CASE, "cpu") is None
    # 8 MiB in 1 ms against a 100 GB/s limit: a fraction of 0.084, far under every fraction bar, 3x ahead of torch
    r = summarised(1e-3, torch_s=3e-3, compile_s=3e-3, limit_gbps=100.0)
    cuda = B.check(r, "cuda")
    assert len(cuda) == 1 and "of the limit" in cuda[0]
    assert B.check(r, "cpu") == []


@pytest.mark.parametrize("device_type", ["cpu", "cuda"])
def test_check_slower_than_either_is_a_miss(device_type):
    fast = summarised(1e-3, torch_s=1.5e-3, compile_s=1.2e-3, limit_gbps=1.0)  # fraction 8.4: over every bar
    assert B.check(fast, device_type) == []
    behind_compile = summarised(1e-3, torch_s=1.5e-3, compile_s=0.99e-3, limit_gbps=1.0)
    (m,) = B.check(behind_compile, device_type)
    assert "slower than torch.compile" in m
    behind_torch = summarised(1e-3, torch_s=0.9e-3, limit_gbps=1.0)
    (m,) = B.check(behind_torch, device_type)
    assert "slower than torch " in m


def test_check_failures_and_mismatches():
    r = summarised(1e-3, torch_s=2e-3, limit_gbps=1.0)
    r["errors"]["fastact[vec]"] = "RuntimeError: boom\nmore"
    r["errors"]["torch.compile"] = "BackendCompilerFailed: not fastact's"
    r["mismatch"]["fastact"] = 0.5
    misses = B.check(r, "cpu")
    assert len(misses) == 2
    assert "fastact[vec] failed: RuntimeError: boom" in misses[0] and "more" not in misses[0]
    assert "differs from torch" in misses[1]
    no_figure = B.summarise({"case": CASE, "rows": {"torch": {"seconds": 1.0}}, "skipped": {}, "errors": {},
                             "mismatch": {}, "explain": None}, 1.0)
    assert B.check(no_figure, "cuda") == [f"{CASE.name}: no fastact figure"]


def test_speedup_geomean():
    rs = [summarised(1.0, torch_s=4.0, compile_s=2.0), summarised(1.0, torch_s=1.0), summarised(2.0)]
    s = B.speedup_summary(rs)
    assert s["cases_vs_torch"] == 2 and s["vs_torch"] == pytest.approx(2.0)  # sqrt(4 * 1)
    # only the cases that measured torch.compile count against the better of the two
    assert s["cases_vs_best"] == 1 and s["vs_best"] == pytest.approx(2.0)
    assert B.speedup_summary([]) == {"vs_torch": None, "cases_vs_torch": 0, "vs_best": None, "cases_vs_best": 0}
    assert B.format_speedups(B.speedup_summary([])) == []
    (line,) = B.format_speedups(s)
    assert "2.00x over torch (2 case(s))" in line and "2.00x over the better of torch and torch.compile (1" in line
    (no_compile,) = B.format_speedups(B.speedup_summary(rs[1:]))  # --no-compile: no claim about torch.compile
    assert "1.00x over torch (1 case(s))" in no_compile and "compile" not in no_compile


def test_check_run_geomean_is_the_cpus():
    low = B.speedup_summary([summarised(1.0, torch_s=1.4)])
    (m,) = B.check_run(low, [], "cpu")
    assert "1.40x < 1.5x" in m
    assert B.check_run(low, [], "cuda") == []
    assert B.check_run(B.speedup_summary([summarised(1.0, torch_s=1.5)]), [], "cpu") == []
    assert B.check_run(B.speedup_summary([]), [], "cpu") == []


@pytest.mark.parametrize("device_type", ["cpu", "cuda"])
def test_check_run_overhead(device_type):
    none = B.speedup_summary([])
    ok = [{"op": "softmax", "fastact_us": 5.5, "torch_us": 5.0}, {"op": "gelu", "fastact_us": 1.0, "torch_us": 9.0}]
    assert B.check_run(none, ok, device_type) == []
    over = [{"op": "sigmoid", "fastact_us": 5.6, "torch_us": 5.0}, {"op": "gelu", "torch_us": 5.0}]
    m1, m2 = B.check_run(none, over, device_type)
    assert "sigmoid" in m1 and "1.12x" in m1
    assert m2 == "per-call overhead of gelu: no figure"


def test_report_end_to_end_cpu(tmp_path, capsys):
    """One small case through the report's whole path: timing, verification, the tables, the JSON, --check's exit code
    (the case's figures are this machine's, so the exit code is only checked against the misses it reports)."""
    out = tmp_path / "out"
    rc = B.main(["--device", "cpu", "--quick", "--no-compile", "--ops", "sigmoid", "--match", "^sigmoid-fwd-f32-",
                 "--check", "--out", str(out)])
    text = capsys.readouterr().out
    report = json.loads((out / "report.json").read_text())
    (r,) = report["results"]
    assert r["case"]["name"].startswith("sigmoid-fwd-f32-")
    assert set(r["rows"]) == {"fastact", "torch"} and not r["mismatch"] and not r["errors"]
    assert r["bar"] is None  # the CPU: no fraction bar
    assert report["bar"] == {"fractions": None, "cpu_geomean": B.CPU_GEOMEAN_BAR, "overhead": B.OVERHEAD_BAR}
    assert [o["op"] for o in report["overhead"]] == ["sigmoid"]
    s = report["speedups"]
    assert s["cases_vs_torch"] == 1
    assert s["vs_torch"] == pytest.approx(r["rows"]["torch"]["seconds"] / r["rows"]["fastact"]["seconds"])
    assert "speed-up, geometric mean:" in text and "== sigmoid ==" in text
    assert rc == (1 if report["misses"] else 0)
    assert f"check: {len(report['misses'])} miss(es) against the bar" in text
    assert all("of the limit" not in m for m in report["misses"])
