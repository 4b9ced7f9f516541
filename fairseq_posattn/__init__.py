"""fairseq-posattn: position-aware self-attention for fairseq (``--user-dir fairseq_posattn``).

Importing the package applies the compatibility shims (:mod:`fairseq_posattn.compat`, and
:mod:`fairseq_posattn.distributed_compat` for distributed training on CPU processes and under
torchrun) and registers the architectures and tasks with fairseq.
"""

from fairseq_posattn import compat, distributed_compat

compat.apply_all()
distributed_compat.apply_all()

from fairseq_posattn import criterions, models, optim, tasks  # noqa: E402,F401  (registers them with fairseq)

compat.show_model_options_in_help()

__version__ = "0.1.0"
