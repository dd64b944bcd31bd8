"""The authors' EDMem forward pass at inference (github DM2-ND/EDMem, src/Model.py, Encoder.py, Decoder.py,
EntityMemory.py), re-expressed in plain torch over a state dict in their layout, to check conversions against.

Facts taken from their code: BART post-LayerNorm layers; decoder positions `cumsum(decoder mask) - 1` (0 on
padding); the memory reads the top-k entities of `InputLayer(h)` (softmax over those k) at each `<E_s>`, and the
upper stacks receive `LayerNorm(h + OutputLayer(read))`; the lower decoder cross-attends to the lower encoder
output before the merge (`lower_encoder`) or to the final encoder output (`upper_encoder`); logits are
`h @ shared.T + final_logits_bias`; the entity-linking head scores `InputLayer(h)` against the table.
"""

from __future__ import annotations

import torch
from torch.nn import functional as F

NEG = torch.finfo(torch.float32).min


def _attention(sd, prefix, hidden, source, mask, heads):
    """Multi-head attention of `hidden` over `source`; `mask` is additive, broadcastable to (B, 1, T, S)."""
    batch, length, width = hidden.shape
    head_dim = width // heads

    def project(name, x):
        out = F.linear(x, sd[f"{prefix}.{name}.weight"], sd[f"{prefix}.{name}.bias"])
        return out.view(batch, -1, heads, head_dim).transpose(1, 2)

    query = project("q_proj", hidden) * head_dim**-0.5
    key, value = project("k_proj", source), project("v_proj", source)
    weights = torch.softmax(query @ key.transpose(-1, -2) + mask, dim=-1)
    context = (weights @ value).transpose(1, 2).reshape(batch, length, width)
    return F.linear(context, sd[f"{prefix}.out_proj.weight"], sd[f"{prefix}.out_proj.bias"])


def _norm(sd, prefix, x):
    return F.layer_norm(x, x.shape[-1:], sd[f"{prefix}.weight"], sd[f"{prefix}.bias"])


def _feed_forward(sd, prefix, x):
    hidden = F.gelu(F.linear(x, sd[f"{prefix}.fc1.weight"], sd[f"{prefix}.fc1.bias"]))
    return _norm(
        sd, f"{prefix}.final_layer_norm", x + F.linear(hidden, sd[f"{prefix}.fc2.weight"], sd[f"{prefix}.fc2.bias"])
    )


def _encoder_layer(sd, prefix, x, mask, heads):
    x = _norm(sd, f"{prefix}.self_attn_layer_norm", x + _attention(sd, f"{prefix}.self_attn", x, x, mask, heads))
    return _feed_forward(sd, prefix, x)


def _decoder_layer(sd, prefix, x, self_mask, source, cross_mask, heads):
    x = _norm(sd, f"{prefix}.self_attn_layer_norm", x + _attention(sd, f"{prefix}.self_attn", x, x, self_mask, heads))
    cross = _attention(sd, f"{prefix}.encoder_attn", x, source, cross_mask, heads)
    x = _norm(sd, f"{prefix}.encoder_attn_layer_norm", x + cross)
    return _feed_forward(sd, prefix, x)


def _memory(sd, name, norm, hidden, input_ids, start_id, top_k):
    """The memory read at each `<E_s>` (top-k softmax), merged by the LayerNorm; also the top-k entity ids."""
    table = sd["EntityEmbedding.weight"]  # (entity_dim, rows)
    update = torch.zeros_like(hidden)
    at = input_ids == start_id
    query = F.linear(hidden[at], sd[f"{name}.InputLayer.linear.weight"], sd[f"{name}.InputLayer.linear.bias"])
    values, ids = torch.topk(query @ table, top_k, dim=1)
    read = (torch.softmax(values, dim=1)[:, :, None] * table.t()[ids]).sum(1)
    update[at] = F.linear(read, sd[f"{name}.OutputLayer.linear.weight"], sd[f"{name}.OutputLayer.linear.bias"])
    return _norm(sd, norm, hidden + update), ids


def _layers(sd, stack):
    count = 0
    while f"{stack}.layers.{count}.fc1.weight" in sd:
        count += 1
    return count


def authors_forward(
    sd, input_ids, attention_mask, decoder_input_ids, decoder_attention_mask, *, heads, start_id, top_k, lower_encoder
):
    """Logits `(B, T, V)`, the entity-linking head's top-k ids at each decoder `<E_s>`, and the encoder memory's."""
    shared = sd["shared.weight"]
    pad_mask = (1.0 - attention_mask[:, None, None, :].float()) * NEG
    # encoder: embeddings (positions 0..S-1, offset 2), lower layers, memory, upper layers
    positions = torch.arange(input_ids.shape[1]) + 2
    x = shared[input_ids] + sd["LowerEncoder.embed_positions.weight"][positions]
    x = _norm(sd, "LowerEncoder.layernorm_embedding", x)
    for i in range(_layers(sd, "LowerEncoder")):
        x = _encoder_layer(sd, f"LowerEncoder.layers.{i}", x, pad_mask, heads)
    lower_output = x
    x, encoder_top = _memory(sd, "EncoderEntityMemory", "EncoderMemoryLayerNorm", x, input_ids, start_id, top_k)
    for i in range(_layers(sd, "UpperEncoder")):
        x = _encoder_layer(sd, f"UpperEncoder.layers.{i}", x, pad_mask, heads)
    encoder_output = x
    # decoder: positions from the decoder mask, causal and padding masks
    length = decoder_input_ids.shape[1]
    positions = (decoder_attention_mask.cumsum(-1) - 1).masked_fill(decoder_attention_mask == 0, 0) + 2
    y = shared[decoder_input_ids] + sd["LowerDecoder.embed_positions.weight"][positions]
    y = _norm(sd, "LowerDecoder.layernorm_embedding", y)
    causal = torch.triu(torch.full((length, length), NEG), diagonal=1)
    self_mask = (causal[None, None] + (1.0 - decoder_attention_mask[:, None, None, :].float()) * NEG).clamp(min=NEG)
    lower_source = lower_output if lower_encoder else encoder_output
    for i in range(_layers(sd, "LowerDecoder")):
        y = _decoder_layer(sd, f"LowerDecoder.layers.{i}", y, self_mask, lower_source, pad_mask, heads)
    y, _ = _memory(sd, "DecoderEntityMemory", "DecoderMemoryLayerNorm", y, decoder_input_ids, start_id, top_k)
    for i in range(_layers(sd, "UpperDecoder")):
        y = _decoder_layer(sd, f"UpperDecoder.layers.{i}", y, self_mask, encoder_output, pad_mask, heads)
    logits = y @ shared.t() + sd["final_logits_bias"]
    query = F.linear(
        y[decoder_input_ids == start_id],
        sd["EntityLinkHead.InputLayer.linear.weight"],
        sd["EntityLinkHead.InputLayer.linear.bias"],
    )
    head_top = torch.topk(query @ sd["EntityEmbedding.weight"], top_k, dim=1).indices
    return logits, head_top, encoder_top
