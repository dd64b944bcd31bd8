"""GENRE-style entity retrieval with any seq2seq model: generate a title, constrained to a list of titles.

Runs offline in seconds: a byte-level BPE and a tiny BART are built here with random weights (a real setup would
load a fine-tuned GENRE/BART checkpoint instead; the constraint is used the same way).

    python examples/genre_style_retrieval.py
"""

from __future__ import annotations

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from transformers import BartConfig, BartForConditionalGeneration, LogitsProcessorList, PreTrainedTokenizerFast

from edmem_hf.entity_decoding import EntityConstrainedLogitsProcessor

TITLES = [
    "Barack Obama",
    "Barack Obama Sr.",
    "Michelle Obama",
    "Obama, Fukui",
    "Paris",
    "Paris Hilton",
    "Paris, Texas",
    "Texas",
    "Fukui Prefecture",
    "Honolulu",
]
CORPUS = [
    "Barack Obama was born in Honolulu, Hawaii, and served as the president of the United States.",
    "Michelle Obama is a lawyer and author; Barack Obama Sr. was an economist from Kenya.",
    "Obama is a city in Fukui Prefecture, Japan. Paris is the capital of France; Paris, Texas is a city.",
    "Paris Hilton is a media personality. Texas is a state in the south of the United States.",
]


def build_tokenizer() -> PreTrainedTokenizerFast:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400,
        special_tokens=["<s>", "<pad>", "</s>", "<unk>", "<mask>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(CORPUS + TITLES, trainer)
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A </s>", special_tokens=[("<s>", 0), ("</s>", 2)]
    )  # like BART's tokenizer: <s> text </s>
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<s>", eos_token="</s>", pad_token="<pad>", unk_token="<unk>"
    )


def main() -> None:
    tokenizer = build_tokenizer()
    torch.manual_seed(0)
    config = BartConfig(
        vocab_size=len(tokenizer),
        d_model=64,
        encoder_layers=2,
        decoder_layers=2,
        encoder_attention_heads=4,
        decoder_attention_heads=4,
        encoder_ffn_dim=128,
        decoder_ffn_dim=128,
        max_position_embeddings=128,
        pad_token_id=1,
        bos_token_id=0,
        eos_token_id=2,
        decoder_start_token_id=2,
        forced_eos_token_id=None,
    )
    model = BartForConditionalGeneration(config).eval()

    # The decoder must write `<s> title </s>` (GENRE's target format: the tokenizer's template) right after its
    # start token. This replaces GENRE's `prefix_allowed_tokens_fn=lambda batch_id, sent: trie.get(sent.tolist())`.
    processor = EntityConstrainedLogitsProcessor.from_strings(TITLES, tokenizer, add_special_tokens=True)

    queries = [
        "Who was the 44th president of the [START_ENT] Obama [END_ENT] administration?",
        "[START_ENT] Paris [END_ENT] is a 1984 film by Wim Wenders.",
    ]
    inputs = tokenizer(queries, return_tensors="pt", padding=True)
    out = model.generate(
        **inputs,
        logits_processor=LogitsProcessorList([processor]),
        num_beams=5,
        num_return_sequences=3,
        max_new_tokens=24,
        output_scores=True,
        return_dict_in_generate=True,
    )
    texts = tokenizer.batch_decode(out.sequences, skip_special_tokens=True)
    for i, query in enumerate(queries):
        print(query)
        for text, score in zip(texts[3 * i : 3 * i + 3], out.sequences_scores[3 * i : 3 * i + 3]):
            assert text in TITLES, text  # every hypothesis is one of the titles
            print(f"  {score:7.3f}  {text}")

    # Without the constraint, the random model writes arbitrary tokens.
    free = model.generate(**inputs, num_beams=5, max_new_tokens=12)
    print("unconstrained:", tokenizer.batch_decode(free, skip_special_tokens=True))


if __name__ == "__main__":
    main()
