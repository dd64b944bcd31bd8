"""Model cards on save, folders that load like any Hub model without this package, docs/hub.md."""

from __future__ import annotations

import ast
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from huggingface_hub import EvalResult, ModelCard, ModelCardData
from huggingface_hub.errors import EntryNotFoundError
from transformers import AutoModel, AutoModelForSeq2SeqLM, AutoTokenizer
from transformers.dynamic_module_utils import get_imports, get_relative_import_files

import edmem_hf
from edmem_hf import (
    EDMemEncDecForConditionalGeneration,
    EDMemEncDecModel,
    EDMemEncMemModel,
    EDMemForConditionalGeneration,
    EDMemForEntityLinking,
    EDMemModel,
)
from edmem_hf.model_card import CARD_MARKER
from tiny_models import make_word_tokenizer, run_quietly, run_without_the_package, tiny_batch, tiny_config, tiny_model

ROOT = Path(__file__).resolve().parents[1]
SRC = Path(edmem_hf.__file__).parent


def python_blocks(markdown: str) -> list[str]:
    return re.findall(r"```python\n(.*?)```", markdown, flags=re.DOTALL)


def saved_with_tokenizer(folder: Path, **card) -> EDMemForConditionalGeneration:
    tokenizer = make_word_tokenizer(bart_template=True)
    model = tiny_model(seed=4, vocab_size=len(tokenizer))
    if card:
        model.card_data = ModelCardData(**card)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return model


# --- the model card --------------------------------------------------------------------------------------------


def test_card_describes_the_model_and_its_snippet_runs_without_the_package(tmp_path):
    folder = tmp_path / "edmem-tiny"
    result = EvalResult(
        task_type="question-answering",
        dataset_type="nq_open",
        dataset_name="NQ",
        metric_type="exact_match",
        metric_value=12.5,
    )
    saved_with_tokenizer(folder, datasets=["nq_open"], model_name="tiny", eval_results=[result], tags=["qa"])
    card = ModelCard.load(folder / "README.md")
    assert card.data.license == "apache-2.0" and card.data.library_name == "transformers"
    assert card.data.pipeline_tag == "text2text-generation"
    assert card.data.tags == ["edmem", "custom_code", "qa"] and card.data.datasets == ["nq_open"]
    assert card.data.eval_results[0].metric_value == 12.5 and card.data.model_name == "tiny"
    assert card.text.lstrip().startswith(CARD_MARKER)
    assert "| entity memory | 40 rows x 16 |" in card.text
    assert (
        "| encoder layers | 1 lower + 1 upper |" in card.text and "| decoder layers | 1 lower + 2 upper |" in card.text
    )
    assert "author = {Zhang, Zhihan and Yu, Wenhao and Zhu, Chenguang and Jiang, Meng}" in card.text
    paper = ROOT.parent / "shared" / "reference" / "edmem_paper.tex"
    if paper.exists():  # the title and authors as the paper spells them
        tex = paper.read_text()
        title = re.search(r"\\title\{(.*?)\}", tex).group(1)
        names = re.sub(r"\$\^\d\$", "", re.search(r"\\author\{\{\\bf (.*?)\}", tex).group(1)).split(",")
        authors = " and ".join(f"{name.split()[-1]}, {' '.join(name.split()[:-1])}" for name in names)
        assert f"title = {{{title}}}" in card.text and f"author = {{{authors}}}" in card.text
    (snippet,) = python_blocks(card.text)
    assert f'from_pretrained("{folder}", trust_remote_code=True)' in snippet
    lines, reports = run_quietly(snippet, tmp_path)
    assert reports == []
    assert lines[-1].startswith("['"), lines  # the decoded generation


def test_a_saved_folder_loads_without_the_package_with_no_prompt_warning_or_missing_key(tmp_path):
    folder = tmp_path / "edmem-tiny"
    model = saved_with_tokenizer(folder)
    expected = model.generate(input_ids=torch.tensor([[0, 10, 5, 11, 6, 2]]), max_new_tokens=5).tolist()
    script = f"""
from transformers import AutoModelForSeq2SeqLM, AutoTokenizer
import torch
tokenizer = AutoTokenizer.from_pretrained({str(folder)!r}, trust_remote_code=True)
model, info = AutoModelForSeq2SeqLM.from_pretrained({str(folder)!r}, trust_remote_code=True, output_loading_info=True)
print(type(tokenizer).__name__, type(model).__name__, len(model.entity_vocab))
print(json.dumps({{key: sorted(value) for key, value in info.items()}}))
print(json.dumps(model.generate(input_ids=torch.tensor([[0, 10, 5, 11, 6, 2]]), max_new_tokens=5).tolist()))
"""
    lines, reports = run_quietly(script, tmp_path)
    assert reports == []
    assert lines[-3] == "TokenizersBackend EDMemForConditionalGeneration 40"
    assert json.loads(lines[-2]) == {
        "missing_keys": [],
        "unexpected_keys": [],
        "mismatched_keys": [],
        "error_msgs": [],
    }
    assert json.loads(lines[-1]) == expected


def test_the_entity_mask_is_saved_and_restored_with_and_without_the_package(tmp_path):
    """`set_entity_mask` goes with the model: `entity_mask.safetensors` beside the weights, none where nothing is
    hidden (a stale one removed), restored by `from_pretrained` with the package and as Hub code; a mask of the wrong
    shape is a checkpoint mismatch."""
    from safetensors.torch import save_file

    from edmem_hf.hub_edmem import ENTITY_MASK_NAME

    folder = tmp_path / "edmem-tiny"
    model = saved_with_tokenizer(folder)
    assert not (folder / ENTITY_MASK_NAME).exists()
    shown = torch.ones(model.config.entity_vocab_size, dtype=torch.bool)
    shown[:20] = False
    model.set_entity_mask(shown)
    model.save_pretrained(folder)
    loaded = AutoModelForSeq2SeqLM.from_pretrained(folder).eval()
    assert torch.equal(loaded._get_entity_mask("cpu"), shown)
    out = loaded(**tiny_batch(), output_attended_entities=True)
    assert (out.encoder_attended_entities.top_entity_ids >= 20).all()
    script = f"""
from transformers import AutoModelForSeq2SeqLM
model = AutoModelForSeq2SeqLM.from_pretrained({str(folder)!r}, trust_remote_code=True)
print(model._get_entity_mask("cpu").nonzero().min().item(), int((~model._get_entity_mask("cpu")).sum()))
"""
    lines, reports = run_quietly(script, tmp_path)
    assert reports == [] and lines[-1] == "20 20"
    loaded.set_entity_mask(None)
    loaded.save_pretrained(folder)
    assert not (folder / ENTITY_MASK_NAME).exists()
    assert AutoModelForSeq2SeqLM.from_pretrained(folder)._get_entity_mask("cpu") is None
    save_file({"shown": torch.ones(3, dtype=torch.bool)}, folder / ENTITY_MASK_NAME)
    with pytest.raises(ValueError, match="checkpoint mismatch.*entity_mask.safetensors holds"):
        AutoModelForSeq2SeqLM.from_pretrained(folder)


def test_with_the_package_the_folder_loads_without_trust_remote_code(tmp_path):
    folder = tmp_path / "edmem-tiny"
    model = saved_with_tokenizer(folder)
    assert type(AutoTokenizer.from_pretrained(folder)).__name__ == "TokenizersBackend"
    loaded, info = AutoModelForSeq2SeqLM.from_pretrained(folder, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"]
    assert loaded.entity_vocab == model.entity_vocab  # restored when loading info is asked for too
    entity_linking, info = EDMemForEntityLinking.from_pretrained(
        _saved_entity_linking(tmp_path / "encmem"), output_loading_info=True
    )
    assert entity_linking.entity_vocab is None and not info["missing_keys"]


def test_each_variant_loads_into_its_classes_with_and_without_the_package(tmp_path):
    """The Auto classes load a saved EncDec into the EncDec classes, from `auto_map` without the package and through
    the registered classes with it; so does a folder saved before the variants had classes (its auto_map and
    architectures name the EDMem classes). An EncMem folder is no seq2seq model: the error names its class."""
    torch.manual_seed(0)
    encdec = EDMemEncDecForConditionalGeneration(tiny_config(variant="encdec")).eval()
    folder = tmp_path / "encdec"
    encdec.save_pretrained(folder)
    auto_map = json.loads((folder / "config.json").read_text())["auto_map"]
    assert auto_map == {
        "AutoConfig": "configuration_edmem.EDMemConfig",
        "AutoModel": "modeling_edmem.EDMemEncDecModel",
        "AutoModelForSeq2SeqLM": "modeling_edmem.EDMemEncDecForConditionalGeneration",
    }
    batch = {k: tiny_batch()[k] for k in ("input_ids", "attention_mask", "labels")}
    expected = encdec(**batch).logits
    script = f"""
        import torch
        from transformers import AutoModel, AutoModelForSeq2SeqLM
        model = AutoModelForSeq2SeqLM.from_pretrained({str(folder)!r}, trust_remote_code=True)
        bare = AutoModel.from_pretrained({str(folder)!r}, trust_remote_code=True)
        print(type(model).__name__, type(bare).__name__)
        """
    header = run_without_the_package(script, tmp_path).stdout.strip().splitlines()[-1]
    assert header == "EDMemEncDecForConditionalGeneration EDMemEncDecModel"

    config = json.loads((folder / "config.json").read_text())  # as an EncDec was saved before its classes existed
    config["auto_map"] = {
        "AutoConfig": "configuration_edmem.EDMemConfig",
        "AutoModel": "modeling_edmem.EDMemModel",
        "AutoModelForSeq2SeqLM": "modeling_edmem.EDMemForConditionalGeneration",
    }
    config["architectures"] = ["EDMemForConditionalGeneration"]
    (folder / "config.json").write_text(json.dumps(config))
    for load in (AutoModelForSeq2SeqLM.from_pretrained, EDMemForConditionalGeneration.from_pretrained):
        loaded = load(folder).eval()
        assert type(loaded) is EDMemEncDecForConditionalGeneration
        assert torch.equal(loaded(**batch).logits, expected)
    assert type(AutoModel.from_pretrained(folder)) is EDMemEncDecModel
    assert (
        type(AutoModelForSeq2SeqLM.from_config(tiny_config(variant="encdec"))) is EDMemEncDecForConditionalGeneration
    )

    encmem = _saved_entity_linking(tmp_path / "encmem")
    assert {"modeling_edmem.py", "hub_edmem.py"} <= {p.name for p in encmem.iterdir()}
    assert type(AutoModel.from_pretrained(encmem)) is EDMemEncMemModel
    with pytest.raises(ValueError, match="config.variant is 'encmem': use EDMemForEntityLinking"):
        AutoModelForSeq2SeqLM.from_pretrained(encmem)


def _saved_entity_linking(folder: Path) -> Path:
    EDMemForEntityLinking(tiny_config(variant="encmem")).save_pretrained(folder)
    return folder


def test_a_readme_of_the_user_is_kept_and_ours_is_rewritten(tmp_path):
    model = tiny_model()
    readme = tmp_path / "README.md"
    readme.write_text("# my own card\n")
    model.save_pretrained(tmp_path)
    assert readme.read_text() == "# my own card\n"
    model.save_pretrained(tmp_path, overwrite_model_card=True)
    assert "| entity memory | 40 rows x 16 |" in readme.read_text()
    bigger = tiny_model(entity_vocab_size=50)
    bigger.save_pretrained(tmp_path)  # our card describes the weights it sits beside
    assert "| entity memory | 50 rows x 16 |" in readme.read_text()


def test_cards_of_the_other_classes_load_them(tmp_path):
    EDMemModel(tiny_config()).save_pretrained(tmp_path / "base")
    base = ModelCard.load(tmp_path / "base" / "README.md")
    assert base.data.pipeline_tag is None and "AutoModel.from_pretrained" in base.text
    encmem = ModelCard.load(_saved_entity_linking(tmp_path / "encmem") / "README.md")
    assert "EDMemForEntityLinking.from_pretrained" in encmem.text and "| variant | `encmem` |" in encmem.text
    with pytest.raises(TypeError, match="card_data must be a huggingface_hub.ModelCardData"):
        model = tiny_model()
        model.card_data = {"license": "mit"}
        model.save_pretrained(tmp_path / "bad")


class _FakeHub:
    """What push_to_hub asks of the Hub, answered offline: the repository's card (None: it has none) and what was
    uploaded."""

    def __init__(self, monkeypatch, card: str | None):
        self.uploaded: dict[str, str] = {}
        hub = self

        def create_repo(api, repo_id, **kwargs):
            return type("RepoUrl", (), {"repo_id": repo_id})()

        def upload_folder(api, repo_id, folder_path, commit_message, **kwargs):
            hub.uploaded = {name: Path(folder_path, name).read_bytes() for name in os.listdir(folder_path)}
            hub.commit_message = commit_message

        def load(cls, repo_id, **kwargs):
            if card is None:
                raise EntryNotFoundError("no README.md")
            return ModelCard(card)

        monkeypatch.setattr("huggingface_hub.HfApi.create_repo", create_repo)
        monkeypatch.setattr("huggingface_hub.HfApi.upload_folder", upload_folder)
        monkeypatch.setattr(ModelCard, "load", classmethod(load))


def test_push_to_hub_uploads_our_card_unless_the_repository_has_the_users(monkeypatch, tmp_path):
    model = tiny_model()
    hub = _FakeHub(monkeypatch, card=None)
    model.push_to_hub("someone/edmem-tiny", tags=["qa"])
    readme = hub.uploaded["README.md"].decode()
    assert CARD_MARKER in readme and 'from_pretrained("someone/edmem-tiny", trust_remote_code=True)' in readme
    assert "- qa" in readme and {"model.safetensors", "config.json", "modeling_edmem.py"} <= set(hub.uploaded)
    model.save_pretrained(tmp_path / "local", push_to_hub=True, repo_id="someone/other")
    assert 'from_pretrained("someone/other", trust_remote_code=True)' in hub.uploaded["README.md"].decode()
    assert hub.uploaded.keys() == {p.name for p in (tmp_path / "local").iterdir()}

    hub = _FakeHub(monkeypatch, card="---\nlicense: mit\n---\n# theirs\n")
    model.push_to_hub("someone/edmem-tiny", tags=["qa"])
    readme = hub.uploaded["README.md"].decode()
    assert "# theirs" in readme and CARD_MARKER not in readme and "- qa" in readme and "license: mit" in readme
    (tmp_path / "local" / "README.md").write_text("# mine\n")  # a card of the user's in the saved folder goes up
    model.save_pretrained(tmp_path / "local", push_to_hub=True, repo_id="someone/other")
    assert hub.uploaded["README.md"].decode().strip() == "# mine"


def test_convert_original_card_is_the_same_card_with_what_was_converted(tmp_path):
    from edmem_hf.convert_original import write_model_card

    model = tiny_model()
    model.save_pretrained(tmp_path)
    write_model_card(model, tmp_path, source="pytorch_model.bin")
    card = ModelCard.load(tmp_path / "README.md")
    assert "Converted by `edmem convert-original` from `pytorch_model.bin`" in card.text
    assert "| entity memory | 40 rows x 16 |" in card.text and "## Citation" in card.text


def test_hub_files_import_only_each_other():
    shipped = {p.name for p in get_relative_import_files_of("modeling_edmem")} | {"modeling_edmem.py"}
    assert "model_card.py" in shipped
    assert shipped <= {
        f"{name}.py"
        for name in (
            "configuration_edmem",
            "modeling_edmem",
            "input_checks",
            "name_candidates",
            "entity_attention",
            "entity_writer",
            "entity_index",
            "generation_edmem",
            "entity_trie",
            "entity_decoding",
            "entity_vocab",
            "hub_edmem",
            "model_card",
        )
    }
    assert "hub_edmem.py" in shipped and not any(name.startswith(("entity_growth", "writer_")) for name in shipped)
    assert set(get_imports(SRC / "model_card.py")) - sys.stdlib_module_names == {"huggingface_hub"}


def _imports_of_ours(path: Path) -> set[str]:
    """The modules of this package that `path` imports anywhere (at the top or inside a function), by name."""
    package = path.relative_to(SRC.parent).with_suffix("").parts[:-1]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.level:
            base = ".".join(package[: len(package) - node.level + 1])
            modules = [f"{base}.{node.module}"] if node.module else [f"{base}.{alias.name}" for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            modules = [node.module or ""] + [f"{node.module}.{alias.name}" for alias in node.names]
        elif isinstance(node, ast.Import):
            modules = [alias.name for alias in node.names]
        else:
            continue
        found |= {module for module in modules if module.split(".")[0] == "edmem_hf"}
    return found


def test_no_import_circle_and_hub_files_import_nothing_else_of_ours():
    """Each stage imports the ones before it, never back (the growth code imports the model file, not the reverse);
    the Hub files import each other only, relatively, even inside a function."""
    modules = {}
    for path in SRC.rglob("*.py"):
        name = ".".join(path.relative_to(SRC.parent).with_suffix("").parts).removesuffix(".__init__")
        modules[name] = path
    graph = {name: _imports_of_ours(path) & set(modules) - {name} for name, path in modules.items()}

    def imports_itself_back(name: str) -> bool:
        seen, todo = set(), list(graph[name])
        while todo:
            module = todo.pop()
            if module == name:
                return True
            if module not in seen:
                seen.add(module)
                todo += graph[module]
        return False

    circles = [name for name in graph if name != "edmem_hf" and imports_itself_back(name)]
    assert not circles, circles
    shipped = [*get_relative_import_files_of("modeling_edmem"), SRC / "modeling_edmem.py"]
    for path in shipped:
        assert _imports_of_ours(path) <= {f"edmem_hf.{p.stem}" for p in shipped}, path
        for node in ast.walk(ast.parse(path.read_text())):  # relatively: an absolute import fails as Hub code
            if isinstance(node, ast.ImportFrom) and not node.level:
                assert node.module.split(".")[0] != "edmem_hf", (path.name, node.module)
            elif isinstance(node, ast.Import):
                assert all(alias.name.split(".")[0] != "edmem_hf" for alias in node.names), path.name
    assert "edmem_hf.modeling_edmem" in graph["edmem_hf.research.entity_growth"]


def get_relative_import_files_of(module: str) -> list[Path]:
    return [Path(p) for p in get_relative_import_files(str(SRC / f"{module}.py"))]


# --- docs/hub.md -----------------------------------------------------------------------------------------------


def test_every_code_block_of_docs_hub_runs(tmp_path):
    """The blocks run in order in one interpreter: python as written, each `edmem ...` line of a bash block through
    this tree's `edmem_hf.cli.main`."""
    markdown = (ROOT / "docs" / "hub.md").read_text()
    script = ["from edmem_hf.cli import main as edmem"]
    for language, body in re.findall(r"```(python|bash)\n(.*?)```", markdown, flags=re.DOTALL):
        if language == "python":
            script.append(body)
        else:
            for command in body.strip().splitlines():
                assert command.startswith("edmem "), command
                argv = command.split()[1:]
                script.append(f"assert edmem({argv!r}) == 0")
    assert len(python_blocks(markdown)) >= 4
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf_home"), "PYTHONPATH": str(SRC.parent)}
    result = subprocess.run(
        [sys.executable, "-c", "\n".join(script)], capture_output=True, text=True, env=env, cwd=tmp_path, timeout=300
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "EDMemForConditionalGeneration 64" in result.stdout
