"""The authors' EDMem and EncMem forward passes and losses (github DM2-ND/EDMem, src/Model.py, Autoencoder.py,
Encoder.py, Decoder.py, EntityMemory.py, Modules.py), re-expressed in plain torch over a state dict in their layout,
with dropout off, to check conversions against.

Facts taken from their code: BART post-LayerNorm layers; decoder positions `cumsum(decoder mask) - 1` (0 on
padding); the memory reads, at each `<E_s>`, the top-k entities of `InputLayer(h)` (softmax over those k) at
inference and all entities in training, and the upper stacks receive `LayerNorm(h + OutputLayer(read))`; the lower
decoder cross-attends to the lower encoder output before the merge (`lower_encoder`) or to the final encoder output
(`upper_encoder`); EDMem's logits are `h @ shared.T + final_logits_bias`, EncMem's go through a BERT-style head
(`dense, gelu, LayerNorm`, then `@ shared.T + bias`); the entity-linking head scores `InputLayer(h)` against the
table. Training losses: cross-entropy of the labels, and at each access the NLL of the gold entity under the
softmax over all rows (label 0 means none), the accesses' NLLs summed and divided by their number (3 for EDMem:
encoder, decoder, head; 2 for EncMem), weighted by lambda.
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


def _link(sd, name, hidden, input_ids, start_id, top_k, labels):
    """The access's scores at each `<E_s>`: the top-k ids and their softmax weights at inference, or (labels
    given: training) the softmax over all rows and the mean NLL of the labelled mentions."""
    table = sd["EntityEmbedding.weight"]  # (entity_dim, rows)
    at = input_ids == start_id
    query = F.linear(hidden[at], sd[f"{name}.InputLayer.linear.weight"], sd[f"{name}.InputLayer.linear.bias"])
    scores = query @ table
    if labels is None:
        values, ids = torch.topk(scores, top_k, dim=1)
        return ids, torch.softmax(values, dim=1), None
    weights = torch.softmax(scores, dim=1)
    nll = F.nll_loss(torch.log(weights), labels[at], ignore_index=0)
    return None, weights, torch.nan_to_num(nll) if not at.any() else nll  # an access without mentions counts 0


def _memory(sd, name, norm, hidden, input_ids, start_id, top_k, labels=None):
    """The memory read at each `<E_s>`, merged by the LayerNorm; also the top-k entity ids (inference) or the NLL
    (training)."""
    ids, weights, nll = _link(sd, name, hidden, input_ids, start_id, top_k, labels)
    rows = sd["EntityEmbedding.weight"].t()
    read = weights @ rows if ids is None else (weights[:, :, None] * rows[ids]).sum(1)
    update = torch.zeros_like(hidden)
    at = input_ids == start_id
    update[at] = F.linear(read, sd[f"{name}.OutputLayer.linear.weight"], sd[f"{name}.OutputLayer.linear.bias"])
    return _norm(sd, norm, hidden + update), ids if labels is None else nll


def _layers(sd, stack):
    count = 0
    while f"{stack}.layers.{count}.fc1.weight" in sd:
        count += 1
    return count


def _encoder(sd, input_ids, attention_mask, heads, start_id, top_k, entity_labels):
    """Lower layers, memory, upper layers: (lower output, final output, the memory's top-k ids or NLL, pad mask)."""
    pad_mask = (1.0 - attention_mask[:, None, None, :].float()) * NEG
    positions = torch.arange(input_ids.shape[1]) + 2  # BART's learned positions, offset 2
    x = sd["shared.weight"][input_ids] + sd["LowerEncoder.embed_positions.weight"][positions]
    x = _norm(sd, "LowerEncoder.layernorm_embedding", x)
    for i in range(_layers(sd, "LowerEncoder")):
        x = _encoder_layer(sd, f"LowerEncoder.layers.{i}", x, pad_mask, heads)
    lower_output = x
    x, access = _memory(
        sd, "EncoderEntityMemory", "EncoderMemoryLayerNorm", x, input_ids, start_id, top_k, entity_labels
    )
    for i in range(_layers(sd, "UpperEncoder")):
        x = _encoder_layer(sd, f"UpperEncoder.layers.{i}", x, pad_mask, heads)
    return lower_output, x, access, pad_mask


def authors_forward(
    sd,
    input_ids,
    attention_mask,
    decoder_input_ids,
    decoder_attention_mask,
    *,
    heads,
    start_id,
    top_k,
    lower_encoder,
    labels=None,
    entity_labels=None,
    decoder_entity_labels=None,
    entity_loss_weight=1.0,
):
    """EDMem. Inference (no labels): logits `(B, T, V)`, the entity-linking head's top-k ids at each decoder
    `<E_s>`, and the encoder memory's. Training (labels, and entity labels in their convention: 0 = none, the
    decoder's aligned with `decoder_input_ids`): logits, the total loss, the LM loss and the entity-linking loss."""
    training = labels is not None
    shared = sd["shared.weight"]
    lower_output, encoder_output, encoder_access, pad_mask = _encoder(
        sd, input_ids, attention_mask, heads, start_id, top_k, entity_labels
    )
    length = decoder_input_ids.shape[1]
    positions = (decoder_attention_mask.cumsum(-1) - 1).masked_fill(decoder_attention_mask == 0, 0) + 2
    y = shared[decoder_input_ids] + sd["LowerDecoder.embed_positions.weight"][positions]
    y = _norm(sd, "LowerDecoder.layernorm_embedding", y)
    causal = torch.triu(torch.full((length, length), NEG), diagonal=1)
    self_mask = (causal[None, None] + (1.0 - decoder_attention_mask[:, None, None, :].float()) * NEG).clamp(min=NEG)
    lower_source = lower_output if lower_encoder else encoder_output
    for i in range(_layers(sd, "LowerDecoder")):
        y = _decoder_layer(sd, f"LowerDecoder.layers.{i}", y, self_mask, lower_source, pad_mask, heads)
    y, decoder_access = _memory(
        sd,
        "DecoderEntityMemory",
        "DecoderMemoryLayerNorm",
        y,
        decoder_input_ids,
        start_id,
        top_k,
        decoder_entity_labels,
    )
    for i in range(_layers(sd, "UpperDecoder")):
        y = _decoder_layer(sd, f"UpperDecoder.layers.{i}", y, self_mask, encoder_output, pad_mask, heads)
    logits = y @ shared.t() + sd["final_logits_bias"]
    head_top, _, head_nll = _link(sd, "EntityLinkHead", y, decoder_input_ids, start_id, top_k, decoder_entity_labels)
    if not training:
        return logits, head_top, encoder_access
    lm_loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1))
    entity_loss = (encoder_access + decoder_access + head_nll) / 3
    return logits, lm_loss + entity_loss_weight * entity_loss, lm_loss, entity_loss


def authors_greedy(sd, input_ids, attention_mask, prompt, *, steps, eos, pad, **options):
    """Greedy decoding from the decoder `prompt` as a loop over whole-prefix forward passes (no cache):
    `(B, prompt + steps)` ids, rows that produced EOS padded after it."""
    output = prompt
    done = torch.zeros(input_ids.shape[0], dtype=torch.bool)
    for _ in range(steps):
        logits, _, _ = authors_forward(
            sd, input_ids, attention_mask, output, torch.ones_like(output), lower_encoder=False, **options
        )
        token = logits[:, -1].argmax(-1).masked_fill(done, pad)
        output = torch.cat([output, token[:, None]], dim=1)
        done |= token == eos
        if done.all():
            break
    return output


def authors_encmem_forward(
    sd, input_ids, attention_mask, *, heads, start_id, top_k, labels=None, entity_labels=None, entity_loss_weight=1.0
):
    """EncMem. Inference: logits `(B, S, V)`, the head's and the encoder memory's top-k ids at each `<E_s>`.
    Training (masked-LM labels, entity labels with 0 = none): logits, total, LM and entity-linking losses."""
    training = labels is not None
    _, x, encoder_access, _ = _encoder(sd, input_ids, attention_mask, heads, start_id, top_k, entity_labels)
    h = F.gelu(F.linear(x, sd["LMHead.transform.dense.linear.weight"], sd["LMHead.transform.dense.linear.bias"]))
    h = _norm(sd, "LMHead.transform.LayerNorm", h)
    logits = h @ sd["LMHead.decoder.weight"].t() + sd["LMHead.bias"]
    head_top, _, head_nll = _link(sd, "EntityLinkHead", x, input_ids, start_id, top_k, entity_labels)
    if not training:
        return logits, head_top, encoder_access
    lm_loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1))
    entity_loss = (encoder_access + head_nll) / 2
    return logits, lm_loss + entity_loss_weight * entity_loss, lm_loss, entity_loss
