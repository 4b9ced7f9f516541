"""Train-step time, peak memory and beam-search speed of ``transformer_posattn`` against fairseq's
``transformer`` (and of ``transformer_lm_posattn`` against ``transformer_lm``).

For every position variant (docs/methods.md) the benchmark builds the model in-process with
fairseq's own machinery (:mod:`fairseq_posattn.models.building`: ``options.get_training_parser``
+ ``parse_args_and_arch`` with ``--user-dir fairseq_posattn``, then ``models.build_model`` on its
hydra config, as fairseq-train does), trains it for a few steps on synthetic Multi30k-like batches
and reports its step time and peak memory, both also as a ratio to vanilla fairseq
``transformer_iwslt_de_en`` of the same size on the same batches. With ``--lm``, the ``lm-*``
variants (the causal terms alone) are ``transformer_lm_posattn`` models of the same sizes compared
with fairseq's ``transformer_lm``, on sentences of Multi30k-like lengths and on blocks of 512
tokens. Each ratio is checked against the performance issue's bound for its kind of term. The
variants come from the registry of position methods (:mod:`posattn_benchmark.variants`): every
variant of every registered method gets a translation row (the method on every side it takes) and
a language-model row (``lm-`` prefix, on the decoder), checked against the bound of the method's
``benchmark_target``; the SAN+P+R combinations, the structural variants and the vanilla
references are listed there.

Structural variants (Wang et al. 2019; docs/methods.md) read ``src_structure`` (depth, tin, tout
per source token, as ``--task translation_structural`` collates it); a method that reads other side data
gets its declared example data (``BatchSideData.example``), and each model is handed the side data its
methods read. Every source sentence of m BPE
pieces gets the side data of a forest of real UD English-EWT trees (``--conllu``) of about
m / 1.5 words, the pieces spread over the words as subwords; it is computed once per process with
:func:`~fairseq_posattn.structure.side_data.token_side_data`, outside every timed region (the parse
and the prepare step are not timed here: ``--skip-prepare`` aside, the report adds
``scripts/benchmark_structure.py``'s prepare timing against ``fairseq-preprocess`` on the same text).

A train step is: forward, fairseq's label-smoothed cross entropy (epsilon 0.1, mean over target
tokens), backward, ``torch.optim.Adam`` step. Every measurement runs in a fresh subprocess (this
package with ``--worker``); every subprocess builds the same batches from the same seed (checked by
hash). Per row group (batch shape):

1. Memory: each model alone in its own process, vanilla first and last (a check of the method),
   two train steps: the first batch, then the largest one, with the Adam state already in place.
   CPU: growth of the process's peak resident set size (``getrusage(RUSAGE_SELF).ru_maxrss``) from
   just before the model is built (torch, fairseq and the batches already loaded) to the end of the
   second step: weights, gradients, Adam state and activations. glibc is told to map every block of
   64 KiB or more on its own (``MALLOC_MMAP_THRESHOLD_``), so that a freed tensor leaves the RSS at
   once and the peak follows the live tensors, not the allocator's slack (which otherwise adds a few
   hundred MB that vary by +-3% from run to run). CUDA:
   ``torch.cuda.max_memory_allocated`` over the same span, minus what was allocated before.
2. Time: one process builds every model of the group and runs them round-robin, one step of each
   model per batch, the order rotated every round, so that all models see the same machine load
   (a shared machine drifts by tens of percent within minutes). After the warm-up rounds, the step
   time is the median over the timed rounds and the time ratio the median over rounds of the
   model's step time over vanilla's in the same round. ``time.perf_counter``, with
   ``torch.cuda.synchronize`` on a GPU. That process holds every model and its Adam state at once
   (about 0.5 GB per model at the iwslt sizes): use ``--variants`` to measure fewer.
3. Decoding: one process builds vanilla and the ``--decode-variants`` in eval mode and runs fairseq's
   ``SequenceGenerator`` (beam 5 and fairseq-generate's other defaults) round-robin on the same
   source batches of ``--decode-batch-size`` sentences, as ``fairseq-generate`` calls it
   (``net_input`` goes to the encoder, with the side data its methods read). The
   models are untrained, so every hypothesis is forced to ``--decode-length`` tokens plus EOS
   (``min_len = max_len_b = --decode-length``, ``max_len_a = 0``): every model runs the same number
   of decoder steps on the same number of hypotheses. Speed ratio: median over the rounds of
   vanilla's time over the model's (above 1 is faster than vanilla). Language models decode in their
   sentences group only (they have no source: the prompt's length does not matter), incrementally
   from the start of the sequence, as ``fairseq-generate --task language_modeling`` does.

Modules: ``variants`` (the rows and their targets), ``batches`` (synthetic data), ``worker`` (one
measurement in a subprocess), ``groups`` and ``runner`` (the row groups and the parent that runs
their workers), ``stats`` (ratios and target checks), ``header`` and ``report`` (the markdown),
``readme`` (the generated section of docs/benchmark.md), ``cli`` (options and main).

Usage::

    python scripts/posattn_benchmark                           # all variants, iwslt sizes, 2+2 layers
    python scripts/posattn_benchmark --layers 6 --steps 10     # the iwslt preset's 6+6 layers
    python scripts/posattn_benchmark --variants direct-absolute distance-aware shaw --decode-variants
    python scripts/posattn_benchmark --long                    # also a group at sequence length 512
    python scripts/posattn_benchmark --variants struct-abs --decode-variants struct-abs struct-rel
    python scripts/posattn_benchmark --long --lm --readme docs/benchmark.md   # what `make benchmark` runs
    python scripts/posattn_benchmark --long --profile conv-2d shaw    # torch.profiler tables instead
    python scripts/posattn_benchmark --device cuda --variants san-p-r alibi   # on the GPU
"""
