"""``attentive_lstm_lm`` (Salton et al. 2017), ``positional_attentive_lstm_lm`` (Dagan 2019) and
``baseline_lstm_lm``, Dagan's LSTM baseline.

The first two are LSTM language models that attend over their own past states (docs/methods.md); the
baseline is the same LSTM without attention, as the authors' code builds it (their model with attention
off, run in Merity et al.'s setting: 3 layers of 400, tied, dropout 0.4 / 0.25 / 0.5), ``logits_t = E
h_t + b``.
Notation: tokens x_1..x_T (fairseq's ``prev_output_tokens``; output t predicts target t), LSTM
states h_1..h_T of the top layer, H their size, N the position normalizer.

For the prediction after step t the model attends over the *memory* h_1..h_{t-1} (never h_t or a
later state), then::

    c_t      = sum_{i<t} a_it h_i                    (Dagan eq. 2 / 13; c_1 = 0: empty memory)
    out_t    = tanh(W_c [c_t ; h_t] + b_c)           (concatenation layer, 2H -> embedding size)
    logits_t = E out_t + b                           (output embedding E tied to the input one)

Salton (``attentive_lstm_lm``), Dagan eq. 1 and 4::

    score(h_i) = w_2 . tanh(W_1 h_i + b_1)           a_it = softmax_{i<t} score(h_i)

Dagan (``positional_attentive_lstm_lm``), eq. 5-13, with the clamp that eq. 8's text means::

    h~_t       = LSTM_pos(h_1..h_t)                  (position generator, hidden 20)
    b_t        = [mu_{t-1}, 1/N, t/N]                mu_0 = 0
    mu_t       = clamp(ReLU(W_mu h~_t + b_mu) . b_t, 0, t/N)
    sigma_t    = sigmoid(w_sigma . h~_t + b_sigma)
    gamma_it   = exp(-(i/N - mu_t)^2 / (2 sigma_t^2 + eps)),  normalised over i < t;  eps = 1e-3

The papers leave choices open; the authors' code, gautierdag/pytorch-attentive-lm, decides where it is
unambiguous (docs/methods.md has the table, row by row; each module's docstring states its own). The
memory h_1..h_{t-1}, the clamp of mu to [0, t/N], the 1-based positions i/N and the block N follow the
paper's text; the authors' code attends over h_t as well, bounds mu from below by the current state's
position, counts positions from 0 and uses the sentence length.

One job per module:

- :mod:`.language_models`: the three fairseq models, their options and architectures;
- :mod:`.decoder`: the LSTM decoder (memory, concatenation layer, output layer, incremental state,
  activation checkpointing);
- :mod:`.salton_attention`, :mod:`.positional_attention`: the two attentions over the memory, and
  :mod:`.memory_attention`, the causal softmax and weighted sum they share;
- :mod:`.numerics`: fp32 regions under mixed precision, subnormal flushing, CPU offloading.

Importing the package registers the models and architectures with fairseq.
"""

from fairseq_posattn.models.attentive_lstm import language_models  # noqa: F401  (registers them)
