"""Times fastact.softmax over dim 0 for the built tree given as argv[1] (its fastact/ with the extension built in
place): events around 20 back-to-back calls, 7 rounds, median. Run with FASTACT_MAX_CLUSTER=1 on an H100, it takes
the strided split mode (the dim-0 plan of devices without clusters), whose stats pass is strided_stream_stats.
Session 44 ran it on 79c0f1d's tree and on 1e46a43's, alternately (bench/NOTES.md)."""
import os, statistics, sys
sys.path.insert(0, sys.argv[1])
import torch, fastact
assert os.path.dirname(fastact.__file__).startswith(os.path.abspath(sys.argv[1])), fastact.__file__
torch.manual_seed(0)
for shape, dt in (((16384, 8192), torch.bfloat16), ((16384, 4096), torch.float32), ((65536, 2048), torch.bfloat16),
                  ((262144, 256), torch.bfloat16)):
    x = torch.randn(shape, device="cuda", dtype=dt)
    ref = torch.softmax(x.double(), 0)
    y = fastact.softmax(x, 0)
    err = (y.double() - ref).abs().max().item()
    expl = fastact.explain("softmax", x, 0)
    for _ in range(3):
        fastact.softmax(x, 0)
    meds = []
    for r in range(7):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        for _ in range(20):
            fastact.softmax(x, 0)
        b.record(); b.synchronize()
        meds.append(a.elapsed_time(b) * 1e3 / 20)
    gbs = 2 * x.numel() * x.element_size() / (statistics.median(meds) * 1e3)
    print(f"{sys.argv[1].split('/')[-1] or 'new':4s} {str(dt)[6:]:8s} {list(shape)} dim0: {statistics.median(meds):8.1f} us "
          f"[{min(meds):.1f}-{max(meds):.1f}] {gbs:6.0f} GB/s  err {err:.1e}  | {expl[expl.find('variant'):][:30]} "
          f"{expl[expl.rfind('['):][:110]}", flush=True)
