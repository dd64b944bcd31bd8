"""Tiny EDMem configurations, batches and tokenizers shared by the tests (CPU, seconds), and the benchmark scripts
as modules. The made-up words and their tokenizer are the benchmarks' (`benchmarks/experiments/word_tokenizer.py`,
re-exported here): the tests import what they share with the benchmarks, and the benchmarks import nothing of the
tests."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import torch

from edmem_hf import EDMemConfig, EDMemForConditionalGeneration, EntityVocab
from edmem_hf.modeling_edmem import MODEL_WITH_HEADS

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"
if str(BENCHMARKS) not in sys.path:  # as `python benchmarks/<script>.py` has it: its scripts import each other
    sys.path.insert(0, str(BENCHMARKS))

from experiments.word_tokenizer import make_word_tokenizer, make_words  # noqa: E402

PAD, BOS, EOS, ES, EE = 1, 0, 2, 5, 6
VOCAB = 64
N_ENTITIES = 40


def tiny_config(**overrides) -> EDMemConfig:
    settings = dict(
        vocab_size=VOCAB,
        d_model=32,
        encoder_lower_layers=1,
        encoder_upper_layers=1,
        decoder_lower_layers=1,
        decoder_upper_layers=2,
        encoder_ffn_dim=64,
        decoder_ffn_dim=64,
        encoder_attention_heads=4,
        decoder_attention_heads=4,
        entity_vocab_size=N_ENTITIES,
        entity_embed_dim=16,
        memory_top_k=8,
        memory_chunk_size=16,
        max_position_embeddings=64,
        entity_start_token_id=ES,
        entity_end_token_id=EE,
        pad_token_id=PAD,
        bos_token_id=BOS,
        eos_token_id=EOS,
        decoder_start_token_id=EOS,
        forced_eos_token_id=EOS,
        dropout=0.0,
    )
    settings.update(overrides)
    return EDMemConfig(**settings)


def tiny_model(seed: int = 0, **overrides) -> EDMemForConditionalGeneration:
    """An EDMem with an LM head (the EncDec baseline's class for `variant="encdec"`)."""
    torch.manual_seed(seed)
    model = MODEL_WITH_HEADS[tiny_config(**overrides).variant](tiny_config(**overrides))
    model.entity_vocab = EntityVocab([f"Entity {i}" for i in range(model.config.entity_vocab_size)])
    return model


def tiny_batch(seed: int = 0) -> dict[str, torch.Tensor]:
    """Two padded examples with mentions in the input and the target, and their entity labels."""
    input_ids = torch.tensor(
        [
            [BOS, 10, ES, 11, 12, EE, 13, ES, 14, EE, 15, EOS],
            [BOS, ES, 16, EE, 17, 18, EOS, PAD, PAD, PAD, PAD, PAD],
        ]
    )
    entity_labels = torch.full_like(input_ids, -100)
    entity_labels[0, 2], entity_labels[0, 7], entity_labels[1, 1] = 7, 12, 3
    labels = torch.tensor([[ES, 20, 21, EE, 22, EOS], [23, ES, 24, EE, EOS, -100]])
    decoder_entity_labels = torch.full_like(labels, -100)
    decoder_entity_labels[0, 0], decoder_entity_labels[1, 1] = 9, 30
    return {
        "input_ids": input_ids,
        "attention_mask": (input_ids != PAD).long(),
        "entity_labels": entity_labels,
        "labels": labels,
        "decoder_entity_labels": decoder_entity_labels,
    }


def run_without_the_package(script: str, tmp_path: Path, stdin: str | None = None) -> subprocess.CompletedProcess:
    """Runs `script` (dedented) in a fresh interpreter where `import edmem_hf` fails (as on a machine with only
    Transformers), offline, with its own HF_HOME; fails the test if the script fails."""
    hide = tmp_path / "hide"
    hide.mkdir(exist_ok=True)
    (hide / "edmem_hf.py").write_text("raise ImportError('hidden for this test')\n")
    guard = 'try:\n    import edmem_hf\nexcept ImportError:\n    pass\nelse:\n    raise SystemExit("edmem_hf is importable")\n'
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf_home"), "PYTHONPATH": str(hide)}
    command = [sys.executable, "-c", guard + textwrap.dedent(script)]
    result = subprocess.run(command, input=stdin, capture_output=True, text=True, env=env, cwd=tmp_path, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    return result


# Wraps a script run without the package: every Python warning and every Transformers log record of level WARNING
# or above is collected and printed as the last line.
_QUIET = """
import json, logging, warnings
_reports = []
class _Keep(logging.Handler):
    def emit(self, record):
        _reports.append(record.getMessage())
logging.getLogger("transformers").addHandler(_Keep(logging.WARNING))
warnings.simplefilter("always")
warnings.showwarning = lambda message, *args, **kwargs: _reports.append(str(message))
{script}
print("REPORTS " + json.dumps(_reports))
"""


def run_quietly(script: str, tmp_path: Path) -> tuple[list[str], list[str]]:
    """`script` run without the package (stdin empty: a prompt cannot wait); its stdout lines and what it warned."""
    result = run_without_the_package(_QUIET.format(script=script), tmp_path, stdin="")
    lines = result.stdout.strip().splitlines()
    assert "Do you wish to run the custom code" not in result.stdout
    assert lines[-1].startswith("REPORTS "), result.stdout
    return lines[:-1], json.loads(lines[-1][len("REPORTS ") :])


def tiny_model_with_entities(num_entities: int = 20, words: list[str] | None = None):
    """A tiny EDMem in eval mode with a word tokenizer and an entity vocabulary of two-word names:
    `(model, tokenizer, names, words)`."""
    tokenizer = make_word_tokenizer(bart_template=True)
    words = make_words(400) if words is None else words
    names = [f"{words[i]} {words[i + 1]}" for i in range(0, 2 * num_entities, 2)]
    start, end = tokenizer.convert_tokens_to_ids(["<E_s>", "<E_e>"])
    model = tiny_model(vocab_size=len(tokenizer), entity_vocab_size=len(names), entity_start_token_id=start)
    model.config.entity_end_token_id = end
    model.entity_vocab = EntityVocab(names)
    return model.eval(), tokenizer, names, words


def saved_model_and_unknown_people(
    tokenizer, folder: Path, **overrides
) -> tuple[EDMemForConditionalGeneration, list[str], list[str], str]:
    """A tiny EDMem (config `overrides` applied) saved in `folder / "model"` knowing every entity of a 30-entity toy
    world but three people, and that world's full dump: `(model, people, known, dump)`, for `edmem add-entities`."""
    from edmem_hf.toy_world import generate_toy_world, write_mediawiki_dump

    world = generate_toy_world(30, seed=0)
    people = [e.name for e in world.entities if e.type == "person"][:3]
    known = [e.name for e in world.entities if e.name not in people]
    start, end = tokenizer.convert_tokens_to_ids(["<E_s>", "<E_e>"])
    model = tiny_model(vocab_size=len(tokenizer), entity_vocab_size=len(known), entity_start_token_id=start,
                       entity_end_token_id=end, **overrides)  # fmt: skip
    model.entity_vocab = EntityVocab(known)
    model.save_pretrained(folder / "model")
    tokenizer.save_pretrained(folder / "model")
    return model, people, known, write_mediawiki_dump(world, folder / "new.xml.bz2")


def load_benchmark(name: str):
    """`benchmarks/<name>.py` as a module, registered in `sys.modules` (its dataclasses look their module up);
    `benchmarks/` is on the path (one script imports another)."""
    spec = importlib.util.spec_from_file_location(name, BENCHMARKS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module
