"""``transformer_lm_posattn``: fairseq's transformer language model with position-aware causal
self-attention (every ``--decoder-*`` option of docs/methods.md).

The base architecture takes its defaults from the dataclass, as fairseq's ``transformer_lm`` does;
size presets mirror fairseq's ``transformer_lm``, ``transformer_lm_big``,
``transformer_lm_wiki103`` and ``transformer_lm_gpt``. t, the largest sequence the direct positions
and the 1d convolution accept, is ``--max-target-positions`` (by default ``--tokens-per-sample``).
"""

from dataclasses import dataclass
from typing import Any, List, Optional

from fairseq.models import register_model, register_model_architecture
from fairseq.models.transformer import TransformerConfig
from fairseq.modules import LearnedPositionalEmbedding
from fairseq.models.transformer_lm import (
    TransformerLanguageModel,
    TransformerLanguageModelConfig,
    transformer_lm_baevski_wiki103,
    transformer_lm_big,
    transformer_lm_gpt,
)

from fairseq_posattn.models.evaluation_coverage import score_every_block
from fairseq_posattn.models.hub_loading import PosattnHubMixin
from fairseq_posattn.models.position_aware_transformer import PositionAwareTransformerDecoder
from fairseq_posattn.models.position_options import DecoderPositionConfig, set_position_defaults
from posattn.position_options import PositionOptionError, SidePositionOptions
from fairseq_posattn.models.position_side import set_layer_wrapping_defaults
from posattn.position_terms.base import check_loaded_positions

MAX_POSITIONS_OPTION = "--max-target-positions (default: --tokens-per-sample)"


@dataclass
class TransformerLanguageModelPosattnConfig(TransformerLanguageModelConfig, DecoderPositionConfig):
    """fairseq's ``transformer_lm`` options plus the ``--decoder-*`` position options."""


@register_model("transformer_lm_posattn", dataclass=TransformerLanguageModelPosattnConfig)
class PositionAwareTransformerLanguageModel(PosattnHubMixin, TransformerLanguageModel):
    @classmethod
    def build_model(cls, args: Any, task: Any):
        # fairseq's build_model sets the defaults (max_target_positions from tokens_per_sample) and
        # the input embedding (plain, character or adaptive); only the decoder is ours.
        embed_tokens = super().build_model(args, task).decoder.embed_tokens
        set_layer_wrapping_defaults(args)  # the base architecture has no base_lm_architecture call
        cfg = TransformerConfig.from_namespace(args)
        # from_namespace drops the extra keys of a hydra DictConfig: read our options from args
        options = SidePositionOptions.from_config(
            args, "decoder", causal=True, max_positions=cfg.max_target_positions,
            max_positions_option=MAX_POSITIONS_OPTION,
        )
        check_block_fits(options, task)
        decoder = PositionAwareTransformerDecoder(
            cfg, task.target_dictionary, embed_tokens, options, no_encoder_attn=True
        )
        limit = fixed_limit(options, args)
        score_every_block(task, limit)
        model = cls(decoder)
        model.fixed_position_limit = limit  # what the hub's score names when a sequence is too long
        return model

    def upgrade_state_dict_named(self, state_dict, name):
        """Learned position embeddings of t positions loaded into a model built for another t (a
        ``max_target_positions`` override) are refused in one line, as the position terms refuse theirs:
        PyTorch would print a "size mismatch" traceback."""
        embed = getattr(self.decoder, "embed_positions", None)
        if isinstance(embed, LearnedPositionalEmbedding):
            key = f"{name}.decoder.embed_positions.weight" if name else "decoder.embed_positions.weight"
            loaded, extra = state_dict.get(key), embed.padding_idx + 1  # rows before position 0
            check_loaded_positions(state_dict, key, embed.weight.shape,
                                   "the learned position embedding (--decoder-learned-pos)",
                                   embed.weight.size(0) - extra, loaded.size(0) - extra if loaded is not None else 0)
        super().upgrade_state_dict_named(state_dict, name)


def fixed_limit(options: SidePositionOptions, args: Any) -> Optional[str]:
    """What ties the model to its t positions, by flag (None where only ``max_target_positions`` does)."""
    tied = tied_method_flags(options)
    if getattr(args, "decoder_learned_pos", False) and not getattr(args, "no_token_positional_embeddings", False):
        tied.insert(0, "learned position embeddings (--decoder-learned-pos)")
    return " and ".join(tied) or None


def tied_method_flags(options: SidePositionOptions) -> List[str]:
    """The flags of the methods on the side that keep parameters per position up to t."""
    return [method_flags(method, options) for method in options.methods() if method.needs_max_positions(options)]


def method_flags(method: Any, options: SidePositionOptions) -> str:
    """The flag (and value) that switches ``method`` on, e.g. ``--decoder-direct-position relative``."""
    name = method.options[0].name
    value = getattr(options, name)
    return options.flag(name) if value is True else f"{options.flag(name)} {value}"


def check_block_fits(options: Any, task: Any) -> None:
    """``--tokens-per-sample`` longer than t would only fail at the first long batch: fail now."""
    task_cfg = getattr(task, "args", None) or getattr(task, "cfg", None)
    tokens_per_sample = getattr(task_cfg, "tokens_per_sample", None)
    if options.needs_max_positions() and tokens_per_sample is not None and tokens_per_sample > options.max_positions:
        tied = " and ".join(tied_method_flags(options))
        raise PositionOptionError(
            f"--tokens-per-sample {tokens_per_sample} is longer than the {options.max_positions} "
            f"positions that {tied} learns: to train, raise --max-target-positions to at "
            f"least {tokens_per_sample}; to evaluate a trained model, use --tokens-per-sample "
            f"{options.max_positions} or less")


@register_model_architecture("transformer_lm_posattn", "transformer_lm_posattn_big")
def posattn_lm_big(args):
    set_position_defaults(args, ["decoder"])
    transformer_lm_big(args)


@register_model_architecture("transformer_lm_posattn", "transformer_lm_posattn_wiki103")
def posattn_lm_wiki103(args):
    set_position_defaults(args, ["decoder"])
    transformer_lm_baevski_wiki103(args)


@register_model_architecture("transformer_lm_posattn", "transformer_lm_posattn_gpt")
def posattn_lm_gpt(args):
    set_position_defaults(args, ["decoder"])
    transformer_lm_gpt(args)
