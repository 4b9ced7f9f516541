"""The GPU check's settings: the model families it trains, the sizes and budgets of its modes (full, quick,
tiny), the precisions, the test files and the steps."""

from dataclasses import dataclass
from typing import Dict, Optional, Tuple

from posattn_tools.runs import REPO_ROOT

USER_DIR = REPO_ROOT / "fairseq_posattn"
MULTI30K = REPO_ROOT / "data" / "multi30k_sample"
PTB = REPO_ROOT / "data" / "ptb_sample"
BENCHMARK = REPO_ROOT / "scripts" / "posattn_benchmark"
SRC, TGT = "en", "de"

#: the test files run on the device (relative to the repository); a missing one is reported as skipped
PYTEST_FILES = (
    "tests/test_training_at_scale.py",
    "tests/test_compile.py",
    "tests/test_lstm_lm_precision.py",
    "tests/test_lstm_lm_compiled.py",
    "tests/test_mixed_precision_cli.py",
    "tests/test_distributed.py",
    "tests/test_attention_terms.py",
)
#: fairseq-train's flags for each precision; fp16 and amp need CUDA (fairseq's loss scaler)
PRECISION_FLAGS: Dict[str, Tuple[str, ...]] = {
    "fp32": (), "fp16": ("--fp16",), "bf16": ("--bf16",), "amp": ("--amp",),
}
CUDA_ONLY_PRECISIONS = ("fp16", "amp")
TRANSLATION, STRUCTURAL, LANGUAGE_MODELING = "translation", "translation_structural", "language_modeling"
#: the first and the last validation losses of a run must differ by at least this to count as falling
LOSS_TOLERANCE = 1e-3


@dataclass(frozen=True)
class Family:
    """A model family trained by the check: its fairseq task, architecture and position flags."""

    name: str
    label: str
    task: str
    arch: str
    flags: Tuple[str, ...] = ()

    @property
    def is_lm(self) -> bool:
        return self.task == LANGUAGE_MODELING


FAMILIES: Tuple[Family, ...] = (
    Family("vanilla", "Transformer (fairseq's own)", TRANSLATION, "transformer"),
    Family("positions", "SAN+P+R +Temp, RPR (Dufter et al.; Shaw et al.)", TRANSLATION, "transformer_posattn",
           ("--encoder-direct-position", "both", "--encoder-learnable-temperature",
            "--decoder-direct-position", "both", "--encoder-relative-positions", "16",
            "--decoder-relative-positions", "16")),
    Family("structural", "Structural PE (Wang et al.)", STRUCTURAL, "transformer_posattn",
           ("--encoder-structural-positions", "both", "--encoder-structural-fusion", "nonlinear")),
    Family("da", "DA-Transformer (Wu et al.)", TRANSLATION, "transformer_posattn",
           ("--encoder-distance-aware", "--decoder-distance-aware")),
    Family("conv", "+Conv / +Conv2d (Dufter et al.)", TRANSLATION, "transformer_posattn",
           ("--encoder-conv-attention", "1d", "--decoder-conv-attention", "2d")),
    Family("poslstm", "Positional attentive LSTM LM (Dagan)", LANGUAGE_MODELING, "positional_attentive_lstm_lm"),
)
FAMILIES_BY_NAME = {family.name: family for family in FAMILIES}


@dataclass(frozen=True)
class Scale:
    """Sizes and budgets of one mode (full, quick, tiny)."""

    name: str
    #: first lines of every Multi30k and PTB split; None: all (3,000 / 300 / 300 pairs, 2,000 / 200 / 200 lines)
    lines: Optional[int]
    bpe_merges: int
    layers: int
    embed_dim: int
    ffn_dim: int
    heads: int
    lstm_dim: int
    max_tokens: int
    lm_batch_size: int
    max_update: int
    validate_every: int
    lr: float
    warmup: int
    #: the GPU's precisions (the CPU's: bf16 where it can, else fp32)
    cuda_precisions: Tuple[str, ...]
    pytest_args: Tuple[str, ...]
    benchmark_args: Tuple[str, ...]
    long_lm_args: Tuple[str, ...]


#: the first variant of every registered method (the benchmark derives the set), SAN+P+R, the 1d
#: convolution and the structural models; beam search of the structural and DA models
FULL_BENCHMARK = ("--variants", "san-p-r", "each-method", "conv-1d", "struct-abs", "struct-both",
                  "--decode-variants", "struct-both", "distance-aware", "--steps", "10", "--warmup", "3")
QUICK_BENCHMARK = ("--variants", "san-p-r", "distance-aware", "struct-both", "--decode-variants", "struct-both",
                   "--steps", "5", "--warmup", "2")
TINY_BENCHMARK = ("--variants", "struct-rel", "--decode-variants", "struct-rel", "--steps", "1", "--warmup", "0",
                  "--decode-rounds", "1", "--embed-dim", "16", "--ffn-dim", "32", "--heads", "2", "--layers", "1",
                  "--vocab-size", "64", "--max-tokens", "256", "--max-len", "24", "--max-positions", "32",
                  "--decode-length", "4", "--threads", "1")
#: the long-block step: per method, one language model per set of CUDA kernel paths its variants take
#: (the benchmark derives the set from the registry: flex for P / R, T5, DA, keys-only RPR; SDPA for
#: ALiBi, RoPE, the temperature; explicit for RPR with values, +Conv2d), and SAN+P+R
LONG_LM_SIZES = ("--layers", "6", "--embed-dim", "512", "--ffn-dim", "2048", "--heads", "8", "--precision", "bf16",
                 "--lm-block-tokens", "16384", "--decode-variants", "--vocab-size", "8000")
FULL_LONG_LM = (*LONG_LM_SIZES, "--lm-block-lengths", "512", "1024", "2048", "4096", "--steps", "5", "--warmup", "3",
                "--variants", "lm-san-p-r", "lm-each-kernel-path")
QUICK_LONG_LM = (*LONG_LM_SIZES, "--lm-block-lengths", "1024", "4096", "--steps", "3", "--warmup", "2",
                 "--variants", "lm-t5-bias", "lm-distance-aware", "lm-shaw-keys-only")
TINY_LONG_LM = ("--lm-block-lengths", "16", "--lm-block-tokens", "64", "--decode-variants", "--steps", "1",
                "--warmup", "0", "--embed-dim", "16", "--ffn-dim", "32", "--heads", "2", "--layers", "1",
                "--vocab-size", "64", "--threads", "1", "--variants", "lm-distance-aware")
SCALES: Dict[str, Scale] = {
    "full": Scale(name="full", lines=None, bpe_merges=2000, layers=3, embed_dim=256, ffn_dim=1024, heads=4,
                  lstm_dim=256, max_tokens=4096, lm_batch_size=32, max_update=600, validate_every=100, lr=1e-3,
                  warmup=200, cuda_precisions=("fp16", "bf16", "amp"), pytest_args=(),
                  benchmark_args=FULL_BENCHMARK, long_lm_args=FULL_LONG_LM),
    "quick": Scale(name="quick", lines=None, bpe_merges=2000, layers=2, embed_dim=256, ffn_dim=1024, heads=4,
                   lstm_dim=256, max_tokens=4096, lm_batch_size=32, max_update=300, validate_every=50, lr=1e-3,
                   warmup=100, cuda_precisions=("fp16",), pytest_args=("-m", "not slow"),
                   benchmark_args=QUICK_BENCHMARK, long_lm_args=QUICK_LONG_LM),
    "tiny": Scale(name="tiny", lines=40, bpe_merges=200, layers=1, embed_dim=16, ffn_dim=32, heads=2, lstm_dim=16,
                  max_tokens=400, lm_batch_size=8, max_update=4, validate_every=2, lr=5e-3, warmup=0,
                  cuda_precisions=("fp16", "bf16", "amp"), pytest_args=("-m", "not slow"),
                  benchmark_args=TINY_BENCHMARK, long_lm_args=TINY_LONG_LM),
}
STEPS = ("pytest", "train", "multi", "benchmark", "long")
#: fairseq's data-parallel wrappers that the all-devices step can use; the first is fairseq's default
DDP_BACKENDS = ("pytorch_ddp", "no_c10d", "legacy_ddp")
