"""Scoring `toy_world_growth.py`'s models: each model asked each split's questions (EM, free and static decoding;
the memory's recall at the subject; with practice people, again with their rows hidden), the figures' mean and
spread over seeds (runs made apart joined from their results files), the issue's headline figures read from them,
and the RESULT line."""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import TYPE_CHECKING

from experiments.growth import DEFAULT_ESTIMATOR, NAME_GUIDED, READING_LEARNED, WRITER
from experiments.memory import memory_finding, practice_rows_mask
from experiments.scoring import em, question_hits
from experiments.training import predict

if TYPE_CHECKING:
    from toy_world_growth import GrowthSettings


def split_figures(models: dict[str, Path], data: dict, settings: GrowthSettings, seed: int) -> dict[str, dict]:
    """split -> model -> figures, for each model of `models` (name -> folder) asked the added people's questions (the
    test group's and the validation group's), the trained test group's (but with random rows) and, before adding,
    the practice people's (their questions mixed into batches, and the validation group's, never mixed; `data`:
    `make_worlds`'):
    EM in free and static decoding, the memory's recall at the subject and its misses that share a word of the name;
    with practice people, the recall and free EM again with their rows hidden."""
    files = data["files"]
    results: dict[str, dict] = {}
    for name, model_dir in models.items():
        # what the practice people's rows take: the figures again with them hidden (one mask file a model)
        practice_mask = (
            practice_rows_mask(model_dir, data["practice"]) if data["practice_people"] is not None else None
        )
        for split in ("added", "added_validation", "test", "practice", "practice_validation"):
            if split not in files or (split == "test" and name == "random"):
                continue
            if split.startswith("practice") and name not in ("before", f"{WRITER}_before"):
                continue
            figures = {}
            for mode in ("free",) if name.endswith(NAME_GUIDED) else ("free", "static"):  # the headline's: free
                path = predict(model_dir, files[split], model_dir / f"predict-{split}-{mode}", mode, settings.qa, seed)
                figures[mode] = em(question_hits(files[split], files[f"{split}_links"], path))
            finding = memory_finding(model_dir, files[split])
            figures["memory_recall"] = finding["recall"]
            figures["memory_misses_sharing_a_name_word"] = finding["misses_sharing_a_name_word"]
            if practice_mask is not None and not split.startswith("practice"):
                finding = memory_finding(model_dir, files[split], hidden=data["practice"])
                figures["memory_recall_practice_rows_hidden"] = finding["recall"]
                figures["memory_misses_sharing_a_name_word_practice_rows_hidden"] = finding[
                    "misses_sharing_a_name_word"
                ]
                path = predict(model_dir, files[split], model_dir / f"predict-{split}-free-practice-rows-hidden", "free",
                               settings.qa, seed, entity_mask_file=practice_mask)  # fmt: skip
                figures["free_practice_rows_hidden"] = em(question_hits(files[split], files[f"{split}_links"], path))
            results.setdefault(split, {})[name] = figures
    return results


def summarise(runs: list[dict]) -> dict:
    """Mean and spread over the seeds of every figure."""

    def walk(path: tuple[str, ...], node):
        if isinstance(node, dict):
            return {key: walk(path + (key,), value) for key, value in node.items()}
        values = []
        for run in runs:
            value = run["results"]
            for key in path:
                value = value[key]
            values.append(value)
        return {"mean": round(statistics.fmean(values), 2), "std": round(statistics.pstdev(values), 2)}

    return walk((), runs[0]["results"])


# The growth experiment's seeds that no run had read before issue 64's recipe was chosen on seeds 0-2
# (docs/images/toy_world_growth_validated/choice_rule.json).
FRESH_SEEDS = (3, 4, 5)
PLAIN_BESIDE = ("added_over_trained_em", "added_recall", "trained_em_change", "added_em")


def headline_figures(summary: dict, writer: bool) -> dict:
    """The issue's figures, for the writer (or, without it, the default EDMem with its default estimator): the added
    people's EM over the trained people's, above the floor (`(added - floor) / (trained - floor)`, each split's
    majority-answer EM its floor) and with it; the added people's memory recall; the trained people's EM change on
    adding; the share of answers that follow a swapped row (the default EDMem's is `row_swap_follow_default` among
    the diagnostics); and the trained people's EM lost to training the writer (the default EDMem's less the
    writer's, before adding). Where the models were also read guided by names (`growth.with_name_guided_read`), the
    added people's figures are the name-guided models' (their ratio over the name-guided trained EM), the trained
    people's change the name-guided models' on adding (what the read gains them is `trained_em_name_guided` against
    `trained_em`, not a change on adding), and the plain read's figures are beside them (`..._plain`). With practice
    people, the same EMs with their rows hidden from the memory (`..._practice_rows_hidden`): they are scaffolding of
    the writer's training, asked nothing at test. A ratio whose trained EM is at its floor is None."""

    def mean(*path: str) -> float:
        node = summary
        for key in path:
            node = node[key]
        return node["mean"]

    system, before = (WRITER, f"{WRITER}_before") if writer else (DEFAULT_ESTIMATOR, "before")
    trained, added = mean("test", before, "free", "all"), mean("added", system, "free", "all")
    floor_added, floor_trained = mean("floor", "added"), mean("floor", "test")

    def above_floor(added: float, trained: float) -> float | None:
        return round((added - floor_added) / (trained - floor_trained), 3) if trained > floor_trained else None

    diagnostics = summary["diagnostics"]
    figures = {
        "estimator": system,
        "added_over_trained_em": above_floor(added, trained),
        "added_over_trained_em_with_floor": round(added / trained, 3) if trained else None,
        "added_recall": mean("added", system, "memory_recall"),
        "trained_em_change": round(mean("test", system, "free", "all") - trained, 2),
        "trained_em": trained,
        "added_em": added,
        "row_swap_follow": diagnostics["writer" if writer else "default"]["row_swap"]["follow"]["mean"],
    }  # fmt: skip
    if system + NAME_GUIDED in summary["added"]:  # the main figures read guided by names, the plain read's beside
        figures.update({f"{key}_plain": figures[key] for key in PLAIN_BESIDE})
        guided_trained = mean("test", before + NAME_GUIDED, "free", "all")
        guided_added = mean("added", system + NAME_GUIDED, "free", "all")
        figures.update({
            "added_over_trained_em": above_floor(guided_added, guided_trained),
            "added_recall": mean("added", system + NAME_GUIDED, "memory_recall"),
            "trained_em_change": round(mean("test", system + NAME_GUIDED, "free", "all") - guided_trained, 2),
            "added_em": guided_added, "trained_em_name_guided": guided_trained,
        })  # fmt: skip
    default_edmem = "before" in summary["test"]  # trained beside the writer (toy_world_growth's --no-default-edmem)
    if writer and default_edmem:
        figures["writer_cost_on_trained_em"] = round(mean("test", "before", "free", "all") - trained, 2)
    hidden = "free_practice_rows_hidden"
    if hidden in summary["test"][before]:  # the same, the practice people's rows hidden
        hidden_trained, hidden_added = mean("test", before, hidden, "all"), mean("added", system, hidden, "all")
        figures["added_over_trained_em_practice_rows_hidden"] = above_floor(hidden_added, hidden_trained)
        figures["trained_em_practice_rows_hidden"] = hidden_trained
        figures["added_em_practice_rows_hidden"] = hidden_added
        figures["trained_em_change_practice_rows_hidden"] = round(
            mean("test", system, hidden, "all") - hidden_trained, 2
        )
        if writer and default_edmem:
            default = mean("test", "before", hidden, "all")
            figures["writer_cost_on_trained_em_practice_rows_hidden"] = round(default - hidden_trained, 2)
    return figures


def test_group_reads(world: Path) -> int:
    """How many grown models of the world in `world` (every recipe's folder under it) have answered its test group
    of added people: each a reading of that group (a model's name-guided copy is the same model's reading)."""
    answered = {path.parent for path in world.glob("**/grown-*/predict-added-free")}
    return len({folder for folder in answered if not folder.name.endswith("-name-guided")})


def across_seeds(runs: list[dict], writer: bool) -> dict:
    """What a mean hides, for the headline: the worst seed's added-over-trained ratio (each read's: `..._min`,
    `..._plain_min`); with the writer, on how many seeds its added people's rows are read (the oracle read, the read
    forced onto their rows, at least `READING_LEARNED`), of the seeds run; how many of them are fresh (`FRESH_SEEDS`);
    and how often the most read seed's test group of added people has been answered (`test_group_reads`)."""
    per_seed = [headline_figures(summarise([run]), writer) for run in runs]
    figures = {}
    for key in ("added_over_trained_em", "added_over_trained_em_plain"):
        if key in per_seed[0]:
            figures[f"{key}_min"] = min((seed[key] for seed in per_seed if seed[key] is not None), default=None)
    if writer:
        oracle = [run["results"]["diagnostics"][WRITER]["oracle_read"]["oracle"] for run in runs]
        figures["reading_learned_seeds"] = sum(read >= READING_LEARNED for read in oracle)
    figures["seeds_run"] = len(runs)
    figures["fresh_seeds"] = len({run["seed"] for run in runs} & set(FRESH_SEEDS))
    figures["test_group_reads"] = max(run.get("test_group_reads", 0) for run in runs)  # the most read seed's
    return figures


def combined_runs(paths: list[Path], settings: dict) -> list[dict]:
    """The runs of results files written apart (`toy_world_growth.py --seeds N`, each on a machine of its own), in
    order of seed, as one run of their seeds would hold them. Refused (a ValueError naming the settings) where a
    file's recipe is not `settings`' (the command line's, as results.json records it) beyond its seeds, or a seed
    comes twice: the figures would mix recipes or count a seed twice."""

    def recipe(recorded: dict) -> dict:  # recorded settings but the seeds, `qa`'s flattened
        qa = {f"qa.{key}": value for key, value in recorded["qa"].items() if key != "seeds"}
        return {key: value for key, value in recorded.items() if key != "qa"} | qa

    wanted, runs = recipe(settings), []
    for path in paths:
        result = json.loads(Path(path).read_text(encoding="utf-8"))
        found = recipe(result["settings"])
        if differ := sorted(key for key in wanted.keys() | found.keys() if wanted.get(key) != found.get(key)):
            raise ValueError(f"{path} is a run of another recipe than the command line's: {', '.join(differ)} differ")
        runs += result["runs"]
    runs.sort(key=lambda run: run["seed"])
    if len(seeds := [run["seed"] for run in runs]) > len(set(seeds)):
        raise ValueError(f"a seed comes twice among the results files: {seeds}")
    return runs


# The settings the RESULT line names, in its order (a switch as 0 or 1; `pretrain_steps` is `settings.qa`'s)
RESULT_SETTINGS = ("practice_people", "practice_biographies", "practice_one_fact_pages", "practice_sentence_pages",
                   "practice_share", "practice_questions_people", "pretrain_steps", "written_table",
                   "row_autoencoding_share", "row_autoencoding_written_only", "writer_passages_by_mentions",
                   "writer_passages_per_row", "writer_pools_texts", "writer_answer_rows", "writer_reads_answer_rows",
                   "writer_answer_rows_by_text", "writer_mean_row_probability", "mean_row_probability_at_test",
                   "entity_key_dim", "writer_dropout", "writer_random_mask_prob", "writer_restart_unless_learned",
                   "added_texts", "fresh_names_like_written_only", "writer_decoy_rows", "written_row_share",
                   "writer_more_steps", "reader_steps", "reader_names_like_written_only",
                   "reader_row_autoencoding_share", "reader_fresh_name_share", "reader_decoy_rows",
                   "reader_decoys_for_every_entity")  # fmt: skip


def result_fields(
    settings: GrowthSettings, runs: list[dict], summary: dict, headline: dict, timing: dict
) -> list[str]:
    """The RESULT line's `key=value` fields: the run's size and settings, the headline figures, then each model's EM
    and recall, the bounds and floors, the diagnostics and the time to add."""

    def setting(name: str):
        value = settings.qa.pretrain_steps if name == "pretrain_steps" else getattr(settings, name)
        return int(value) if isinstance(value, bool) else value

    def figure(split: str, name: str, mode: str, kind: str = "all") -> float:
        return summary[split][name][mode][kind]["mean"]

    fields = [f"seeds={len(runs)}", f"people_added={len(runs[0]['held_out'])}"]
    fields += [f"{name}={setting(name)}" for name in RESULT_SETTINGS]
    fields += [f"added_questions={runs[0]['questions']['added']}", f"trained_questions={runs[0]['questions']['test']}"]
    fields += [f"{key}={value}" for key, value in headline.items()]  # fmt: skip
    for name in summary["added"]:
        fields += [f"added_em_{name}={figure('added', name, 'free')}",
                   f"added_em_entity_{name}={figure('added', name, 'free', 'entity')}",
                   f"added_memory_recall_{name}={summary['added'][name]['memory_recall']['mean']}"]  # fmt: skip
    for name in summary["test"]:
        fields += [f"trained_em_{name}={figure('test', name, 'free')}",
                   f"trained_memory_recall_{name}={summary['test'][name]['memory_recall']['mean']}"]  # fmt: skip
        if "memory_recall_practice_rows_hidden" in summary["test"][name]:
            hidden = summary["test"][name]["memory_recall_practice_rows_hidden"]["mean"]
            fields.append(f"trained_memory_recall_practice_rows_hidden_{name}={hidden}")
    for name in summary.get("practice", {}):  # questions in pre-training, through written rows for the writer
        fields.append(f"practice_em_{name}={figure('practice', name, 'free')}")
    fields += [f"{key}={value['mean']}" for key, value in summary.get("rows_alone", {}).items()]
    fields += [f"floor_em_{split}={value['mean']}" for split, value in summary["floor"].items()]
    fields += [f"passage_facts_{draw}={value['all']['mean']}" for draw, value in summary["passage_facts"].items()]
    for system, figures in summary["diagnostics"].items():
        fields += [f"{name}_{key}_{system}={value['mean']}" for name, group in figures.items()
                   for key, value in group.items()]  # fmt: skip
    for shape, estimators in timing.items():
        for estimator, sizes in estimators.items():
            at = "" if shape == "toy_model" else "_at_edmem_base_shape"
            fields += [f"seconds_to_add_{n}_{estimator}{at}={s}" for n, s in sizes.items()]
    return fields
