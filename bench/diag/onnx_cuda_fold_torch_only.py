# Does torch's TorchScript ONNX exporter fail on a CUDA model with a mask buffer, without fastact?
import io, math, warnings
import torch

class M(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.qkv = torch.nn.Linear(16, 48)
        self.register_buffer("causal", torch.ones(32, 32, dtype=torch.bool).tril())
    def forward(self, h):
        t = h.shape[1]
        q, k, v = self.qkv(h).chunk(3, dim=-1)
        s = (q @ k.transpose(-1, -2)) / math.sqrt(16)
        return torch.softmax(s.masked_fill(~self.causal[:t, :t], -1e9), -1) @ v

for dev in ("cpu", "cuda"):
    m = M().to(dev).eval()
    for fold in (True, False):
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                torch.onnx.export(m, (torch.randn(2, 7, 16, device=dev),), io.BytesIO(), dynamo=False, opset_version=17,
                                  do_constant_folding=fold)
            print(dev, "fold" if fold else "nofold", "ok")
        except Exception as e:
            print(dev, "fold" if fold else "nofold", "FAILED:", str(e)[:120])
