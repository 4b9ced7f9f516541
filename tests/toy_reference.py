"""pytest plugin of tests/test_registry_is_closed.py (``-p toy_reference``): the toy method's
independent reference, added to the reference implementation's biases as a real method's would be."""

from fairseq_posattn.modules.position_terms.toy_neighbour_method import NeighbourBias
from reference_attention import REFERENCE_BIASES


def _neighbour(term: NeighbourBias, h: int, i: int, j: int, causal: bool) -> float:
    return float(term.b[h]) if abs(i - j) == 1 else 0.0


REFERENCE_BIASES[NeighbourBias] = _neighbour
