"""pytest plugin of tests/test_registry_is_closed.py (``-p toy_reference``): the toy methods' independent
references, added to the reference implementation's biases as a real method's would be."""

from posattn.position_terms.toy_neighbour_method import NeighbourBias
from posattn.position_terms.toy_segment_method import SEGMENT, SameSegmentBias
from reference_attention import REFERENCE_BIASES


def _neighbour(term: NeighbourBias, h: int, i: int, j: int, causal: bool) -> float:
    return float(term.b[h]) if abs(i - j) == 1 else 0.0


REFERENCE_BIASES[NeighbourBias] = _neighbour


def _same_segment(term: SameSegmentBias, h: int, i: int, j: int, causal: bool) -> float:
    """The tests' batches carry runs of ``SEGMENT`` tokens as segments: token i's segment is i // SEGMENT."""
    return float(term.b[h]) if i // SEGMENT == j // SEGMENT else 0.0


REFERENCE_BIASES[SameSegmentBias] = _same_segment
