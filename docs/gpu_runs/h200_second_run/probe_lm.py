"""The language-model probe of docs/gpu_runs/h200_second_run, run from the repository root
(`python3 docs/gpu_runs/h200_second_run/probe_lm.py cuda 4096 512 [variants] [robin]`): each variant alone,
its step times, torch._dynamo counters and a profile of one step; with a fifth argument, the benchmark's
round-robin timing of all of them."""
import logging
import sys
import time

sys.path.insert(0, "scripts")
import torch  # noqa: E402

logging.basicConfig(level=logging.INFO, stream=sys.stdout,
                    format="%(asctime)s %(levelname)s %(name)s: %(message)s")
from torch._dynamo.utils import counters  # noqa: E402

from posattn_benchmark.batches import BatchShape  # noqa: E402
from posattn_benchmark.variants import VARIANTS_BY_NAME, VANILLA_LM  # noqa: E402
from posattn_benchmark.worker import Worker, WorkerSpec  # noqa: E402

DEVICE = sys.argv[1] if len(sys.argv) > 1 else "cuda"
LENGTH = int(sys.argv[2]) if len(sys.argv) > 2 else 4096
DIM = sys.argv[3] if len(sys.argv) > 3 else "512"
SIZE = ("--decoder-layers", "6", "--decoder-embed-dim", DIM, "--decoder-ffn-embed-dim", str(4 * int(DIM)),
        "--decoder-attention-heads", "8", "--decoder-input-dim", DIM, "--decoder-output-dim", DIM)
NAMES = sys.argv[4].split(",") if len(sys.argv) > 4 else ["lm-distance-aware", "lm-t5-bias", "lm-alibi"]


def spec(variants):
    return WorkerSpec(mode="timing", task="language_modeling", variants=tuple(variants), size_flags=SIZE,
                      max_positions=LENGTH, shape=BatchShape(LENGTH, LENGTH, 4 * LENGTH), vocab_size=8000,
                      warmup=2, steps=3, seed=1, device=DEVICE, threads=None, conllu="", decode_length=0,
                      precision="bf16" if DEVICE == "cuda" else "fp32")


def report(tag):
    print(f"### {tag}: dynamo counters", {k: dict(v) for k, v in counters.items() if k in
          ("stats", "recompiles", "graph_break", "frames")}, flush=True)
    print(f"### cache_size_limit={torch._dynamo.config.cache_size_limit}", flush=True)


print("### torch", torch.__version__, torch.version.cuda,
      torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu", flush=True)
worker = Worker(spec([VANILLA_LM]))
variants = [VANILLA_LM] + [VARIANTS_BY_NAME[n] for n in NAMES]
for variant in variants:
    t0 = time.perf_counter()
    if DEVICE == "cuda":
        torch.cuda.synchronize(); torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
    model, optimizer = worker.build(variant)
    times = [worker.step(variant, model, optimizer, b) for b in worker.batches]
    peak = (torch.cuda.max_memory_allocated() - before) / 2**20 if DEVICE == "cuda" else 0
    print(f"### ALONE {variant.name}: step ms {[round(t, 1) for t in times]} peak {peak:.0f} MB "
          f"(total {time.perf_counter() - t0:.1f} s)", flush=True)
    report(variant.name)
    if variant.name != VANILLA_LM.name and DEVICE == "cuda":
        from torch.profiler import ProfilerActivity, profile
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            worker.step(variant, model, optimizer, worker.batches[0])
        print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=12), flush=True)
    del model, optimizer
    if DEVICE == "cuda":
        torch.cuda.empty_cache()
if len(sys.argv) > 5:
    print("### ROUND ROBIN (as the benchmark's timing worker)", flush=True)
    robin = Worker(spec(variants))
    result = robin.timing()
    for name, ms in result["step_ms"].items():
        print(f"### ROBIN {name}: {[round(t, 1) for t in ms]}", flush=True)
    report("robin")
    if DEVICE == "cuda":
        import torch._dynamo
        torch._dynamo.reset()
        counters.clear()
        torch._dynamo.config.cache_size_limit = 64
        torch._dynamo.config.accumulated_cache_size_limit = 512
        print("### ROUND ROBIN again, dynamo reset, cache_size_limit 64", flush=True)
        result = robin.timing()
        for name, ms in result["step_ms"].items():
            print(f"### ROBIN64 {name}: {[round(t, 1) for t in ms]}", flush=True)
        report("robin64")
