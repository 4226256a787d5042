"""A two-process DistributedDataParallel training step with fastact ops matches the same step with
torch ops: gloo on the CPU, NCCL on two GPUs (skipped with fewer)."""

import faulthandler
import os
import tempfile

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F

import fastact

pytestmark = [pytest.mark.slow, pytest.mark.skipif(not dist.is_available(), reason="torch.distributed unavailable")]


class Net(torch.nn.Module):
    """Every fastact op in a small classifier, or the same with torch ops (`use_fastact=False`)."""

    def __init__(self, use_fastact):
        super().__init__()
        self.use_fastact = use_fastact
        self.l1 = torch.nn.Linear(16, 32, bias=False)
        self.b1 = torch.nn.Parameter(torch.randn(32) * 0.1)
        self.l2 = torch.nn.Linear(32, 32)
        self.l3 = torch.nn.Linear(32, 10)

    def forward(self, x):
        fa = self.use_fastact
        h = self.l1(x)
        h = fastact.bias_gelu(h, self.b1) if fa else F.gelu(h + self.b1, approximate="tanh")
        a = fastact.softmax(h, -1) if fa else torch.softmax(h, -1)
        a = a + (fastact.softmax(h, 0) if fa else torch.softmax(h, 0))
        s = self.l2(a)
        s = fastact.sigmoid(s) * fastact.gelu(s) if fa else torch.sigmoid(s) * F.gelu(s)
        out = self.l3(s)
        return fastact.log_softmax(out, -1) if fa else torch.log_softmax(out, -1)


def _worker(rank, world, init_file, backend, out_dir):
    # A worker that dies by a signal leaves no traceback for mp.spawn to report: print every thread's
    # Python stack instead (a CI run once saw both workers abort, "terminate called without an active
    # exception", with nothing else to go on).
    faulthandler.enable(all_threads=True)
    if backend == "gloo":  # the loopback interface, whatever the host name resolves to: one machine
        os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    dist.init_process_group(backend, init_method=f"file://{init_file}", rank=rank, world_size=world)
    try:
        device = torch.device(f"cuda:{rank}") if backend == "nccl" else torch.device("cpu")
        if device.type == "cuda":
            torch.cuda.set_device(device)
        results = {}
        for use_fastact in (True, False):
            torch.manual_seed(0)  # the same initial weights on every rank and for both models
            model = Net(use_fastact).to(device).double()
            ddp = torch.nn.parallel.DistributedDataParallel(model, device_ids=[rank] if device.type == "cuda" else None)
            opt = torch.optim.SGD(ddp.parameters(), lr=0.5)
            torch.manual_seed(100 + rank)  # each rank its own batch
            x = torch.randn(12, 16, dtype=torch.float64, device=device)
            target = torch.randint(0, 10, (12,), device=device)
            for _ in range(2):
                opt.zero_grad()
                F.nll_loss(ddp(x), target).backward()
                opt.step()
            results[use_fastact] = {k: v.detach().cpu() for k, v in model.state_dict().items()}
            # DDP's reducer holds the process group and hooks on the parameters: free it before the
            # group is destroyed, not after (the last model's would otherwise live until return).
            del ddp, opt
        torch.save(results, os.path.join(out_dir, f"rank{rank}.pt"))
        dist.barrier()  # neither rank tears its connections down while the other may still use them
    finally:
        dist.destroy_process_group()


def _run(backend):
    with tempfile.TemporaryDirectory() as d:
        init_file = os.path.join(d, "init")
        mp.spawn(_worker, args=(2, init_file, backend, d), nprocs=2, join=True)
        r0, r1 = (torch.load(os.path.join(d, f"rank{r}.pt")) for r in (0, 1))
    for name, p in r0[True].items():
        # DDP kept the ranks in step (all-reduced gradients of the fastact backward ops) ...
        assert torch.equal(p, r1[True][name]), f"{name} differs between ranks"
        # ... and the step equals torch's
        torch.testing.assert_close(p, r0[False][name], rtol=1e-9, atol=1e-12, msg=f"{name}: fastact vs torch")
    # the step did move the weights (a test that could not fail otherwise)
    torch.manual_seed(0)
    initial = Net(True).double().state_dict()
    assert any(not torch.equal(initial[k], v) for k, v in r0[True].items())


def test_ddp_gloo_cpu():
    if not dist.is_gloo_available():
        pytest.skip("gloo unavailable")
    _run("gloo")


@pytest.mark.cuda
def test_ddp_nccl_two_gpus():
    if not torch.cuda.is_available() or torch.cuda.device_count() < 2:
        pytest.skip("needs two GPUs")
    if not dist.is_nccl_available():
        pytest.skip("NCCL unavailable")
    _run("nccl")
