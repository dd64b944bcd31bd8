"""The experiments' figures (matplotlib, drawn headless): EM by system with the seed-level intervals, EDMem with its
memory hidden, EM against pre-training steps, EM by recipe."""

from __future__ import annotations

from pathlib import Path

from experiments.scoring import reported_group


def plot_qa(summary: dict, out: Path, curve: list[dict] | None = None) -> list[Path]:
    """`toy_world_qa.py`'s figures in `out`: EM by system (`em_by_model.png`), EDMem with its memory hidden
    (`em_memory_hidden.png`) and, with a `curve`, memorisation and EM against pre-training steps
    (`em_against_steps.png`)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    paths = []
    group = reported_group(summary)
    test = summary[group]
    names = [n for n in ("edmem_free", "edmem_static", "edmem_dynamic", "encdec", "encdec_matched", "encmem",
                         "majority_answer") if n in test]  # fmt: skip
    fig, ax = plt.subplots(figsize=(9, 4))
    keys = (("all", "all"), ("entity", "entity answers"), ("literal", "literal answers"))
    width = 0.8 / len(keys)
    for i, (key, label) in enumerate(keys):
        means = [test[n]["em"][key] for n in names]
        errors = [[m - test[n]["interval"][key][0] for n, m in zip(names, means)],
                  [test[n]["interval"][key][1] - m for n, m in zip(names, means)]]  # fmt: skip
        ax.bar([x + i * width for x in range(len(names))], means, width, yerr=errors, label=label, capsize=3)
    ax.set_xticks([x + width for x in range(len(names))], [n.replace("_", "\n") for n in names])
    ax.set_ylabel("exact match (%), 95 % interval (seeds, then questions)")
    ax.set_title(f"Questions about people seen only in pre-training ({group} group)")
    ax.legend()
    fig.tight_layout()
    paths.append(out / "em_by_model.png")
    fig.savefig(paths[-1], dpi=120)
    plt.close(fig)

    memory = [("edmem_free", "whole memory"), ("edmem_free_subject_rows_hidden_at_test", "subjects' rows hidden\nat test"),
              ("edmem_free_every_row_hidden_at_test", "every row hidden\nat test"),
              ("edmem_free_hidden_in_finetuning", "every row hidden in\nfine-tuning and test"), ("encdec", "EncDec")]  # fmt: skip
    memory = [(name, label) for name, label in memory if name in test]
    fig, ax = plt.subplots(figsize=(8, 4))
    for i, (key, label) in enumerate((("entity", "entity answers"), ("literal", "literal answers"))):
        means = [test[n]["em"][key] for n, _ in memory]
        errors = [[m - test[n]["interval"][key][0] for (n, _), m in zip(memory, means)],
                  [test[n]["interval"][key][1] - m for (n, _), m in zip(memory, means)]]  # fmt: skip
        ax.bar([x + i * 0.4 for x in range(len(memory))], means, 0.4, yerr=errors, label=label, capsize=3)
    ax.set_xticks([x + 0.2 for x in range(len(memory))], [label for _, label in memory], fontsize=8)
    ax.set_ylabel("exact match (%)")
    ax.set_title("EDMem (free decoding) with its memory hidden")
    ax.legend()
    fig.tight_layout()
    paths.append(out / "em_memory_hidden.png")
    fig.savefig(paths[-1], dpi=120)
    plt.close(fig)
    if curve:
        fig, ax = plt.subplots(figsize=(7, 4))
        steps = [point["steps"] for point in curve]
        for variant, label in (("edmem", "EDMem (free)"), ("encdec", "EncDec")):
            for key, style, what in (("entity", "-o", "entity EM"), ("literal", ":o", "literal EM")):
                ax.plot(steps, [p[variant]["em_validation"][key] for p in curve], style, label=f"{label}, {what}")
            ax.plot(steps, [p[variant]["memorisation_validation"] for p in curve], "--x", label=f"{label}, memorised")
        ax.set_xlabel("pre-training steps")
        ax.set_ylabel("% (validation group)")
        ax.set_title("Memorisation and question answering against pre-training steps")
        ax.legend(fontsize=7)
        fig.tight_layout()
        paths.append(out / "em_against_steps.png")
        fig.savefig(paths[-1], dpi=120)
        plt.close(fig)
    return paths


def plot_recipes(result: dict, out: Path) -> Path:
    """EM of EDMem (free decoding) and EncDec under each recipe, entity and literal answers, in the reported group,
    with the seed-level intervals."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    recipes = {result["recipe"]: result, **result["other_recipes"]}
    group = result["validity"]["group"]
    bars = [
        (f"{system} {kind}", system, kind) for system in ("edmem_free", "encdec") for kind in ("entity", "literal")
    ]
    fig, ax = plt.subplots(figsize=(9, 4))
    width = 0.8 / len(recipes)
    for i, (name, recipe) in enumerate(recipes.items()):
        scores = recipe["summary"][group]
        means = [scores[system]["em"][kind] for _, system, kind in bars]
        errors = [[m - scores[system]["interval"][kind][0] for (_, system, kind), m in zip(bars, means)],
                  [scores[system]["interval"][kind][1] - m for (_, system, kind), m in zip(bars, means)]]  # fmt: skip
        ax.bar([x + i * width for x in range(len(bars))], means, width, yerr=errors, label=name, capsize=3)
    ax.set_xticks([x + 0.4 - width / 2 for x in range(len(bars))], [label for label, _, _ in bars])
    ax.set_ylabel(f"exact match (%), {group} group, 95 % interval")
    ax.set_title("Recipes: EDMem (free decoding) and EncDec")
    ax.legend(fontsize=8)
    fig.tight_layout()
    path = out / "em_by_recipe.png"
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def plot_growth(summary: dict, out: Path) -> Path:
    """`toy_world_growth.py`'s figure (`growth.png`): EM and memory recall of the added people against the trained
    ones, by model, with the spread over seeds."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    bars = [("added", "before", "added people, before adding"), ("added", "random", "added, random rows"),
            ("added", "mean_query", "added, mean query"), ("added", "fitted", "added, fitted rows"),
            ("added", "fitted_pretraining", "added, rows fitted on pre-training passages"),
            ("added", "continued_pretraining", "added, continued pre-training"),
            ("added", "writer", "added, rows by the writer (EDMem with a writer)"),
            ("test", "writer_before", "trained, EDMem with a writer"),
            ("test", "before", "trained test-half people, before"), ("test", "fitted", "trained, after fitted rows")]  # fmt: skip
    bars = [bar for bar in bars if bar[1] in summary[bar[0]]]
    groups = [("free", "all"), ("free", "entity"), ("free", "literal"), ("static", "entity"), ("memory_recall", None)]
    fig, ax = plt.subplots(figsize=(10, 4))
    width = 0.8 / len(bars)
    for i, (split, name, label) in enumerate(bars):
        figures = summary[split][name]
        means = [figures[m][k]["mean"] if k else figures[m]["mean"] for m, k in groups]
        stds = [figures[m][k]["std"] if k else figures[m]["std"] for m, k in groups]
        ax.bar([x + i * width for x in range(len(groups))], means, width, yerr=stds, label=label, capsize=2)
    ax.set_xticks([x + 0.4 - width / 2 for x in range(len(groups))],
                  ["EM free", "EM free, entity", "EM free, literal", "EM static, entity", "memory recall@1"])  # fmt: skip
    ax.set_ylabel("%")
    ax.set_title("People added after training against people trained in pre-training")
    ax.legend(fontsize=7)
    fig.tight_layout()
    path = out / "growth.png"
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
