"""torch.compile's bf16 softmax backward at [4096, D] (D = argv[1], default 32768): run it; with a second argument,
print its PTX loads / stores, ptxas's resource use and the SASS LDG / STG / BAR lines from the inductor cache.
Session 44 ran it beside ncu on two_pass_l1_diag.cu's kernels (branch s43-two-pass-32k; bench/NOTES.md).
Usage: python3 bench/repro/inductor_softmax_bwd_sass.py 32768 dump"""
import glob, subprocess, sys, torch
torch.manual_seed(0)
shape = (4096, int(sys.argv[1]) if len(sys.argv) > 1 else 32768)
y = torch.softmax(torch.randn(shape, device="cuda", dtype=torch.bfloat16), -1)
dy = torch.randn_like(y)
f = torch.compile(lambda dy, y: torch.ops.aten._softmax_backward_data(dy, y, -1, torch.bfloat16))
for _ in range(8):
    f(dy, y)
torch.cuda.synchronize()
if len(sys.argv) > 2:
    for p in glob.glob("/tmp/torchinductor_*/triton/**/triton_red_fused__softmax_backward*.ptx", recursive=True):
        print("==", p)
        for line in open(p):
            if any(k in line for k in ("ld.global", "st.global", "createpolicy", ".maxntid", ".reqntid", "bar.sync",
                                        "shfl", ".reg .")):
                print("   ", line.rstrip())
    for p in glob.glob("/tmp/torchinductor_*/triton/**/triton_red_fused__softmax_backward*.cubin", recursive=True):
        print("==", p)
        print(subprocess.run(["cuobjdump", "--dump-resource-usage", p], capture_output=True, text=True).stdout)
        sass = subprocess.run(["cuobjdump", "--dump-sass", p], capture_output=True, text=True).stdout
        print("\n".join(l for l in sass.splitlines() if "LDG" in l or "STG" in l or "BAR" in l))
