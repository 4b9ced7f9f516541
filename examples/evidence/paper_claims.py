"""The papers' claims that the evidence runs test, each with the paper's own numbers and table.

A claim compares a ``system`` with a ``reference`` system of the same task (and tag set) on one
metric, in one of two kinds:

- ``direction``: the paper reports the system better (or worse) than the reference; the sign of the
  paper's difference is what we check, not its size (our data and budgets are smaller).
- ``no effect``: the paper's text says the two perform alike (its table's difference is within its
  spread); we check that no seed shows a significant difference.

Comparisons without a paper number (the sequential methods on Multi30k, the transformer language
models, the position-unaware classifier) are reported as measured, with the same statistics.
"""

from dataclasses import dataclass
from typing import List, Optional, Tuple

DIRECTION = "direction"
NO_EFFECT = "no effect"

WANG = "Wang et al. 2019, Table 1 (Transformer-Base, NIST Zh-En MT02 dev, BLEU)"
DAGAN = "Dagan 2019, Table 1 (PTB test perplexity)"
DUFTER_UD = "Dufter et al. 2020, Table 2c (UD v2.2, macro mean over 47 treebanks, accuracy)"
DUFTER_PTB = "Dufter et al. 2020, Table 2b (PTB WSJ test, accuracy)"
DUFTER_CURVE = "Dufter et al. 2020, Table 2a and Figure 2 (development accuracy during training)"
WU = "Wu et al. 2021, Table 4 (SST, accuracy, mean of 5 runs)"
PRESS = ("Press et al. 2022 (ALiBi), Figure 1 (WikiText-103 valid perplexity against the evaluation length, "
         "non-overlapping windows, models trained on 512 and 1,024 tokens)")
KERPLE = ("Chi et al. 2022 (KERPLE), its extrapolation experiments (perplexity past the training length, "
          "against ALiBi)")
FIRE = ("Li et al. 2023 (FIRE), its length-generalisation experiments (perplexity past the training length, "
        "against ALiBi)")
XPOS = ("Sun et al. 2022 (xPos, LEX Transformer), its extrapolation experiments (perplexity past the training "
        "length, against RoPE)")
FOX = ("Lin et al. 2025 (Forgetting Transformer), its length-extrapolation experiments (loss past the training "
       "context length, against the Transformer with RoPE and without position embeddings)")
POPE = ("Gopalakrishnan et al. 2025 (PoPE), its abstract (perplexity below RoPE's, and zero-shot length "
        "extrapolation where RoPE's degrades; its numbers not read here)")
HOPE = ("Chen et al. 2025 (HoPE), its abstract (robustness to the out-of-distribution attention past the training "
        "length, against RoPE; its numbers not read here)")
CABLE = ("Veisi et al. 2025 (CABLE), its abstract and the authors' README (lower perplexity on sequences longer than "
         "trained on; trained at 1,024 and read at 8,192: 22.22 against 22.81 for sinusoidal trained at 8,192)")
SSMAX = ("Nakanishi 2025 (Scalable-Softmax), its abstract (better length generalisation than the softmax; its numbers "
         "not read here; its models had RoPE, ours none)")
DAPE = ("Zheng et al. 2024 (DAPE), its abstract and README (trained at 128, better at 8,192 than its static bias: "
        "DAPE-Kerple against Kerple; its numbers not read here)")
STICK = ("Tan et al. 2025 (stick-breaking attention), its abstract (trained at 2,048, perplexity improvements at "
         "16,384 over softmax attention with RoPE; its numbers not read here)")
P_ROPE = ("Barbero et al. 2025 (p-RoPE), Table 2 as third parties quote it (Gemma 2B trained and scored at 8k: "
          "0.75-RoPE 4.4414 against RoPE 4.4627, Wiki perplexity; at the training length)")
SELECTIVE = ("Leviathan et al. 2024 (selective attention), its abstract (selective attention improves language modelling "
             "over the same transformer without it, at the training length; its numbers not read here; ours has no "
             "other position method beside it)")
MTA = ("Golovneva et al. 2025 (multi-token attention), its abstract (MTA improves language modelling over the "
       "transformer baseline, at the training length; its numbers not read here; ours has no other position method "
       "beside it)")
YARN = ("Peng et al. 2023 (YaRN), sections 3.3-3.4 (a RoPE model read past its training length without fine-tuning: "
        "dynamic NTK and YaRN keep its perplexity low where RoPE's rises; Llama 2, its numbers not read here; ours: "
        "the extension switched on at evaluation of the rotary model, YaRN with s = the evaluation length / 64)")
RNOPE = ("Yang et al. 2025 (Rope to Nope and back again), its abstract (a hybrid of RoPE and NoPE layers surpasses "
         "the RoPE transformer with full attention at long context; its models: RoPE layers with a sliding window and "
         "one NoPE layer in four; ours: full attention, RoPE then none in 2 layers; its numbers not read here)")
PATH = ("Yang et al. 2025 (PaTH), its abstract (PaTH improves upon RoPE in language modelling; its numbers not read "
        "here; at the training length)")
#: the later methods' own claims, each against the baseline its paper beats, past the training length (16 x) or at
#: it (1 x): (system, reference, source, the paper's words, multiplier)
LATER_CLAIMS = (
    ("kerple-log", "alibi", KERPLE, "KERPLE's logarithmic kernel extrapolates better than ALiBi", 16),
    ("fire", "alibi", FIRE, "FIRE's learned bias generalises to longer inputs better than ALiBi", 16),
    ("xpos", "rotary", XPOS, "xPos extrapolates where RoPE's perplexity rises past the training length", 16),
    ("forget-gate", "rotary", FOX, "FoX's loss stays flat past the training length where RoPE's rises", 16),
    ("forget-gate", "none", FOX, "the forget gate extrapolates where the transformer without position embeddings "
     "does not", 16),
    ("polar", "rotary", POPE, "PoPE extrapolates where RoPE's perplexity degrades", 16),
    ("hope", "rotary", HOPE, "HoPE is more robust than RoPE past the training length", 16),
    ("cable", "alibi", CABLE, "CABLE's perplexity past the training length is below ALiBi's", 16),
    ("scalable-softmax", "none", SSMAX, "scaling each query by s log n generalises to longer inputs better than the "
     "softmax", 16),
    ("dape-kerple", "kerple-log", DAPE, "DAPE's MLP over the logits and the bias extrapolates better than the bias "
     "alone", 16),
    ("stick-breaking", "rotary", STICK, "stick-breaking attention extrapolates better than softmax attention with "
     "RoPE", 16),
    ("p-rope", "rotary", P_ROPE, "RoPE without its lowest frequencies models language better than RoPE", 1),
    ("path-attention", "rotary", PATH, "PaTH's data-dependent transforms model language better than RoPE", 1),
    ("rotary-yarn-zero-shot", "rotary", YARN, "YaRN lets a RoPE model read past its training length without "
     "fine-tuning", 16),
    ("rotary-dynamic-zero-shot", "rotary", YARN, "dynamic NTK scaling lets a RoPE model read past its training length "
     "without fine-tuning", 16),
    ("rotary-none-interleaved", "rotary", RNOPE, "interleaving RoPE and NoPE layers reads long contexts better than "
     "RoPE in every layer", 16),
    ("selective", "none", SELECTIVE, "selective attention models language better than the transformer without it", 1),
    ("mta", "none", MTA, "multi-token attention models language better than the transformer without it", 1),
)


@dataclass(frozen=True)
class Claim:
    """``system`` against ``reference`` on ``metric``; the paper's values are None where it has none."""

    task: str
    system: str
    reference: str
    metric: str
    paper_system: Optional[float] = None
    paper_reference: Optional[float] = None
    source: str = ""
    kind: str = DIRECTION
    reading: str = ""  # the paper's own words for the comparison
    group: str = ""  # tagging: the tag set (upos, xpos)
    sign: int = 0  # a claim in words only: +1 / -1 the paper's direction; 0 with the paper's numbers or none

    @property
    def has_paper_number(self) -> bool:
        return self.paper_system is not None and self.paper_reference is not None

    @property
    def paper_delta(self) -> Optional[float]:
        if not self.has_paper_number:
            return None
        return self.paper_system - self.paper_reference  # type: ignore[operator]

    @property
    def expected_sign(self) -> int:
        """+1 / -1: the sign of system - reference the paper reports; 0: no paper claim (measured only)."""
        delta = self.paper_delta
        if delta is None:
            return self.sign
        return (delta > 0) - (delta < 0)

    @property
    def is_paper_claim(self) -> bool:
        return self.kind == NO_EFFECT or self.expected_sign != 0


def _translation() -> List[Claim]:
    """Wang et al.'s Table 1 rows as the paper's section 5.1 compares them, on test and on valid."""
    table1 = {"1": 28.33, "2": 35.43, "3": 34.23, "4": 44.31, "5": 44.84, "6": 45.10, "7": 45.02, "9": 45.67}
    pairs: List[Tuple[str, str, str]] = [
        ("1", "4", "removing the sequential encoding degrades translation dramatically (-15.98)"),
        ("2", "1", "absolute structural positions improve the position-unaware model (+7.10)"),
        ("3", "1", "relative structural positions improve the position-unaware model (+5.90)"),
        ("5", "4", "structural absolute positions improve the base model"),
        ("6", "4", "structural absolute + relative positions improve the base model"),
        ("7", "4", "sequential relative encoding improves the base model (+0.71)"),
        ("9", "7", "structural positions improve further over relative sequential ones (+0.65)"),
    ]
    claims = []
    for metric in ("bleu_test", "bleu_valid"):
        claims += [Claim("translation", system, reference, metric, table1[system], table1[reference], WANG,
                         reading=reading) for system, reference, reading in pairs]
        claims += [Claim("translation", system, "4", metric)
                   for system in ("da", "rpr", "pr", "conv2d", "temp")]
    return claims


#: the LSTM language models at the authors' budget (evidence_plan.LSTM_AUTHORS_SYSTEMS), named with this suffix:
#: the short budget's attentive models, and the authors' own LSTM baseline in place of fairseq's lstm_lm
AUTHORS_BUDGET = "_authors"


def _language_model() -> List[Claim]:
    """Dagan's Table 1 (test perplexity: LSTM 64.96, attentive 76.56, positional attentive 70.92), tested twice:
    on the LSTMs of the short budget (6 epochs at lr 10, as recorded) and, as claims of their own, at the authors'
    budget (40 epochs at lr 30, weight decay 1.2e-6, the authors' initialisation and eps, and their LSTM
    baseline, 3 layers at batch 20), the one that matches the training the paper's numbers come from."""
    test = {"lstm_lm": 64.96, "attentive_lstm_lm": 76.56, "positional_attentive_lstm_lm": 70.92}
    pairs = [("positional_attentive_lstm_lm", "attentive_lstm_lm",
              "positional attention surpasses standard attention on test perplexity"),
             ("lstm_lm", "attentive_lstm_lm", "the LSTM baseline (Merity et al.'s, 3 layers) is best of the three"),
             ("lstm_lm", "positional_attentive_lstm_lm", "the LSTM baseline beats the positional model")]
    claims = []
    for suffix in ("", AUTHORS_BUDGET):
        claims += [Claim("lm", system + suffix, reference + suffix, "test_ppl", test[system], test[reference], DAGAN,
                         reading=reading) for system, reference, reading in pairs]
    claims += [Claim("lm", system, "tf_vanilla", "test_ppl")
               for system in ("tf_da", "tf_shaw16", "tf_direct_both", "tf_conv2d")]
    return claims


def _tagging() -> List[Claim]:
    """UPOS against Dufter's UD macro means (Table 2c; SAN and SAN+PE[con] only in the PTB table), XPOS
    (EWT's XPOS is the Penn Treebank tag set) against its PTB results (Table 2b)."""
    ud = {"pe_add": 92.40, "p_r": 92.82, "temp": 92.49, "conv": 94.21, "conv2d": 94.40}
    ptb = {"san": 94.62, "pe_con": 96.81, "pe_add": 96.82, "p_r": 96.88, "temp": 96.93, "conv": 96.93,
           "conv2d": 96.88}
    conv_reading = {"upos": "convolved attention yields much better results on UD",
                    "xpos": "convolved attention even achieves a slight improvement"}
    claims = []
    for group, table, source in (("upos", ud, DUFTER_UD), ("xpos", ptb, DUFTER_PTB)):
        rows = [("san", DIRECTION, "position information is needed: SAN is clearly worse", ptb, DUFTER_PTB),
                ("pe_con", NO_EFFECT, "concatenated and added position embeddings perform alike", ptb, DUFTER_PTB),
                ("p_r", NO_EFFECT, "SAN+P+R performs as well as SAN+PE[add]", table, source),
                ("temp", NO_EFFECT, "learnable temperature does not have any effect", table, source),
                ("conv", DIRECTION, conv_reading[group], table, source),
                ("conv2d", DIRECTION, conv_reading[group], table, source)]
        claims += [Claim("tagging", system, "pe_add", "accuracy", numbers[system], numbers["pe_add"], where, kind,
                         reading, group) for system, kind, reading, numbers, where in rows]
        claims += [Claim("tagging", system, "pe_add", "accuracy_epoch1", source=DUFTER_CURVE, group=group, sign=1,
                         reading="convolved attention learns faster: higher dev accuracy after the first epoch")
                   for system in ("conv", "conv2d")]
        # the authors' initialisations (our defaults) against our earlier ones: measured only
        claims += [Claim("tagging", system, earlier, metric, group=group)
                   for system, earlier in (("p_r", "p_r_zero"), ("conv", "conv_pt"), ("conv2d", "conv2d_pt"))
                   for metric in ("accuracy", "accuracy_epoch1")]
    return claims


def _classification() -> List[Claim]:
    """Wu et al.'s SST accuracies: Transformer 89.67, Transformer-RPR 89.94, DA-Transformer 90.49."""
    sst = {"vanilla": 89.67, "shaw": 89.94, "da": 90.49}
    return [
        Claim("classification", "shaw", "vanilla", "final_accuracy", sst["shaw"], sst["vanilla"], WU,
              reading="methods with distance information beat the vanilla Transformer"),
        Claim("classification", "da", "vanilla", "final_accuracy", sst["da"], sst["vanilla"], WU,
              reading="DA-Transformer beats the vanilla Transformer"),
        Claim("classification", "da", "shaw", "final_accuracy", sst["da"], sst["shaw"], WU,
              reading="DA-Transformer beats Transformer-RPR"),
        Claim("classification", "nopos", "vanilla", "final_accuracy"),
    ]


def extrapolation_metric(mode: str, multiplier: int) -> str:
    """The perplexity at ``multiplier`` x the training length, read ``mode``-wise (``nonoverlapping``, ``sliding``)."""
    return f"ppl_{mode}_x{multiplier}"


def _extrapolation() -> List[Claim]:
    """ALiBi's comparison (Press et al. 2022, Figure 1): past the training length the sinusoidal model's perplexity
    rises steeply, ALiBi's does not; the paper's figure reads the split in non-overlapping windows. The later
    methods' papers' claims against the baseline each beats (:data:`LATER_CLAIMS`), in non-overlapping windows at
    16 x (a claim past the training length) or at 1 x (one at it). Measured only: ALiBi against sinusoidal in the sliding window, every other method against
    sinusoidal at 16 x."""
    from evidence_plan import EXTRAPOLATION_MULTIPLIERS, EXTRAPOLATION_REFERENCE, systems_of

    reading = ("sinusoidal position embeddings do not extrapolate: past the training length their perplexity rises "
               "steeply while ALiBi's stays near its own")
    longest = EXTRAPOLATION_MULTIPLIERS[-1]
    claims = [Claim("extrapolation", "alibi", EXTRAPOLATION_REFERENCE, extrapolation_metric("nonoverlapping", m),
                    source=PRESS, sign=-1, reading=reading) for m in EXTRAPOLATION_MULTIPLIERS[1:]]
    claims.append(Claim("extrapolation", "alibi", EXTRAPOLATION_REFERENCE, extrapolation_metric("sliding", longest)))
    claims += [Claim("extrapolation", system, EXTRAPOLATION_REFERENCE, extrapolation_metric("nonoverlapping", longest))
               for system in systems_of("extrapolation") if system not in ("alibi", EXTRAPOLATION_REFERENCE)]
    claims += [Claim("extrapolation", system, reference, extrapolation_metric("nonoverlapping", multiplier),
                     source=source, sign=-1, reading=reading)
               for system, reference, source, reading, multiplier in LATER_CLAIMS]
    return claims


CLAIMS: List[Claim] = _translation() + _language_model() + _tagging() + _classification()


def claims_for(task: str, group: str = "") -> List[Claim]:
    """The claims of a task (and tag set); length extrapolation's are made when asked (listing its methods
    imports the plugin)."""
    if task == "extrapolation":
        return _extrapolation()
    return [claim for claim in CLAIMS if claim.task == task and claim.group == group]
