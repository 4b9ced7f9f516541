"""Look inside a trained model: attention maps, learned position parameters, the side data its methods read.

:mod:`~fairseq_posattn.inspect.capture` runs a loaded model once on one sentence and collects the
numbers; :mod:`~fairseq_posattn.inspect.plots` draws them; ``posattn-inspect``
(:mod:`fairseq_posattn.cli.inspect`) does both from the command line.
"""

from fairseq_posattn.inspect.capture import Inspection, inspect_model, kinds

__all__ = ["Inspection", "inspect_model", "kinds"]
