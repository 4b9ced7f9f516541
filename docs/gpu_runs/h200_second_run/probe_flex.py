"""The flex_attention probe of docs/gpu_runs/h200_second_run (`python3 probe_flex.py cuda [cases]`): one
compiled call at 4,096 tokens, forward and backward, with DA- and T5-like captured learned tables."""
import sys, time, traceback
import torch
import torch.nn.functional as F
from torch.nn.attention.flex_attention import create_block_mask, flex_attention

dev = sys.argv[1] if len(sys.argv) > 1 else "cuda"
B, H, L, D = (4, 8, 4096, 64) if dev == "cuda" else (1, 2, 256, 16)
dt = torch.bfloat16 if dev == "cuda" else torch.float32
flex = torch.compile(flex_attention) if dev == "cuda" else flex_attention
mask = create_block_mask(lambda b, h, q, k: k <= q, B, None, L, L, device=dev)
w = torch.zeros(H, device=dev, requires_grad=True)
v = torch.zeros(H, device=dev, requires_grad=True)
t5 = torch.zeros(32, H, device=dev, requires_grad=True)
buckets = (torch.arange(-(L - 1), L, device=dev).abs().clamp(max=31))


def da_scalars():
    def mod(s, b, h, q, k):
        d = (q - k).abs().float()
        return torch.relu(s.float()) * torch.exp(F.softplus(v[h]) - F.softplus(v[h] - w[h] * d))
    return mod


def da_table():
    dist = torch.arange(L, device=dev, dtype=torch.float32)
    table = torch.exp(F.softplus(v[:, None]) - F.softplus(v[:, None] - w[:, None] * dist))
    return lambda s, b, h, q, k: torch.relu(s.float()) * table[h, (q - k).abs()]


def da_table_flat():
    dist = torch.arange(L, device=dev, dtype=torch.float32)
    table = torch.exp(F.softplus(v[:, None]) - F.softplus(v[:, None] - w[:, None] * dist)).flatten()
    return lambda s, b, h, q, k: torch.relu(s) * table[h * L + (q - k).abs()]


def t5_distance():
    bias = t5.index_select(0, buckets).t()  # H x 2L-1 fp32
    return lambda s, b, h, q, k: s + bias[h, q - k + L - 1]


SMALL = {"BLOCK_M": 64, "BLOCK_N": 64, "num_stages": 1}


def t5_bf16():
    bias = t5.index_select(0, buckets).t().to(dt)
    return lambda s, b, h, q, k: s + bias[h, q - k + L - 1]


CASES = [("plain_default", lambda: None, None), ("plain_small", lambda: None, SMALL), ("t5_small", t5_distance, SMALL), ("da_stages1", da_table, {"num_stages": 1}),
         ("t5_bf16_default", t5_bf16, None), ("da_small_again", da_table, SMALL),
("da_table_small", da_table, {"BLOCK_M": 64, "BLOCK_N": 64, "num_stages": 1}),
         ("t5_distance", t5_distance, None), ("da_table_flat", da_table_flat, None),
         ("da_table", da_table, None), ("da_scalars", da_scalars, None)]
names = sys.argv[2].split(",") if len(sys.argv) > 2 else [c[0] for c in CASES]
torch.manual_seed(0)
q, k, vv = (torch.randn(B, H, L, D, device=dev, dtype=dt, requires_grad=True) for _ in range(3))
for name, make, options in CASES:
    if name not in names:
        continue
    try:
        t0 = time.perf_counter()
        times = []
        for step in range(4):
            if dev == "cuda":
                torch.cuda.synchronize()
            s = time.perf_counter()
            extra = {"kernel_options": options} if options else {}
            out = flex(q, k, vv, score_mod=make(), block_mask=mask, scale=D ** -0.5, **extra)
            out.float().square().mean().backward()
            if dev == "cuda":
                torch.cuda.synchronize()
            times.append(round((time.perf_counter() - s) * 1000, 1))
        print(f"### {name}: fwd+bwd ms {times} (total {time.perf_counter() - t0:.1f} s)", flush=True)
    except Exception as error:  # noqa: BLE001
        print(f"### {name}: FAILED {type(error).__name__}: {str(error).splitlines()[0][:300]}", flush=True)
