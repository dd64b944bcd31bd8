"""What works with the rest of the ecosystem, kept working: PEFT's LoRA, SDPA attention, gradient checkpointing and
`torch.compile`, each on a tiny saved model."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForSeq2SeqLM, AutoTokenizer
from transformers.models.bart.modeling_bart import BartEncoderLayer

from tiny_models import tiny_model_with_entities


@pytest.fixture(autouse=True)
def one_thread():
    """Tiny models on a loaded machine: one torch thread."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """A tiny EDMem and its tokenizer saved in a folder, a padded batch with mentions and entity labels, and inputs
    to generate from: `(folder, batch, inputs)`."""
    folder = tmp_path_factory.mktemp("tiny-edmem")
    model, tokenizer, names, words = tiny_model_with_entities(20)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    sources = [f"{words[50]} <E_s> {names[3]} <E_e> {words[51]}", f"<E_s> {names[7]} <E_e> {words[52]} {words[53]}"]
    targets = [f"<E_s> {names[5]} <E_e> {words[54]}", f"{words[55]} <E_s> {names[2]} <E_e>"]
    batch = tokenizer(sources, text_target=targets, padding=True, return_tensors="pt")
    batch["labels"] = batch["labels"].masked_fill(batch["labels"] == tokenizer.pad_token_id, -100)
    start = model.config.entity_start_token_id
    batch["entity_labels"] = torch.full_like(batch["input_ids"], -100).masked_fill(batch["input_ids"] == start, 3)
    batch["decoder_entity_labels"] = torch.full_like(batch["labels"], -100).masked_fill(batch["labels"] == start, 5)
    inputs = tokenizer(sources, padding=True, return_tensors="pt")
    return folder, dict(batch), dict(inputs)


def test_lora_trains_generates_with_dynamic_decoding_and_saves_an_adapter(saved, tmp_path):
    """PEFT's LoRA on the attention projections and the memory's queries: one training step moves the adapters
    alone, `generate` spells a name the head offers with dynamic entity decoding through the PEFT model, and the
    adapter saved alone loads back onto the base model."""
    from peft import LoraConfig, PeftModel, get_peft_model

    folder, batch, inputs = saved
    tokenizer = AutoTokenizer.from_pretrained(folder)
    base = AutoModelForSeq2SeqLM.from_pretrained(folder)
    frozen = {name: tensor.clone() for name, tensor in base.state_dict().items()}
    config = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "query_proj"], task_type="SEQ_2_SEQ_LM")
    lora = get_peft_model(base, config)
    trainable = [name for name, parameter in lora.named_parameters() if parameter.requires_grad]
    assert trainable and all("lora_" in name for name in trainable)
    assert any("memory.query_proj.lora_A" in name for name in trainable)  # the memory's query is adapted too
    lora.train()
    optimizer = torch.optim.AdamW([p for p in lora.parameters() if p.requires_grad], lr=1e-2)
    before = {name: p.detach().clone() for name, p in lora.named_parameters() if p.requires_grad}
    outputs = lora(**batch)
    assert torch.isfinite(outputs.loss) and outputs.entity_loss > 0  # the memory's losses are in the objective
    outputs.loss.backward()
    optimizer.step()
    assert any(not torch.equal(p, before[name]) for name, p in lora.named_parameters() if p.requires_grad)
    for name, tensor in lora.get_base_model().state_dict().items():  # the base weights did not move
        if "lora_" not in name:
            assert torch.equal(tensor, frozen[name.replace(".base_layer", "")]), name

    lora.eval()
    # the answer opens a mention: dynamic decoding must spell one of the names the head offers at that <E_s>
    prompt = torch.tensor([[lora.config.decoder_start_token_id, lora.config.entity_start_token_id]] * 2)
    generated = lora.generate(**inputs, decoder_input_ids=prompt, entity_decoding="dynamic", entity_candidates=3,
                              tokenizer=tokenizer, max_new_tokens=8, return_dict_in_generate=True)  # fmt: skip
    for mentions in generated.entity_mentions:
        (mention,) = mentions
        assert mention.entity_name and mention.entity_id in [entity for entity, _, _ in mention.candidates]
    with torch.no_grad():
        logits = lora(**batch).logits
    lora.save_pretrained(tmp_path / "adapter")
    saved_files = {path.name for path in (tmp_path / "adapter").iterdir()}
    assert {
        "adapter_config.json",
        "adapter_model.safetensors",
    } <= saved_files and "model.safetensors" not in saved_files
    reloaded = PeftModel.from_pretrained(AutoModelForSeq2SeqLM.from_pretrained(folder), tmp_path / "adapter").eval()
    with torch.no_grad():
        torch.testing.assert_close(reloaded(**batch).logits, logits)


def test_sdpa_attention_equals_eager(saved):
    folder, batch, _ = saved
    eager = AutoModelForSeq2SeqLM.from_pretrained(folder, attn_implementation="eager").eval()
    sdpa = AutoModelForSeq2SeqLM.from_pretrained(folder, attn_implementation="sdpa").eval()
    assert (eager.config._attn_implementation, sdpa.config._attn_implementation) == ("eager", "sdpa")
    with torch.no_grad():
        expected, out = eager(**batch), sdpa(**batch)
    torch.testing.assert_close(out.logits, expected.logits, rtol=0, atol=1e-5)
    torch.testing.assert_close(out.loss, expected.loss, rtol=0, atol=1e-6)


def test_gradient_checkpointing_trains_with_the_same_gradients(saved):
    """With gradient (activation) checkpointing the layers run again in the backward pass (twice per step, counted)
    and the gradients are the ones computed without it."""
    folder, batch, _ = saved
    gradients, calls = [], []
    for checkpointing in (False, True):
        model = AutoModelForSeq2SeqLM.from_pretrained(folder, attn_implementation="eager")
        if checkpointing:
            model.activation_checkpointing_enable()  # as Trainer's --activation_checkpointing does
        model.train()
        layer = next(m for m in model.modules() if isinstance(m, BartEncoderLayer))
        calls.append(0)  # the layer's own hooks stay outside the checkpoint: count its first linear's runs
        layer.fc1.register_forward_hook(lambda *args: calls.__setitem__(-1, calls[-1] + 1))
        model(**batch).loss.backward()
        gradients.append({name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None})
    assert calls == [1, 2]
    assert gradients[0].keys() == gradients[1].keys()
    for name, gradient in gradients[0].items():
        torch.testing.assert_close(gradients[1][name], gradient, rtol=1e-5, atol=1e-6, msg=name)


def test_torch_compile_runs_a_forward(saved):
    """`torch.compile` (not fullgraph: the memory reads a data-dependent number of mentions) gives the eager logits."""
    folder, batch, _ = saved
    model = AutoModelForSeq2SeqLM.from_pretrained(folder).eval()
    with torch.no_grad():
        expected = model(**batch)
        compiled = torch.compile(model, backend="aot_eager")(**batch)
    torch.testing.assert_close(compiled.logits, expected.logits, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(compiled.loss, expected.loss)
