"""Dagan 2019's positional attention over the memory, the attention of ``positional_attentive_lstm_lm``
(eq. 5-13, with the clamp that eq. 8's text means; the equations of the whole model: the package
docstring).

Choices (the authors' code, gautierdag/pytorch-attentive-lm, decides where it is unambiguous;
docs/methods.md has the table):

* eps (``--positional-attention-eps``): 1e-3, the authors' value (their ``10e-4``). It is part of the
  function: with N = 35, the neighbour of the Gaussian's peak keeps at least 0.44 of its weight
  however small sigma gets, where 1e-6 lets the attention focus on a single state. Models trained
  when the default was 1e-6 keep it: :class:`PositionalAttention` saves an integer ``version``
  buffer, and a state dict without one (version 1) is loaded with eps 1e-6
  (``upgrade_state_dict_named``, which fairseq's checkpoint loading calls).
* The normalisation of gamma is computed as a softmax of the Gaussian log-scores, which is the same
  function as exp(.) / sum exp(.) but never divides 0 by 0 when every exp underflows.
* W_mu and w_sigma are affine (``nn.Linear`` with bias), as in the authors' code.

The only loop over time is the scalar mu recurrence (fp32), vectorised over the batch: each step is a
few elementwise ops on B numbers, so on a GPU the eager loop is bound by kernel launches (about 4 per
step and as many again backward, 35 steps a block). Where it runs (:meth:`PositionalAttention.recur_mu`):

* CUDA (default): compiled, :func:`compiled_recur_mu`. ``torch.compile(fullgraph=True)`` (inductor) of
  :func:`packed_mu_steps`, the same loop over a fixed :data:`COMPILED_MU_STEPS` = 35 steps (the
  paper's block and sentence clip), which inductor fuses into a few kernels forward and backward. S
  steps take ceil(S / 35) calls, the last padded with zero weights (mu 0 there, cut off, no
  gradient), so every length shares one graph; the batch size is a symbol (a batch of 1 has its own
  graph), and mu_{t-1} travels packed with the weights, so that training has one graph and
  evaluation without gradients another: far below dynamo's recompile limit (8). The first call on a
  device (in each grad mode) runs the compiled function forward and backward on a small batch of its
  own; a compiler that fails there or later (none installed, an unsupported platform, the recompile
  limit, torch installed under a path with spaces: :func:`inductor_path_obstacle`) leaves one warning
  naming the cause, and the eager loop runs on that device from then on.
  On the CPU the compiled function gives bit-identical mu and gradients
  (``tests/test_lstm_lm_compiled.py``, which ``--device cuda`` runs on a GPU).
* CPU (default), single steps (incremental decoding), inside a ``torch.compile`` of the whole model
  (which traces the loop itself) and under a ``TorchDispatchMode`` (which dynamo does not trace): the
  eager loop, :func:`mu_steps`. On the CPU the compiled recurrence trains 1.01-1.06x faster (Dagan's
  model at the paper's sizes, batch 32, 2 cores) for a compilation of about 5 s with inductor's cache
  warm and 30-40 s cold: no clear gain.
* :func:`set_mu_recurrence` (``auto``, ``compiled``, ``eager``) sets it for the process
  (``scripts/benchmark_lstm_lm.py --mu-recurrence eager compiled`` times both).

The recurrence is not rewritten as an associative scan (a composition of clamped affine maps): the
composed products of the a_t overflow to inf where the loop stays bounded, and backward then gives
0 * inf = NaN.
"""

import functools
import logging
import os
from typing import Callable, Dict, Optional, Set, Tuple

import torch
import torch.nn.functional as F
from fairseq.models.lstm import LSTM, Linear
from torch import Tensor, nn
from torch.utils._python_dispatch import _get_current_dispatch_mode

from fairseq_posattn.models.attentive_lstm.memory_attention import causal_memory_attention
from fairseq_posattn.models.attentive_lstm.numerics import fp32_linear, full_precision

GAUSSIAN_EPS = 1e-3  # the authors' code (model.py, written 10e-4)
LEGACY_GAUSSIAN_EPS = 1e-6  # models trained before the default became 1e-3 (version 1, no ``version`` buffer)
POSITIONAL_ATTENTION_VERSION = 2  # saved as PositionalAttention's ``version`` buffer

LSTMState = Tuple[Tensor, Tensor]

logger = logging.getLogger(__name__)

#: the steps of one call of the compiled mu recurrence: the paper's block (``--tokens-per-sample 35``,
#: sentences clipped at 35). S steps take ceil(S / 35) calls, the last one padded with zero weights
COMPILED_MU_STEPS = 35
#: :func:`set_mu_recurrence`'s choices: ``auto`` (compiled on CUDA, the eager loop elsewhere),
#: ``compiled`` (on every device), ``eager`` (nowhere)
MU_RECURRENCES = ("auto", "compiled", "eager")
_setting = {"mu_recurrence": "auto"}
_compile_failures: Dict[str, str] = {}  # device type -> why the compiled recurrence does not run there
_compile_checked: Set[Tuple[str, bool, bool]] = set()  # (device type, grad mode, needs a gradient) tried
#: the folder of the torch installation, whose headers and libraries inductor's C++ compile commands name
TORCH_DIR = os.path.dirname(torch.__file__)


def set_mu_recurrence(mode: str) -> str:
    """Which mu recurrence :meth:`PositionalAttention.recur_mu` runs in this process, one of
    :data:`MU_RECURRENCES` (default ``auto``); returns the previous setting."""
    if mode not in MU_RECURRENCES:
        raise ValueError(f"the mu recurrence must be one of {MU_RECURRENCES}, not {mode!r}")
    previous, _setting["mu_recurrence"] = _setting["mu_recurrence"], mode
    return previous


def compiled_mu_failures() -> Dict[str, str]:
    """Why the compiled recurrence stopped running on each device type where it failed (the eager loop
    runs there instead)."""
    return dict(_compile_failures)


def step_positions(offset: int, steps: int, like: Tensor) -> Tensor:
    """The steps t = offset+1..offset+``steps`` as an fp32 vector on the device of ``like``."""
    return torch.arange(offset + 1, offset + steps + 1, device=like.device, dtype=torch.float32)


def mu_steps(mu_weights: Tensor, prev_mu: Tensor, normalizer: Tensor, positions: Tensor) -> Tensor:
    """mu_t = clamp(mu_weights_t . [mu_{t-1}, 1/N, t/N], 0, t/N) for the S = ``mu_weights.size(1)``
    steps t in ``positions`` (S, fp32), from mu = ``prev_mu`` (B) before the first; normalizer B x 1.
    The eager loop (one vector op over the batch per step), and the function that is compiled."""
    t_over_n = positions.unsqueeze(0) / normalizer  # B x S
    # the building blocks 1/N and t/N do not depend on mu: take them out of the loop
    known = mu_weights[..., 1] / normalizer + mu_weights[..., 2] * t_over_n
    carry = mu_weights[..., 0]
    mus = []
    mu = prev_mu
    for s in range(mu_weights.size(1)):
        mu = torch.minimum((carry[:, s] * mu + known[:, s]).clamp(min=0.0), t_over_n[:, s])
        mus.append(mu)
    return torch.stack(mus, dim=1)


def packed_mu_steps(packed: Tensor, normalizer: Tensor, positions: Tensor) -> Tensor:
    """:func:`mu_steps` of ``packed`` = [prev_mu ; mu_weights] (B x (1 + S) x 3, prev_mu in
    ``packed[:, 0, 0]``): what is compiled. One tensor that needs a gradient whenever either part does,
    so that dynamo keeps one graph for training (and one without gradients), not one per
    combination of gradient flags."""
    return mu_steps(packed[:, 1:], packed[:, 0, 0], normalizer, positions)


@functools.cache
def compiled_mu_steps() -> Callable[..., Tensor]:
    """:func:`packed_mu_steps` compiled (made once per process; dynamo keeps a graph per device and
    grad mode, the batch size a symbol)."""
    return torch.compile(packed_mu_steps, fullgraph=True)


def inductor_path_obstacle() -> Optional[str]:
    """Why inductor's C++ compiler cannot build here, known beforehand: torch installed under a path with
    whitespace, which inductor writes into the compiler's include and library options unquoted (pytorch issue
    #149713), so every C++ compile fails there; None where :data:`TORCH_DIR` has no whitespace."""
    if not any(character.isspace() for character in TORCH_DIR):
        return None
    return (f"torch is installed under a path with whitespace ({TORCH_DIR!r}), which inductor passes to the C++ "
            "compiler unquoted (pytorch issue #149713): an environment whose path has no spaces compiles it")


def uses_compiled_mu(mu_weights: Tensor) -> bool:
    """Whether :meth:`PositionalAttention.recur_mu` takes the compiled recurrence for these weights:
    as :func:`set_mu_recurrence` says (``auto``: on CUDA), for more than one step (a single step,
    incremental decoding, is a few ops either way), outside a ``torch.compile`` graph (which traces
    the loop itself) and a ``TorchDispatchMode`` (which dynamo does not trace), and on a device where
    it has not failed."""
    mode, device = _setting["mu_recurrence"], mu_weights.device.type
    if mode == "eager" or (mode == "auto" and device != "cuda") or mu_weights.size(1) < 2:
        return False
    if torch.compiler.is_compiling() or device in _compile_failures:
        return False
    return _get_current_dispatch_mode() is None


def compiled_recur_mu(mu_weights: Tensor, prev_mu: Tensor, normalizer: Tensor, offset: int) -> Tensor:
    """:meth:`PositionalAttention.recur_mu` through the compiled :func:`packed_mu_steps`, in calls of
    :data:`COMPILED_MU_STEPS` steps (the last padded with zero weights, whose mu is 0; their steps are
    cut off and give no gradient). The first time on a device in a grad mode (with or without inputs
    that need a gradient), the compiled function runs on a small batch of its own, forward and, with
    a gradient, backward (which inductor may compile only when it first runs), so that a compiler
    that fails (none installed, an unsupported platform) fails here, where the eager loop can take
    over: then, as on any later failure of the compiled call (dynamo's recompile limit), one warning
    names the cause and the eager loop runs on that device for the rest of the process."""
    device = mu_weights.device.type
    needs_grad = mu_weights.requires_grad or prev_mu.requires_grad
    graph = (device, torch.is_grad_enabled(), needs_grad)
    try:
        if graph not in _compile_checked:
            _try_compiled_mu(mu_weights.device, needs_grad)
            _compile_checked.add(graph)
        return _compiled_chunks(mu_weights, prev_mu, normalizer, offset)
    except torch.OutOfMemoryError:  # the batch's, not the compiler's: fairseq's trainer may retry it
        raise
    except Exception as error:  # noqa: BLE001 (any compiler failure: the eager loop computes the same)
        cause = f"{type(error).__name__}: {(str(error).strip().splitlines() or [''])[0][:300]}"
        _compile_failures[device] = cause
        obstacle = inductor_path_obstacle()
        logger.warning(f"positional attention: the compiled mu recurrence failed on {device} ({cause}); "
                       f"the eager loop runs there instead{f'. {obstacle}' if obstacle else ''}")
        return mu_steps(mu_weights, prev_mu, normalizer, step_positions(offset, mu_weights.size(1), mu_weights))


def _compiled_chunks(mu_weights: Tensor, prev_mu: Tensor, normalizer: Tensor, offset: int) -> Tensor:
    steps, chunk = mu_weights.size(1), COMPILED_MU_STEPS
    padded = -(-steps // chunk) * chunk
    if padded > steps:  # zero weights: mu = min(max(0, 0), t/N) = 0 on the padded steps
        mu_weights = F.pad(mu_weights, (0, 0, 0, padded - steps))
    compiled = compiled_mu_steps()
    torch._dynamo.maybe_mark_dynamic(normalizer, 0)  # one graph for every batch size above 1
    parts = []
    mu = prev_mu
    for start in range(0, padded, chunk):
        if start:
            mu = parts[-1][:, -1]
        packed = torch.cat([F.pad(mu.reshape(-1, 1, 1), (0, 2)), mu_weights[:, start:start + chunk]], dim=1)
        torch._dynamo.maybe_mark_dynamic(packed, 0)
        parts.append(compiled(packed, normalizer, step_positions(offset + start, chunk, packed)))
    mus = parts[0] if len(parts) == 1 else torch.cat(parts, dim=1)
    return mus[:, :steps] if padded > steps else mus


def _try_compiled_mu(device: torch.device, needs_grad: bool) -> None:
    """Runs the compiled recurrence on a batch of 2 random rows on ``device``, its weights needing a
    gradient as ``needs_grad`` says, in the caller's grad mode (the graph the caller's batch takes),
    and backward when there is a gradient; raises what the compiler raises. Its own random generator,
    none of the caller's saved tensor hooks (activation checkpointing, offloading), no autocast."""
    generator = torch.Generator().manual_seed(0)
    weights = (torch.rand(2, COMPILED_MU_STEPS, 3, generator=generator) * 2).to(device)
    prev_mu = torch.rand(2, generator=generator).to(device)
    normalizer = torch.full((2, 1), float(COMPILED_MU_STEPS), device=device)
    with torch.autograd.graph.saved_tensors_hooks(lambda saved: saved, lambda saved: saved), \
            torch.autocast(device.type, enabled=False):
        weights.requires_grad_(needs_grad)
        mu = _compiled_chunks(weights, prev_mu, normalizer, 0)
        if mu.requires_grad:
            torch.autograd.grad(mu.sum(), weights)


class PositionalAttention(nn.Module):
    """Positional attention over the memory (Dagan 2019, eq. 5-13).

    A position-generator LSTM over the states gives h~_t; ``mu_t = clamp(ReLU(W_mu h~_t) . b_t, 0,
    t/N)`` with ``b_t = [mu_{t-1}, 1/N, t/N]``; ``sigma_t = sigmoid(w_sigma . h~_t)``; the weight of
    h_i (i < t) is the Gaussian ``exp(-(i/N - mu_t)^2 / (2 sigma_t^2 + eps))``, normalised over
    i < t.

    The position generator LSTM runs in the model's dtype; everything after it (the W_mu and
    w_sigma heads, the sigmoid, the mu recurrence, the positions i/N, the Gaussian log-scores and
    their softmax) in fp32: in bf16 the positions i/N of a 1024-token block are not even distinct,
    and in fp16 the gradient of the log-score overflows once sigma is below about 0.04. mu (and
    the cached mu) are fp32; context and weights come back in the model's dtype.

    ``eps`` (``--positional-attention-eps``, default 1e-3 as the authors' code) is part of the
    function. The integer buffer ``version`` (2), saved in the state dict, marks models built since
    that default; a state dict without it (version 1, trained when eps was 1e-6) sets eps to
    ``LEGACY_GAUSSIAN_EPS`` = 1e-6 when fairseq loads it (:meth:`upgrade_state_dict_named`), and keeps
    version 1 when saved again.
    """

    def __init__(self, hidden_size: int, generator_size: int = 20, eps: float = GAUSSIAN_EPS) -> None:
        super().__init__()
        if not eps >= 0:
            raise ValueError(f"--positional-attention-eps must not be negative, got {eps}")
        self.position_generator = LSTM(hidden_size, generator_size, batch_first=True)
        self.W_mu = Linear(generator_size, 3)
        self.w_sigma = Linear(generator_size, 1)
        self.configured_eps = eps
        self.eps = eps
        # integer: .half() / .to(dtype) leave it alone; fairseq's EMA skips keys named "version"
        self.register_buffer("version", torch.tensor([POSITIONAL_ATTENTION_VERSION]))

    def upgrade_state_dict_named(self, state_dict: Dict[str, Tensor], name: str) -> Dict[str, Tensor]:
        """Called by fairseq's ``load_state_dict`` (``BaseFairseqModel.upgrade_state_dict``) before
        the weights are copied: a state dict without ``<name>.version`` comes from a model trained
        when eps was 1e-6; it gets version 1, and this module eps 1e-6 (whatever the arguments say,
        which such a checkpoint does not hold). Version 2: the eps the module was built with."""
        key = f"{name}.version" if name else "version"
        version = state_dict.setdefault(key, torch.tensor([1]))
        self.eps = LEGACY_GAUSSIAN_EPS if int(version[0]) == 1 else self.configured_eps
        return state_dict

    def initialise_as_authors(self) -> None:
        """PyTorch's defaults, as the authors' code: the position generator U(+-1/sqrt(20)), W_mu and
        w_sigma U(+-1/sqrt(fan_in)), weights and biases."""
        self.position_generator.reset_parameters()
        self.W_mu.reset_parameters()
        self.w_sigma.reset_parameters()

    def generate(self, h: Tensor, state: Optional[LSTMState] = None) -> Tuple[Tensor, Tensor, LSTMState]:
        """Position generator (eq. 5, 7, 9): B x S x H -> mu weights (B x S x 3, after the ReLU),
        sigma (B x S), both fp32, and the generator's final (h, c)."""
        h_tilde, state = self.position_generator(h, state)
        with full_precision(h.device):
            mu_weights = F.relu(fp32_linear(self.W_mu, h_tilde))
            sigma = torch.sigmoid(fp32_linear(self.w_sigma, h_tilde)).squeeze(-1)
        return mu_weights, sigma, state

    @staticmethod
    def recur_mu(mu_weights: Tensor, prev_mu: Tensor, normalizer: Tensor, offset: int) -> Tensor:
        """mu_t = clamp(mu_weights_t . [mu_{t-1}, 1/N, t/N], 0, t/N) for t = offset+1..offset+S
        (eq. 6, 8): the compiled recurrence where it is used (:func:`uses_compiled_mu`), else the
        eager loop (:func:`mu_steps`), one vector op per step over the batch.

        mu_weights: B x S x 3; prev_mu: B (mu_offset, 0 at the start); normalizer: B x 1; all
        fp32 (the caller's). Returns B x S."""
        if uses_compiled_mu(mu_weights):
            return compiled_recur_mu(mu_weights, prev_mu, normalizer, offset)
        return mu_steps(mu_weights, prev_mu, normalizer, step_positions(offset, mu_weights.size(1), mu_weights))

    def gaussian_log_scores(self, mu: Tensor, sigma: Tensor, normalizer: Tensor, keys: int) -> Tensor:
        """``log gamma_it = -(i/N - mu_t)^2 / (2 sigma_t^2 + eps)`` (eq. 10, 12) of the memory positions
        i = 1..``keys``: B x S x K. mu, sigma (B x S) and normalizer (B x 1) fp32 (the caller's)."""
        position = torch.arange(1, keys + 1, device=mu.device, dtype=torch.float32)
        position = position.unsqueeze(0) / normalizer  # B x K: p_i = i / N (eq. 12)
        distance = position.unsqueeze(1) - mu.unsqueeze(2)  # B x S x K
        return -distance.pow(2) / (2 * sigma.pow(2).unsqueeze(2) + self.eps)  # eq. 10

    def forward(
        self,
        h: Tensor,
        memory: Tensor,
        offset: int,
        normalizer: Tensor,
        prev_mu: Optional[Tensor] = None,
        generator_state: Optional[LSTMState] = None,
    ) -> Tuple[Tensor, Tensor, Tensor, LSTMState]:
        """Contexts of the S new steps.

        Args:
            h: B x S x H new states (steps offset+1..offset+S).
            memory: B x K x H all states so far (K = offset + S; the last S are ``h``).
            offset: steps before ``h``.
            normalizer: B x 1 N (cast to fp32).
            prev_mu: B, mu_offset (None: mu_0 = 0).
            generator_state: the position generator's (h, c) after step ``offset``.

        Returns:
            context (B x S x H) and weights (B x S x K) in the dtype of ``memory``, mu (B x S,
            fp32), generator state.
        """
        mu_weights, sigma, generator_state = self.generate(h, generator_state)
        with full_precision(h.device):
            normalizer = normalizer.float()
            if prev_mu is None:
                prev_mu = torch.zeros(h.size(0), device=h.device, dtype=torch.float32)
            mu = self.recur_mu(mu_weights, prev_mu.float(), normalizer, offset)
            log_gamma = self.gaussian_log_scores(mu, sigma, normalizer, memory.size(1))
        context, weights = causal_memory_attention(log_gamma, memory, offset)  # eq. 11, 13
        return context, weights, mu, generator_state
