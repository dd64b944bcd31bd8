"""New entities of a real corpus found by name (issue 64, item 5): the writer's recipe on a user's own corpus, with
no toy-world file and no question file, on the Wikipedia sample in ../shared/data.

The protocol, each step an `edmem` command as docs/model.md ("Your own entities") gives it:

1. The held-out entities are the sample's articles that no page links to (so no entity of the corpus); their pages
   are left out of the old dump, which is all the model reads.
2. `edmem build-corpus` of the old dump; `edmem pretrain --writer_recipe rows_that_answer_from_corpus`: the practice
   entities a share of the corpus's own, each of their rows written from one sentence.
3. `edmem add-entities --dump` of the whole sample: the held-out entities (and any other article the model does not
   know) written a row a sentence of their page, with the dump's redirects and link anchors as aliases.
4. How often the memory's top entity at a marked mention is the entity mentioned (`research.diagnostics.
   found_by_name`), for the added entities and for trained ones, with the name-guided read and without.

It shows the path a user takes and what the name-guided read does to finding; the model is small and briefly
trained, so reading is not what it measures (docs/evidence.md measures reading on the knowledge world).

    python benchmarks/wikipedia_new_entities.py --out runs/wikipedia-new-entities

Ends with one line `RESULT key=value ...`; the figures are written to `--results` (committed).
"""

from __future__ import annotations

import argparse
import bz2
import json
import os
import re
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from transformers import AutoTokenizer  # noqa: E402

from edmem_hf import EDMemForConditionalGeneration  # noqa: E402
from edmem_hf.corpus import cli_main as build_corpus_command  # noqa: E402
from edmem_hf.dump import iter_parsed_pages  # noqa: E402
from edmem_hf.entity_vocab import EntityVocab  # noqa: E402
from edmem_hf.pretraining import cli_main as pretrain_command  # noqa: E402
from edmem_hf.research.add_entities_command import cli_main as add_entities_command  # noqa: E402
from edmem_hf.research.diagnostics import found_by_name  # noqa: E402
from edmem_hf.research.new_entity_text import new_entity_passages, own_page_sentences  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
SAMPLE = ROOT.parent / "shared/data/wikipedia/enwiki-pages-articles-sample-206.xml.bz2"
RESULTS = ROOT / "docs/images/wikipedia_new_entities/results.json"
MODEL = ["--d_model", "64", "--encoder_lower_layers", "1", "--encoder_upper_layers", "1", "--decoder_lower_layers",
         "1", "--decoder_upper_layers", "1", "--encoder_ffn_dim", "256", "--decoder_ffn_dim", "256",
         "--encoder_attention_heads", "4", "--decoder_attention_heads", "4", "--entity_embed_dim", "64",
         "--max_position_embeddings", "160"]  # fmt: skip
TEXTS_AN_ENTITY = 4  # marked mentions read per entity to count finding


def held_out_titles(pages: list) -> list[str]:
    """The articles no page links to (through redirects) that name themselves in at least two sentences of their
    own (what `edmem add-entities` writes rows from, and where their mentions are found)."""
    redirects = {page.title: page.redirect for page in pages if page.redirect is not None}
    linked = {redirects.get(link.target, link.target) for page in pages for link in page.links}
    articles = [page.title for page in pages if page.redirect is None and page.title not in linked]
    sentences = own_page_sentences(pages, articles, max_sentences=None)
    mentioned, _ = new_entity_passages(pages, known=linked)
    return sorted(title for title in articles if len(sentences.get(title, ())) >= 2 and title in mentioned)


def dump_without_pages(dump: Path, titles: set[str], out: Path) -> Path:
    """The MediaWiki dump `dump` with the pages titled `titles` left out (the XML as it was otherwise)."""
    text = bz2.open(dump, "rt", encoding="utf-8").read()
    pages = re.compile(r"[ \t]*<page>.*?</page>\n?", re.DOTALL)

    def kept(match: re.Match) -> str:
        title = re.search(r"<title>(.*?)</title>", match.group(0)).group(1)
        return "" if _unescaped(title) in titles else match.group(0)

    out.parent.mkdir(parents=True, exist_ok=True)
    with bz2.open(out, "wt", encoding="utf-8") as f:
        f.write(pages.sub(kept, text))
    return out


def _unescaped(text: str) -> str:
    return text.replace("&quot;", '"').replace("&#039;", "'").replace("&lt;", "<").replace("&gt;", ">") \
        .replace("&amp;", "&")  # fmt: skip


def _run(command, argv: list[str]) -> None:
    """An `edmem` command in this process; a failure stops the protocol there."""
    if code := command(argv):
        raise SystemExit(f"{command.__module__} {' '.join(argv)}: exit code {code}")


def run(out: Path, steps: int, seed: int) -> dict:
    """The protocol's four steps into `out` (each reused when done); the figures."""
    started = time.perf_counter()
    pages = list(iter_parsed_pages(str(SAMPLE)))
    held = held_out_titles(pages)
    old_dump = dump_without_pages(SAMPLE, set(held), out / "old-wiki.xml.bz2")
    corpus, writer, grown = out / "corpus", out / "writer", out / "grown"
    if not (corpus / "entity_vocab.json").exists():
        _run(build_corpus_command, ["--dump", str(old_dump), "--out", str(corpus), "--vocab_size", "8000"])
    if not (writer / "model.safetensors").exists():
        _run(pretrain_command, ["--corpus_dir", str(corpus), "--output_dir", str(writer), *MODEL,
                          "--writer_recipe", "rows_that_answer_from_corpus", "--dropout", "0",
                          "--max_steps", str(steps), "--warmup_ratio", "0.1",
                          "--per_device_train_batch_size", "8", "--learning_rate", "3e-3", "--save_steps",
                          str(max(steps // 4, 1)), "--eval_steps", "0", "--seed", str(seed),
                          "--disable_tqdm", "true"])  # fmt: skip
    if not (grown / "model.safetensors").exists():
        _run(add_entities_command, ["--model", str(writer), "--dump", str(SAMPLE), "--out", str(grown)])
    model = EDMemForConditionalGeneration.from_pretrained(grown).eval()
    tokenizer = AutoTokenizer.from_pretrained(grown)
    trained_names = set(EntityVocab.load(corpus).names)
    everyone, _ = new_entity_passages(pages, known=(), max_passages=TEXTS_AN_ENTITY)
    added = {name: texts for name, texts in everyone.items() if name in held}
    trained = {name: texts for name, texts in everyone.items() if name in trained_names}
    figures = {group: {read: found_by_name(model, tokenizer, texts, name_guided=read == "name_guided")
                       for read in ("name_guided", "plain")}
               for group, texts in (("added", added), ("trained", trained))}  # fmt: skip
    return {"dump": SAMPLE.name, "held_out": held, "pretrain_steps": steps, "seed": seed, "found_by_name": figures,
            "entities_in_vocabulary": len(model.entity_vocab), "seconds": round(time.perf_counter() - started)}  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path("runs/wikipedia-new-entities"))
    parser.add_argument("--steps", type=int, default=600, help="pre-training steps (default 600, the committed run)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--results", type=Path, default=RESULTS, help="where the figures are written (committed)")
    args = parser.parse_args(argv)
    if not SAMPLE.exists():
        parser.error(f"{SAMPLE} is missing: this runs on ../shared/data's Wikipedia sample")
    result = run(args.out, args.steps, args.seed)
    args.results.parent.mkdir(parents=True, exist_ok=True)
    args.results.write_text(json.dumps(result, indent=1) + "\n")
    found = result["found_by_name"]
    print(f"RESULT entities_added={found['added']['plain']['entities']} pretrain_steps={args.steps} "
          f"added_recall={found['added']['name_guided']['recall']} "
          f"added_recall_plain={found['added']['plain']['recall']} "
          f"trained_recall={found['trained']['name_guided']['recall']} "
          f"trained_recall_plain={found['trained']['plain']['recall']} seconds={result['seconds']}")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
