"""EDMem model: shapes, memory maths, losses, cache, save/load and bad input."""

from __future__ import annotations

import json
import os

import pytest
import torch
from huggingface_hub.errors import StrictDataclassClassValidationError
from transformers import AutoConfig, AutoModel, AutoModelForSeq2SeqLM, BartConfig, BartForConditionalGeneration

from edmem_hf import (
    EDMemEncDecForConditionalGeneration,
    EDMemForConditionalGeneration,
    EDMemForEntityLinking,
    EDMemModel,
    EntityVocab,
)
from edmem_hf.entity_attention import dense_entity_attention, entity_attention
from tiny_models import BOS, EE, EOS, ES, N_ENTITIES, PAD, run_without_the_package, tiny_batch, tiny_config, tiny_model

# --- shapes --------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("variant", ["edmem", "encdec"])
def test_seq2seq_shapes_for_each_variant(variant):
    model = tiny_model(variant=variant)
    model.eval()
    batch = tiny_batch()
    if variant == "encdec":
        batch.pop("entity_labels"), batch.pop("decoder_entity_labels")
    out = model(**batch, output_attended_entities=True)
    assert out.logits.shape == (2, 6, model.config.vocab_size)
    assert out.loss.ndim == 0 and torch.isfinite(out.loss)
    if variant == "edmem":
        assert torch.allclose(out.loss, out.lm_loss + model.config.entity_loss_weight * out.entity_loss)
        # 3 mentions in the encoder input, 2 `<E_s>` read by the decoder.
        assert out.encoder_attended_entities.positions.tolist() == [[0, 2], [0, 7], [1, 1]]
        assert out.encoder_attended_entities.top_entity_ids.shape == (3, model.config.memory_top_k)
        assert out.decoder_attended_entities.positions.tolist() == [[0, 1], [1, 2]]
        assert out.linked_entities.top_entity_ids.shape == (2, model.config.memory_top_k)
        assert out.encoder_attended_entities.entity_nll.shape == (3,)
    else:
        assert out.entity_loss is None and out.encoder_attended_entities is None
        assert not any("entity" in name for name, _ in model.named_parameters())


def test_encmem_entity_linking_shapes():
    torch.manual_seed(0)
    model = EDMemForEntityLinking(tiny_config(variant="encmem"))
    model.eval()
    batch = tiny_batch()
    mlm_labels = torch.full_like(batch["input_ids"], -100)
    mlm_labels[0, 3] = 11
    out = model(
        batch["input_ids"],
        batch["attention_mask"],
        entity_labels=batch["entity_labels"],
        labels=mlm_labels,
        output_attended_entities=True,
    )
    assert out.logits.shape == (2, 12, model.config.vocab_size)
    assert out.linked_entities.top_entity_ids.shape == (3, model.config.memory_top_k)
    assert torch.allclose(out.loss, out.lm_loss + out.entity_loss)
    assert not any(name.startswith("model.decoder") for name, _ in model.named_parameters())
    with pytest.raises(ValueError, match="encmem"):
        EDMemForEntityLinking(tiny_config())
    with pytest.raises(ValueError, match="EDMemForEntityLinking"):
        EDMemForConditionalGeneration(tiny_config(variant="encmem"))


def test_encmem_masked_lm_head_is_bert_style_and_tied():
    """The authors' EncMem head: dense, activation, LayerNorm, then the tied token embeddings plus a bias, which
    resizes with the vocabulary."""
    torch.manual_seed(0)
    model = EDMemForEntityLinking(tiny_config(variant="encmem")).eval()
    with torch.no_grad():
        model.lm_head.decoder.bias.normal_()
    batch = tiny_batch()
    out = model(batch["input_ids"], batch["attention_mask"])
    hidden = model.model.encoder(batch["input_ids"], batch["attention_mask"]).last_hidden_state
    head = model.lm_head
    transformed = head.layer_norm(torch.nn.functional.gelu(head.dense(hidden)))
    expected = transformed @ model.model.shared.weight.t() + head.decoder.bias
    torch.testing.assert_close(out.logits, expected)
    assert head.decoder.weight is model.model.shared.weight
    model.resize_token_embeddings(model.config.vocab_size + 6, mean_resizing=False)
    assert head.decoder.weight is model.model.shared.weight and head.decoder.bias.shape == (model.config.vocab_size,)
    assert model(batch["input_ids"], batch["attention_mask"]).logits.shape[-1] == model.config.vocab_size


def _cross_attention_sources(model, batch):
    """The `key_value_states` each decoder layer's cross-attention receives, captured by forward hooks."""
    sources = {}

    def record(idx):
        def hook(module, args, kwargs):
            sources[idx] = kwargs["key_value_states"]

        return hook

    hooks = [
        layer.encoder_attn.register_forward_pre_hook(record(idx), with_kwargs=True)
        for idx, layer in enumerate(model.model.decoder.layers)
    ]
    try:
        encoder_outputs = model.get_encoder()(
            input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], output_hidden_states=True
        )
        logits = model(**batch, encoder_outputs=encoder_outputs).logits
    finally:
        for hook in hooks:
            hook.remove()
    return sources, encoder_outputs, logits


def test_lower_decoder_can_attend_to_lower_encoder_output():
    upper = tiny_model(seed=1, decoder_lower_layers=2, decoder_upper_layers=1)
    lower = tiny_model(seed=1, decoder_lower_layers=2, decoder_upper_layers=1, lower_decoder_attends_to="lower")
    lower.load_state_dict(upper.state_dict())
    batch = tiny_batch()
    upper.eval(), lower.eval()
    upper_sources, upper_encoded, a = _cross_attention_sources(upper, batch)
    lower_sources, lower_encoded, b = _cross_attention_sources(lower, batch)
    final = upper_encoded.last_hidden_state
    lower_output = lower_encoded.lower_hidden_state
    assert not torch.allclose(final, lower_output)
    # "lower" is the last lower encoder layer's output, before the memory is merged (the authors' lower_encoder)
    outputs = {}
    top_lower_layer = lower.model.encoder.layers[lower.config.encoder_lower_layers - 1]
    hook = top_lower_layer.register_forward_hook(lambda module, args, output: outputs.setdefault("h", output))
    with torch.no_grad():
        lower.model.encoder(batch["input_ids"], batch["attention_mask"])
    hook.remove()
    assert torch.equal(lower_output, outputs["h"])
    # the lower decoder layers read the lower encoder's output only when switched to; the upper ones always read the top
    for idx in range(3):
        assert torch.equal(upper_sources[idx], final)
    assert torch.equal(lower_sources[0], lower_output) and torch.equal(lower_sources[1], lower_output)
    assert torch.equal(lower_sources[2], final)
    assert a.shape == b.shape and not torch.allclose(a, b)


def test_base_model_returns_hidden_states_and_accesses():
    model = EDMemModel(tiny_config())
    model.eval()
    batch = tiny_batch()
    out = model(batch["input_ids"], batch["attention_mask"], output_hidden_states=True, output_attended_entities=True)
    assert out.last_hidden_state.shape == (2, 12, 32)
    assert len(out.encoder_hidden_states) == model.config.encoder_layers + 1
    assert out.encoder_attended_entities.top_entity_ids.shape == (3, 8)


# --- memory maths --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("with_mask", [False, True])
def test_chunked_memory_read_and_loss_equal_dense_formula(with_mask):
    torch.manual_seed(0)
    num_mentions, num_entities, dim = 7, 53, 12
    queries = torch.randn(num_mentions, dim, dtype=torch.float64, requires_grad=True)
    table = torch.randn(num_entities, dim, dtype=torch.float64, requires_grad=True)
    mask = torch.rand(num_entities) > 0.3 if with_mask else None
    gold = torch.randint(0, num_entities, (num_mentions,))
    if mask is not None:
        gold = mask.nonzero()[torch.randint(0, int(mask.sum()), (num_mentions,)), 0]
    upstream = torch.randn(num_mentions, dim, dtype=torch.float64)

    read, log_partition, nll, _, _ = entity_attention(queries, table, labels=gold, entity_mask=mask, chunk_size=10)
    ((read * upstream).sum() + nll.sum()).backward()
    grads = queries.grad.clone(), table.grad.clone()
    queries.grad = table.grad = None
    dense_read, dense_lp = dense_entity_attention(queries, table, mask)
    dense_nll = dense_lp.double() - (queries * table[gold]).sum(-1)
    ((dense_read * upstream).sum() + dense_nll.sum()).backward()
    assert torch.allclose(read, dense_read, atol=1e-6)
    assert torch.allclose(log_partition.double(), dense_lp.double(), atol=1e-5)
    assert torch.allclose(nll.double(), dense_nll.detach(), atol=1e-5)
    # float32 softmax inside: gradients agree to float32 precision.
    assert torch.allclose(grads[0], queries.grad, atol=1e-4)
    assert torch.allclose(grads[1], table.grad, atol=1e-4)


def test_top_k_attention_equals_full_attention_when_k_is_the_vocabulary():
    torch.manual_seed(0)
    queries, table = torch.randn(5, 8), torch.randn(30, 8)
    full = entity_attention(queries, table, top_k=None, chunk_size=7).read
    top = entity_attention(queries, table, top_k=29, chunk_size=7).read
    ids = entity_attention(queries, table, top_k=30, chunk_size=7, return_top_k=30).top_ids
    all_k = entity_attention(queries, table, top_k=30, chunk_size=7).read
    assert torch.allclose(full, all_k, atol=1e-6)
    assert not torch.allclose(full, top, atol=1e-6)  # dropping one entity changes the read
    assert sorted(ids[0].tolist()) == list(range(30))
    # and the model reads the same in eval mode with memory_top_k == N as in full mode
    model = tiny_model(memory_top_k=N_ENTITIES)
    model.eval()
    batch = tiny_batch()
    topk_logits = model(**batch).logits
    model.config.memory_top_k = None
    for module in model.modules():
        if hasattr(module, "top_k"):
            module.top_k = None
    assert torch.allclose(topk_logits, model(**batch).logits, atol=1e-5)


def test_masked_entities_get_zero_attention():
    torch.manual_seed(0)
    queries, table = torch.randn(4, 8), torch.randn(20, 8)
    mask = torch.ones(20, dtype=torch.bool)
    mask[[0, 3, 7, 19]] = False
    read, lp, _, ids, _ = entity_attention(queries, table, entity_mask=mask, chunk_size=6, return_top_k=16)
    visible = table[mask]
    weights = torch.softmax(queries @ visible.t(), dim=-1)
    assert torch.allclose(read, weights @ visible, atol=1e-6)
    assert torch.allclose(lp, torch.logsumexp(queries @ visible.t(), dim=-1), atol=1e-5)
    assert not set(ids.flatten().tolist()) & {0, 3, 7, 19}
    # a masked table's gradient is zero on the hidden rows
    table.requires_grad_(True)
    labels = torch.tensor([1, 2, 3, -100])  # entity 3 is hidden: no loss for it
    read, lp, nll, _, _ = entity_attention(queries, table, labels=labels, entity_mask=mask, chunk_size=6)
    assert nll.shape == (2,)
    (read.sum() + nll.sum()).backward()
    assert table.grad[~mask].abs().max() == 0 and table.grad[mask].abs().max() > 0
    # a fully masked memory reads nothing (the model falls back to its EncDec behaviour)
    read, lp, _, _, _ = entity_attention(queries, table, entity_mask=torch.zeros(20, dtype=torch.bool))
    assert torch.equal(read, torch.zeros_like(read)) and torch.isinf(lp).all()


def test_model_entity_mask_hides_entities_from_every_access():
    model = tiny_model()
    model.eval()
    mask = torch.ones(N_ENTITIES, dtype=torch.bool)
    mask[:20] = False
    model.set_entity_mask(mask)
    out = model(**tiny_batch(), output_attended_entities=True)
    for access in (out.encoder_attended_entities, out.decoder_attended_entities, out.linked_entities):
        assert (access.top_entity_ids >= 20).all()
    with pytest.raises(ValueError, match="entity_mask must have shape"):
        model.set_entity_mask(torch.ones(3, dtype=torch.bool))


def test_memory_softmax_is_float32_under_bf16():
    """With bf16 queries and table, the scores are bf16 products but the softmax, its log-partition and the
    weighted sum run in float32: the results equal a float32 softmax over the same scores, and are far from a bf16
    softmax (the checks below could tell the two apart)."""
    torch.manual_seed(0)
    queries, table = torch.randn(8, 64).bfloat16(), torch.randn(1000, 64).bfloat16()
    read, log_partition, _, _, _ = entity_attention(queries, table, chunk_size=256)  # 4 chunks: running log-sum-exp
    assert read.dtype == torch.bfloat16 and log_partition.dtype == torch.float32
    scores = queries @ table.t()
    float32_log_partition = torch.logsumexp(scores.float(), dim=-1)
    float32_read = (torch.softmax(scores.float(), dim=-1) @ table.float()).bfloat16().float()
    bf16_log_partition = torch.logsumexp(scores, dim=-1).float()
    bf16_read = (torch.softmax(scores, dim=-1) @ table).float()
    assert (bf16_log_partition - float32_log_partition).abs().max() > 1e-2  # what a bf16 softmax would be off by
    assert (bf16_read - float32_read).abs().max() > 1e-2
    torch.testing.assert_close(log_partition, float32_log_partition, atol=1e-4, rtol=1e-5)
    torch.testing.assert_close(read.float(), float32_read, atol=2e-3, rtol=0)


# --- losses and training -------------------------------------------------------------------------------------------


def test_batch_without_mentions_has_zero_entity_loss_and_full_gradients():
    model = tiny_model()
    input_ids = torch.tensor([[0, 10, 11, 2]])
    out = model(input_ids=input_ids, labels=torch.tensor([[12, 13, 2]]))
    assert out.entity_loss.item() == 0.0 and torch.isfinite(out.loss)
    out.loss.backward()
    # every parameter is in the graph, so DDP does not wait for missing gradients
    assert all(p.grad is not None for p in model.parameters())


def test_entity_loss_averages_the_three_accesses():
    model = tiny_model()
    model.eval()
    out = model(**tiny_batch())
    parts = [out.encoder_attended_entities, out.decoder_attended_entities, out.linked_entities]
    expected = torch.stack([p.entity_nll.mean() for p in parts]).mean()
    assert torch.allclose(out.entity_loss, expected)


def test_entity_loss_reduction_over_all_accesses_divides_by_three():
    """The authors' reduction: the three accesses' mean NLLs summed and divided by 3, also when one access has no
    labelled mention (here the decoder side: no decoder entity labels), where ours averages the two that have."""
    batch = tiny_batch()
    batch["decoder_entity_labels"] = torch.full_like(batch["decoder_entity_labels"], -100)
    ours = tiny_model().eval()
    theirs = tiny_model(entity_loss_reduction="all_accesses").eval()
    out, out_theirs = ours(**batch), theirs(**batch)
    encoder_nll = out.encoder_attended_entities.entity_nll.mean()
    assert out.decoder_attended_entities.entity_nll.numel() == 0 and out.linked_entities.entity_nll.numel() == 0
    torch.testing.assert_close(out.entity_loss, encoder_nll)
    torch.testing.assert_close(out_theirs.entity_loss, encoder_nll / 3)
    torch.testing.assert_close(out_theirs.loss, out_theirs.lm_loss + encoder_nll / 3)
    full = tiny_batch()  # every access labelled: both reductions agree
    torch.testing.assert_close(ours(**full).entity_loss, theirs(**full).entity_loss)


def test_entity_loss_per_lm_token_weighs_a_mention_as_one_token():
    """`per_lm_token`: each access's summed NLL over the LM loss's scored tokens, averaged over the accesses; the
    LM loss and the accesses themselves are those of the default reduction."""
    batch = tiny_batch()
    batch["labels"][0, -2:] = -100  # some unscored tokens: the count is of scored ones
    default, per_token = tiny_model().eval(), tiny_model(entity_loss_reduction="per_lm_token").eval()
    out, out_per_token = default(**batch), per_token(**batch)
    tokens = int((batch["labels"] != -100).sum())
    parts = [out.encoder_attended_entities, out.decoder_attended_entities, out.linked_entities]
    expected = torch.stack([p.entity_nll.sum() / tokens for p in parts]).mean()
    torch.testing.assert_close(out_per_token.entity_loss, expected)
    torch.testing.assert_close(out_per_token.lm_loss, out.lm_loss)
    assert out_per_token.entity_loss < out.entity_loss  # fewer mentions than tokens


def test_authors_dropout_sites():
    """`memory_dropout` after each memory projection (encoder and decoder memory: W_in and W_out; entity-linking
    head: W_in) and `upper_input_dropout` on each upper stack's input; off at 0 and in eval mode."""
    batch = tiny_batch()
    model = tiny_model(memory_dropout=0.3, upper_input_dropout=0.4)
    calls = {}

    def count(name):
        def hook(module, args, output):
            calls.setdefault(name, []).append((module.p, (output == 0).float().mean().item()))

        return hook

    for name, module in model.named_modules():
        if isinstance(module, torch.nn.Dropout):
            module.register_forward_hook(count(name))
    model.train()
    first, second = model(**batch).loss, model(**batch).loss
    assert not torch.equal(first, second)  # dropout is random in training
    sites = {name: [p for p, _ in ps] for name, ps in calls.items()}
    assert sites == {
        "model.encoder.memory.projection_dropout": [0.3, 0.3] * 2,  # W_in and W_out, two forwards
        "model.encoder.memory.upper_input_dropout": [0.4] * 2,
        "model.decoder.memory.projection_dropout": [0.3, 0.3] * 2,
        "model.decoder.memory.upper_input_dropout": [0.4] * 2,
        "entity_linking_head.projection_dropout": [0.3] * 2,
    }
    upper_input_zeros = [zeros for _, zeros in calls["model.encoder.memory.upper_input_dropout"]]
    assert all(0.3 < zeros < 0.5 for zeros in upper_input_zeros)  # about 40% of the entries dropped
    model.eval()
    assert torch.equal(model(**batch).loss, model(**batch).loss)
    plain = tiny_model()
    plain.load_state_dict(model.state_dict())
    torch.testing.assert_close(model(**batch).logits, plain.eval()(**batch).logits, atol=0, rtol=0)
    plain.train()  # at 0, training is deterministic (tiny_config has dropout 0 elsewhere)
    assert torch.equal(plain(**batch).loss, plain(**batch).loss)


def test_toy_batch_is_overfit():
    model = tiny_model(seed=3)
    model.train()
    batch = tiny_batch()
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    first = None
    for _ in range(120):
        loss = model(**batch).loss
        first = first if first is not None else loss.item()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    assert loss.item() < 0.1 * first, (first, loss.item())


def test_gradient_checkpointing_gives_the_same_gradients():
    batch = tiny_batch()
    grads, layer_forwards = [], []
    for checkpointing in (False, True):
        model = tiny_model(seed=5)
        model.train()
        if checkpointing:
            # renamed activation_checkpointing_enable in recent Transformers 5 releases
            enable = getattr(model, "activation_checkpointing_enable", None) or model.gradient_checkpointing_enable
            enable()
        layers = [*model.model.encoder.layers, *model.model.decoder.layers]
        calls = [0]
        # Transformers checkpoints each layer's `forward`, so the recompute shows in the layer's submodules.
        hooks = [
            layer.fc1.register_forward_hook(lambda *_, calls=calls: calls.__setitem__(0, calls[0] + 1))
            for layer in layers
        ]
        model(**batch).loss.backward()
        for hook in hooks:
            hook.remove()
        layer_forwards.append(calls[0])
        grads.append({name: p.grad.clone() for name, p in model.named_parameters()})
    # checkpointing recomputes every layer's forward in the backward pass
    assert layer_forwards[1] == 2 * layer_forwards[0] == 2 * len(layers)
    assert grads[0].keys() == grads[1].keys()
    for name in grads[0]:
        assert torch.allclose(grads[0][name], grads[1][name], atol=1e-6), name


def test_sdpa_and_eager_attention_agree(monkeypatch):
    batch = tiny_batch()
    logits, sdpa_calls = [], []
    sdpa = torch.nn.functional.scaled_dot_product_attention

    def counting_sdpa(*args, **kwargs):
        sdpa_calls[-1] += 1
        return sdpa(*args, **kwargs)

    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", counting_sdpa)
    for implementation in ("eager", "sdpa"):
        model = tiny_model(seed=2)
        model.set_attn_implementation(implementation)
        assert model.config._attn_implementation == implementation
        model.eval()
        sdpa_calls.append(0)
        logits.append(model(**batch).logits)
    # self- and cross-attention of every layer: none in eager, all through SDPA when switched
    layers = model.config.encoder_layers + 2 * model.config.decoder_layers
    assert sdpa_calls == [0, layers]
    assert torch.allclose(logits[0], logits[1], atol=1e-5)


# --- generation and cache ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("num_beams", [1, 4])
def test_generation_with_cache_equals_generation_without(num_beams):
    model = tiny_model(seed=11)
    model.eval()
    batch = tiny_batch()
    # Favour `<E_s>` so that generated mentions go through the decoder memory.
    with torch.no_grad():
        model.final_logits_bias[0, ES] = 3.0
    inputs = {k: batch[k] for k in ("input_ids", "attention_mask")}
    kwargs = dict(max_new_tokens=12, num_beams=num_beams, do_sample=False, min_new_tokens=12)
    cached = model.generate(**inputs, use_cache=True, **kwargs)
    uncached = model.generate(**inputs, use_cache=False, **kwargs)
    assert torch.equal(cached, uncached)
    assert (cached == ES).any(), "the test must exercise decoder memory reads"


def test_incremental_decoding_matches_full_forward():
    model = tiny_model(seed=4)
    model.eval()
    batch = tiny_batch()
    decoder_input_ids = torch.tensor([[2, ES, 20, 21, EE, 9], [2, 23, ES, 24, EE, 2]])
    full = model(batch["input_ids"], batch["attention_mask"], decoder_input_ids=decoder_input_ids).logits
    encoder_outputs = model.get_encoder()(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"])
    past, steps = None, []
    for t in range(decoder_input_ids.shape[1]):
        out = model(
            attention_mask=batch["attention_mask"],
            decoder_input_ids=decoder_input_ids[:, t : t + 1],
            encoder_outputs=encoder_outputs,
            past_key_values=past,
            use_cache=True,
        )
        past = out.past_key_values
        steps.append(out.logits)
    assert torch.allclose(torch.cat(steps, dim=1), full, atol=1e-5)


def test_left_padded_decoder_input_reads_as_unpadded():
    """Decoder positions count the unmasked tokens (the authors' `cumsum(mask) - 1`): a left-padded decoder row
    gives the logits of the same row alone, and continues it with the same tokens, with and without the cache."""
    model = tiny_model(seed=4)
    model.eval()
    batch = tiny_batch()
    prefix = [EOS, ES, 20, 21]  # decoder start, then a mention being spelled
    padded = torch.tensor([prefix, [PAD, PAD, EOS, 23]])
    mask = (torch.arange(4) >= torch.tensor([[0], [2]])).long()
    out = model(batch["input_ids"], batch["attention_mask"], decoder_input_ids=padded, decoder_attention_mask=mask)
    for row, start in ((0, 0), (1, 2)):
        alone = model(
            batch["input_ids"][row : row + 1],
            batch["attention_mask"][row : row + 1],
            decoder_input_ids=padded[row : row + 1, start:],
        )
        torch.testing.assert_close(out.logits[row, start:], alone.logits[0], atol=1e-5, rtol=1e-5)
        for use_cache in (True, False):
            settings = dict(max_new_tokens=6, do_sample=False, num_beams=1, use_cache=use_cache)
            together = model.generate(
                batch["input_ids"],
                attention_mask=batch["attention_mask"],
                decoder_input_ids=padded,
                decoder_attention_mask=mask,
                **settings,
            )
            single = model.generate(
                batch["input_ids"][row : row + 1],
                attention_mask=batch["attention_mask"][row : row + 1],
                decoder_input_ids=padded[row : row + 1, start:],
                **settings,
            )
            continuation = together[row, 4:].tolist()
            assert continuation[: single.shape[1] - (4 - start)] == single[0, 4 - start :].tolist(), (row, use_cache)
    with pytest.raises(ValueError, match="decoder_attention_mask covers 3 positions"):
        model(
            batch["input_ids"], batch["attention_mask"], decoder_input_ids=padded, decoder_attention_mask=mask[:, 1:]
        )


# --- save / load ---------------------------------------------------------------------------------------------------


def _perturbed(model):
    """Every parameter and buffer set to random values, so that nothing a fresh model would rebuild (zero biases,
    unit norms, the initialised table) can pass for a loaded one."""
    torch.manual_seed(123)
    with torch.no_grad():
        for tensor in [*model.parameters(), *model.buffers()]:
            tensor.copy_(torch.randn_like(tensor, dtype=torch.float32).to(tensor.dtype) * 0.5)
    return model.eval()


def _assert_same_tensors(model, loaded):
    expected, actual = model.state_dict(), loaded.state_dict()
    assert expected.keys() == actual.keys()
    for name in expected:
        assert actual[name].dtype == expected[name].dtype, name
        assert torch.equal(actual[name], expected[name]), name


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_save_load_round_trip(tmp_path, dtype):
    model = _perturbed(tiny_model(seed=7).to(dtype))
    batch = tiny_batch()
    model.save_pretrained(tmp_path)
    files = set(os.listdir(tmp_path))
    assert {"config.json", "model.safetensors", "entity_vocab.json", "modeling_edmem.py"} <= files
    assert {"configuration_edmem.py", "entity_vocab.py"} <= files
    assert not any(f.endswith((".bin", ".pt", ".pkl")) for f in files)
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["auto_map"] == {
        "AutoConfig": "configuration_edmem.EDMemConfig",
        "AutoModel": "modeling_edmem.EDMemModel",
        "AutoModelForSeq2SeqLM": "modeling_edmem.EDMemForConditionalGeneration",
    }
    loaded = AutoModelForSeq2SeqLM.from_pretrained(tmp_path, dtype="auto").eval()
    assert isinstance(loaded, EDMemForConditionalGeneration) and loaded.dtype == dtype
    _assert_same_tensors(model, loaded)
    out, out_loaded = model(**batch), loaded(**batch)
    assert torch.equal(out.logits, out_loaded.logits) and torch.equal(out.loss, out_loaded.loss)
    assert loaded.entity_vocab == model.entity_vocab
    # tied weights stay tied after loading
    assert loaded.lm_head.weight.data_ptr() == loaded.model.shared.weight.data_ptr()
    table = loaded.model.entity_embeddings.weight
    assert loaded.model.encoder.entity_embeddings.weight is table
    assert loaded.model.decoder.entity_embeddings.weight is table
    assert isinstance(AutoConfig.from_pretrained(tmp_path).to_dict(), dict)
    base = AutoModel.from_pretrained(tmp_path, dtype="auto")
    assert isinstance(base, EDMemModel) and base.entity_vocab == model.entity_vocab
    _assert_same_tensors(model.model, base)


def test_entity_linking_model_save_load_round_trip(tmp_path):
    model = _perturbed(EDMemForEntityLinking(tiny_config(variant="encmem")))
    model.entity_vocab = EntityVocab([f"Entity {i}" for i in range(model.config.entity_vocab_size)])
    batch = tiny_batch()
    model.save_pretrained(tmp_path)
    loaded = EDMemForEntityLinking.from_pretrained(tmp_path).eval()
    _assert_same_tensors(model, loaded)
    inputs = dict(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"])
    inputs["entity_labels"] = batch["entity_labels"]
    out, out_loaded = model(**inputs, output_attended_entities=True), loaded(**inputs, output_attended_entities=True)
    assert torch.equal(out.logits, out_loaded.logits) and torch.equal(out.loss, out_loaded.loss)
    assert torch.equal(out.linked_entities.top_entity_ids, out_loaded.linked_entities.top_entity_ids)
    assert loaded.entity_vocab == model.entity_vocab


def test_remote_code_load_without_the_package(tmp_path):
    model = tiny_model(seed=8)
    model.eval()
    batch = tiny_batch()
    save_dir = tmp_path / "edmem-tiny"
    model.save_pretrained(save_dir)
    expected = model(**batch).logits[0, :, :5].tolist()
    script = f"""
        import json, sys
        import torch
        from transformers import AutoModelForSeq2SeqLM
        model = AutoModelForSeq2SeqLM.from_pretrained({str(save_dir)!r}, trust_remote_code=True)
        model.eval()
        batch = {{k: torch.tensor(v) for k, v in json.loads(sys.stdin.read()).items()}}
        print(type(model).__module__, type(model).__name__, len(model.entity_vocab))
        print(json.dumps(model(**batch).logits[0, :, :5].tolist()))
        """
    result = run_without_the_package(script, tmp_path, stdin=json.dumps({k: v.tolist() for k, v in batch.items()}))
    header, logits = result.stdout.strip().splitlines()[-2:]
    assert header.startswith("transformers_modules") and "EDMemForConditionalGeneration" in header
    assert header.endswith(str(N_ENTITIES))
    assert torch.allclose(torch.tensor(json.loads(logits)), torch.tensor(expected), atol=1e-5)


def test_bart_weights_load_into_the_same_names():
    config = tiny_config(variant="encdec")
    bart = BartForConditionalGeneration(
        BartConfig(
            vocab_size=config.vocab_size,
            d_model=32,
            encoder_layers=config.encoder_layers,
            decoder_layers=config.decoder_layers,
            encoder_ffn_dim=64,
            decoder_ffn_dim=64,
            encoder_attention_heads=4,
            decoder_attention_heads=4,
            max_position_embeddings=64,
            dropout=0.0,
        )
    )
    bart.eval()
    edmem = EDMemEncDecForConditionalGeneration(config)
    missing, unexpected = edmem.load_state_dict(bart.state_dict(), strict=False)
    assert not unexpected and not missing
    edmem.eval()
    batch = tiny_batch()
    inputs = {"input_ids": batch["input_ids"], "attention_mask": batch["attention_mask"], "labels": batch["labels"]}
    assert torch.allclose(edmem(**inputs).logits, bart(**inputs).logits, atol=1e-5)


# --- bad input -----------------------------------------------------------------------------------------------------


def test_unmatched_entity_start_raises():
    model = tiny_model()
    for bad in ([[0, ES, 10, 2]], [[0, ES, 10, ES, 11, EE, 2]], [[0, 10, EE, 2]]):
        with pytest.raises(ValueError, match="unmatched mention markers"):
            model(input_ids=torch.tensor(bad), labels=torch.tensor([[10, 2]]))
    with pytest.raises(ValueError, match="unmatched mention markers"):
        model.generate(input_ids=torch.tensor([[0, ES, 10, 2]]), max_new_tokens=2)


def test_entity_ids_outside_the_vocabulary_raise():
    model = tiny_model()
    batch = tiny_batch()
    batch["entity_labels"][0, 2] = N_ENTITIES
    with pytest.raises(ValueError, match=f"unknown entity id {N_ENTITIES}"):
        model(**batch)
    batch = tiny_batch()
    batch["decoder_entity_labels"][0, 0] = -5
    with pytest.raises(ValueError, match="unknown entity id -5"):
        model(**batch)


def test_entity_labels_off_entity_start_raise():
    model = tiny_model()
    batch = tiny_batch()
    batch["entity_labels"][0, 3] = 4
    with pytest.raises(ValueError, match="not <E_s>"):
        model(**batch)
    batch = tiny_batch()
    batch["decoder_entity_labels"][0, 2] = 4
    with pytest.raises(ValueError, match="decoder_entity_labels .* not <E_s>"):
        model(**batch)
    with pytest.raises(ValueError, match="pass labels too"):
        model(input_ids=batch["input_ids"], decoder_entity_labels=batch["decoder_entity_labels"])


def test_vocabulary_and_checkpoint_mismatch_raise(tmp_path):
    model = tiny_model()
    with pytest.raises(ValueError, match="vocabulary has 3 entities but the entity memory has 40 rows"):
        model.entity_vocab = EntityVocab(["a", "b", "c"])
    model.save_pretrained(tmp_path)
    EntityVocab([f"E{i}" for i in range(N_ENTITIES + 1)]).save(tmp_path)
    with pytest.raises(ValueError, match="checkpoint mismatch"):
        EDMemForConditionalGeneration.from_pretrained(tmp_path)


def test_padding_token_is_not_a_marker():
    """Padding adds no mention and no memory access: a padded row reads as it does alone."""
    model = tiny_model()
    model.eval()
    batch = tiny_batch()
    padded = model(batch["input_ids"], batch["attention_mask"], labels=batch["labels"], output_attended_entities=True)
    row = batch["input_ids"][1:, :7]
    alone = model(row, torch.ones_like(row), labels=batch["labels"][1:], output_attended_entities=True)
    assert padded.encoder_attended_entities.positions.tolist() == [[0, 2], [0, 7], [1, 1]]
    assert alone.encoder_attended_entities.positions.tolist() == [[0, 1]]
    assert torch.allclose(padded.logits[1:], alone.logits, atol=1e-5)


def test_bf16_autocast_and_bf16_weights_train_and_generate():
    batch = tiny_batch()
    model = tiny_model(seed=9)
    model.train()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = model(**batch)
    out.loss.backward()
    assert torch.isfinite(out.loss) and out.entity_loss.dtype == torch.float32
    assert model.model.entity_embeddings.weight.grad is not None
    model = tiny_model(seed=9).to(torch.bfloat16)
    model.train()
    out = model(**batch)
    out.loss.backward()
    assert torch.isfinite(out.loss) and model.model.entity_embeddings.weight.grad.dtype == torch.bfloat16
    # Generation (the memory read at each input <E_s>): bf16 weights write what the same weights write in float32.
    # Weights large enough (init_std) that the memory's read changes the text; no repeated token, so it varies.
    bf16 = tiny_model(seed=9, init_std=0.3).to(torch.bfloat16).eval()
    float32 = tiny_model(seed=9, init_std=0.3).eval()
    float32.load_state_dict({key: value.float() for key, value in bf16.state_dict().items()})
    input_ids = torch.tensor([[BOS, 10, ES, 11, 12, EE, 13, EOS], [BOS, ES, 16, EE, 17, 18, EOS, PAD],
                              [BOS, 30, 31, ES, 32, EE, 33, EOS], [BOS, ES, 40, 41, EE, 42, EOS, PAD]])  # fmt: skip
    settings = dict(attention_mask=(input_ids != PAD).long(), max_new_tokens=10, min_new_tokens=10)
    settings |= dict(no_repeat_ngram_size=1, do_sample=False)
    generated = bf16.generate(input_ids=input_ids, **settings)
    written = generated[:, 1:-1]  # between the start token and the forced EOS
    assert written.shape == (4, 9) and not torch.isin(written, torch.tensor([PAD, EOS])).any()
    assert len({tuple(row) for row in written.tolist()}) == 4  # varied: each question its own text
    expected = float32.generate(input_ids=input_ids, **settings)
    assert (generated == expected).float().mean() >= 0.75  # the same text, but where bf16 rounding flips a token


# --- keys and values ------------------------------------------------------------------------------------------------


def test_entity_key_dim_scores_a_row_s_key_and_reads_its_value():
    """`entity_key_dim`: queries score a row's first columns only: changing the value columns moves no score of the
    memory or the linking head, and changes what the memory reads; the encoder memory's linking loss (its scores
    alone, before any read) leaves the value columns alone and the LM loss trains them."""
    model = tiny_model(entity_key_dim=6)  # rows 16 wide: 6 of key, 10 of value
    assert model.model.encoder.memory.query_proj.out_features == 6
    assert model.entity_linking_head.query_proj.out_features == 6
    batch = tiny_batch()
    out = model(**batch, output_attended_entities=True)
    table = model.model.entity_embeddings.weight
    encoder_nll = out.encoder_attended_entities.entity_nll.mean()
    entity_grad = torch.autograd.grad(encoder_nll, table, retain_graph=True)[0]
    lm_grad = torch.autograd.grad(out.lm_loss, table)[0]
    assert entity_grad[:, :6].abs().sum() > 0 and entity_grad[:, 6:].abs().sum() == 0
    assert lm_grad[:, 6:].abs().sum() > 0
    model.eval()
    with torch.no_grad():
        before = model(**batch, output_attended_entities=True)
        table[:, 6:] = torch.randn_like(table[:, 6:])
        after = model(**batch, output_attended_entities=True)
        # the encoder memory's scores come before any read; the linking head's, for the same states, alike
        hidden, at = torch.randn(2, 5, 32), torch.rand(2, 5) < 0.5
        linked = model.entity_linking_head(hidden, at, table, return_top_k=8)
        table[:, 6:] = torch.randn_like(table[:, 6:])
        linked_after = model.entity_linking_head(hidden, at, table, return_top_k=8)
    old, new = before.encoder_attended_entities, after.encoder_attended_entities
    assert torch.equal(old.top_entity_ids, new.top_entity_ids)
    assert torch.allclose(old.top_entity_scores, new.top_entity_scores)
    assert torch.equal(linked.top_entity_scores, linked_after.top_entity_scores)
    assert torch.allclose(before.encoder_attended_entities.entity_nll, after.encoder_attended_entities.entity_nll)
    assert not torch.allclose(before.logits, after.logits)  # the read carries the value


def test_entity_key_dim_must_fit_the_row():
    with pytest.raises(
        StrictDataclassClassValidationError, match=r"entity_key_dim must be in \[1, entity_embed_dim=16\], got 17"
    ):
        tiny_config(entity_key_dim=17)
    assert tiny_config().entity_key_dim is None  # the paper's row: key and value alike
