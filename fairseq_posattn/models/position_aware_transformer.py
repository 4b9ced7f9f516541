"""Encoder and decoder that build position-aware layers and hand them one PositionContext per batch.

A side whose options ask for nothing builds fairseq's own layers and runs fairseq's own forward.
Otherwise it builds :mod:`~fairseq_posattn.modules.transformer_layer`'s layers and runs its own
loop over them: the embedding and layer steps are fairseq's, and the batch's
:class:`~posattn.position_context.PositionContext` is built once and passed to
every layer call as an argument (never stored on a module), so activation checkpointing, FSDP and
``torch.compile`` see it on every (re-)entry.
What a side does with its position options (the length check, the context, the record, the shared modules,
the layer wrapping) is :class:`~fairseq_posattn.models.position_side.PositionSide`'s.
"""

from typing import Any, Dict, List, Optional

import torch
from fairseq.models.transformer import TransformerDecoderBase, TransformerEncoderBase
from torch import Tensor, nn

from posattn.position_options import SidePositionOptions
from fairseq_posattn.models.position_side import PositionSide, PositionSideOwner
from posattn.position_context import PositionContext, SequenceTables
from posattn.position_terms.side_inputs import InputPositionEmbedding
from fairseq_posattn.modules.transformer_layer import (
    PositionAwareDecoderLayer,
    PositionAwareEncoderLayer,
)

IncrementalState = Dict[str, Dict[str, Optional[Tensor]]]


class PositionAwareTransformerEncoder(PositionSideOwner, TransformerEncoderBase):
    """fairseq's encoder; its self-attention layers get the ``--encoder-*`` position terms, and its input the
    position embedding that a method gives it (``position_input``), where one does."""

    def __init__(self, cfg: Any, dictionary: Any, embed_tokens: nn.Embedding,
                 position_options: SidePositionOptions, return_fc: bool = False):
        self.position_side = PositionSide(position_options, right_padded=False, causal=False)
        super().__init__(cfg, dictionary, embed_tokens, return_fc=return_fc)
        self.position_side.attach(self)
        self.position_input: Optional[InputPositionEmbedding] = self.position_side.input_embedding(
            embed_tokens.embedding_dim, self.padding_idx, sequential=self.embed_positions is not None)

    def build_encoder_layer(self, cfg: Any) -> nn.Module:
        if not self.position_options.needs_context():
            return super().build_encoder_layer(cfg)
        return self.position_side.next_layer(
            lambda index: PositionAwareEncoderLayer(cfg, self.position_options, index, return_fc=self.return_fc), cfg)

    def forward(self, src_tokens: Tensor, src_lengths: Optional[Tensor] = None,
                return_all_hiddens: bool = False, token_embeddings: Optional[Tensor] = None,
                **side_inputs: Tensor):
        """fairseq's encoder forward; ``side_inputs``: the side data that the task collated into ``net_input``
        beside the tokens (each ``(batch, rows, src_len)``, e.g. a parse), for the methods that read it."""
        if not self.position_options.needs_context():
            return self.forward_scriptable(src_tokens, src_lengths, return_all_hiddens, token_embeddings)
        ctx = self.position_side.context(src_tokens, self.padding_idx, side_inputs)
        x, embedding = self.embed_input(src_tokens, token_embeddings, ctx)
        x = x.masked_fill(ctx.padding_mask.unsqueeze(-1), 0.0).transpose(0, 1)
        states: List[Tensor] = [x] if return_all_hiddens else []
        fc_results: List[Optional[Tensor]] = []
        for layer in self.layers:
            out = layer(x, position_context=ctx)
            x, fc_result = out if isinstance(out, tuple) else (out, None)
            if return_all_hiddens:
                states.append(x)
                fc_results.append(fc_result)
        if self.layer_norm is not None:
            x = self.layer_norm(x)
        lengths = src_tokens.ne(self.padding_idx).sum(dim=1, dtype=torch.int32).reshape(-1, 1)
        return {
            "encoder_out": [x], "encoder_padding_mask": [ctx.padding_mask],
            "encoder_embedding": [embedding], "encoder_states": states, "fc_results": fc_results,
            "src_tokens": [], "src_lengths": [lengths],
        }

    def embed_input(self, src_tokens: Tensor, token_embedding: Optional[Tensor], ctx: PositionContext):
        """fairseq's ``forward_embedding``, with the positions of :attr:`position_input` (given the batch's
        context and the sequential positions) where a method gives the input a position embedding."""
        if self.position_input is None:
            return self.forward_embedding(src_tokens, token_embedding)
        if token_embedding is None:
            token_embedding = self.embed_tokens(src_tokens)
        x = embed = self.embed_scale * token_embedding
        sequential = self.embed_positions(src_tokens) if self.embed_positions is not None else None
        x = embed + self.position_input(ctx, sequential)
        if self.layernorm_embedding is not None:
            x = self.layernorm_embedding(x)
        x = self.dropout_module(x)
        if self.quant_noise is not None:
            x = self.quant_noise(x)
        return x, embed


class PositionAwareTransformerDecoder(PositionSideOwner, TransformerDecoderBase):
    """fairseq's decoder; its causal self-attention layers get the ``--decoder-*`` position terms."""

    def __init__(self, cfg: Any, dictionary: Any, embed_tokens: nn.Embedding,
                 position_options: SidePositionOptions, no_encoder_attn: bool = False,
                 output_projection: Optional[nn.Module] = None, right_padded: bool = True):
        """``right_padded``: the decoder's batches are padded on the right only (fairseq's target
        and language-model batches, unless ``--left-pad-target``), so token positions are indices."""
        self.position_side = PositionSide(position_options, right_padded, causal=True)
        super().__init__(cfg, dictionary, embed_tokens, no_encoder_attn=no_encoder_attn,
                         output_projection=output_projection)
        self.position_side.attach(self)

    def build_decoder_layer(self, cfg: Any, no_encoder_attn: bool = False) -> nn.Module:
        if not self.position_options.needs_context():
            return super().build_decoder_layer(cfg, no_encoder_attn)
        return self.position_side.next_layer(
            lambda index: PositionAwareDecoderLayer(cfg, self.position_options, index, no_encoder_attn=no_encoder_attn),
            cfg)

    def extract_features(
        self,
        prev_output_tokens: Tensor,
        encoder_out: Optional[Dict[str, List[Tensor]]] = None,
        incremental_state: Optional[IncrementalState] = None,
        full_context_alignment: bool = False,
        alignment_layer: Optional[int] = None,
        alignment_heads: Optional[int] = None,
    ):
        """fairseq's ``extract_features``, passing the batch's context to every layer."""
        if not self.position_options.needs_context():
            return self.extract_features_scriptable(
                prev_output_tokens, encoder_out, incremental_state,
                full_context_alignment, alignment_layer, alignment_heads)
        if full_context_alignment:
            raise ValueError("--decoder-* position terms are causal; full-context alignment is not supported")
        ctx = self.position_side.context(prev_output_tokens, self.padding_idx,
                                         tables=self.sequence_tables(incremental_state))
        source, source_padding = None, None
        if encoder_out is not None and len(encoder_out["encoder_out"]) > 0:
            source = encoder_out["encoder_out"][0]
        if encoder_out is not None and len(encoder_out["encoder_padding_mask"]) > 0:
            source_padding = encoder_out["encoder_padding_mask"][0]
        if alignment_layer is None:
            alignment_layer = self.num_layers - 1

        x = self.embed_targets(prev_output_tokens, incremental_state)
        causal = self.buffered_future_mask(x) if incremental_state is None else None
        attn: Optional[Tensor] = None
        inner_states: List[Optional[Tensor]] = [x]
        for index, layer in enumerate(self.layers):
            aligned = index == alignment_layer
            x, layer_attn, _ = layer(x, source, source_padding, incremental_state, position_context=ctx,
                                     self_attn_mask=causal, need_attn=aligned, need_head_weights=aligned)
            inner_states.append(x)
            if layer_attn is not None and aligned:
                attn = layer_attn.float().to(x)
        if attn is not None:
            attn = (attn if alignment_heads is None else attn[:alignment_heads]).mean(dim=0)
        if self.layer_norm is not None:
            x = self.layer_norm(x)
        x = x.transpose(0, 1)
        if self.project_out_dim is not None:
            x = self.project_out_dim(x)
        return x, {"attn": [attn], "inner_states": inner_states}

    def sequence_tables(self, incremental_state: Optional[IncrementalState]) -> Optional[SequenceTables]:
        """The position tables of the sequence being decoded (kept in ``incremental_state``, next to
        the layers' cached keys and values), or None outside incremental decoding."""
        if incremental_state is None:
            return None
        tables = self.get_incremental_state(incremental_state, "position_tables")
        if tables is None:
            tables = {}
            self.set_incremental_state(incremental_state, "position_tables", tables)
        return SequenceTables(self.max_positions(), tables)

    def embed_targets(self, tokens: Tensor, incremental_state: Optional[IncrementalState]) -> Tensor:
        """fairseq's decoder input, ``(length, batch, dim)``: scaled token embeddings plus positions
        (only the newest token's in incremental decoding), then layer norm and dropout."""
        positions = None
        if self.embed_positions is not None:
            positions = self.embed_positions(tokens, incremental_state=incremental_state)
        if incremental_state is not None:
            tokens = tokens[:, -1:]
            positions = positions[:, -1:] if positions is not None else None
        x = self.embed_scale * self.embed_tokens(tokens.contiguous())
        if self.quant_noise is not None:
            x = self.quant_noise(x)
        if self.project_in_dim is not None:
            x = self.project_in_dim(x)
        if positions is not None:
            x = x + positions
        if self.layernorm_embedding is not None:
            x = self.layernorm_embedding(x)
        return self.dropout_module(x).transpose(0, 1)
