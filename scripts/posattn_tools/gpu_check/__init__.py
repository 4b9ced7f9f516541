"""The GPU check (``make gpu-check``): the project's training-at-scale paths on a CUDA machine, in one
report.

Steps, each a row group of the report's table (check, device, setting, result, numbers):

1. **pytest on the GPU**: the precision, activation-checkpointing, compile, LSTM-precision, mixed-
   precision CLI and distributed test files (``PYTEST_FILES``; a file missing from the checkout is
   reported as skipped) with ``pytest --device cuda``, one row per file.
2. **Short trainings**: ``fairseq-train`` of each model family (``FAMILIES``: fairseq's
   ``transformer``, direct positions + temperature + RPR, structural positions, DA-Transformer, the
   attention convolutions, the positional attentive LSTM LM) on the shipped samples
   (``data/multi30k_sample``, ``data/ptb_sample``) with ``--fp16``, ``--bf16`` and ``--amp`` on one
   GPU; then every family on all visible GPUs (NCCL, ``--ddp-backend pytorch_ddp``) when there is
   more than one. Each run is checked (the command succeeds, every validation loss is finite, the
   last one is below the first) and scored from its checkpoint in a fresh process: sacreBLEU with its
   signature (``fairseq-generate`` + ``posattn-score``'s scorer) or test perplexity
   (``fairseq-eval-lm``). The validation-loss curves (read by ``fairseq_posattn.inspect.
   learning_curves``) become one PNG per family.
3. **Benchmark**: ``scripts/posattn_benchmark --device cuda`` (train-step time and peak-memory ratios to
   vanilla fairseq, beam-search speed), one row per variant with its target.
4. **Long language-model blocks** (``long``): the same benchmark for ``transformer_lm_posattn`` against
   fairseq's ``transformer_lm`` at d = 512, 8 heads, 6 layers, blocks of 512 to 4,096 tokens (16,384
   tokens per batch), in bf16: where the kernel's paths (SDPA, flex_attention, explicit) matter most.

Everything goes to ``--output`` (default ``gpu-check-output/``): ``report.md``, ``loss-*.png``,
``results.json``, the benchmark's own report and every command's log under ``logs/``. The exit
status is 0 when no check FAILED (a benchmark ratio that misses its target is reported, not
failed), 1 otherwise, 2 when the device asked for is not there.

Without CUDA the check stops at once and says so. ``--device cpu --tiny`` runs every step at the
smallest sizes on the CPU (bf16 where the CPU can, else fp32; the all-devices step as two gloo
processes) so that the script itself is tested where no GPU is. ``--quick`` does less on the GPU:
``--fp16`` only, no slow tests, fewer benchmark variants.

Modules, one per step: ``settings`` (the families, the modes' sizes and budgets), ``machine`` (the device),
``context`` (what every step reads; the report's rows), ``corpora`` (the samples prepared), ``training``
(trainings, their checks and scores, the loss curves), ``device_tests`` (pytest on the device), ``benchmark``
(the benchmark and the long blocks), ``report`` (report.md, results.json), ``cli`` (options, the steps in
order, ``main``). Commands run through :mod:`posattn_tools.runs`.

Usage::

    python scripts/gpu_check.py                      # the full check, about 6-8 minutes on one H100
    python scripts/gpu_check.py --quick              # fp16 only, fewer tests and variants
    python scripts/gpu_check.py --device cpu --tiny  # the smoke run on a CPU (a few minutes)
    python scripts/gpu_check.py --families vanilla da --precisions bf16 --skip pytest benchmark
"""
