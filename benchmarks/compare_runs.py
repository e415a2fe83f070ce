"""A Markdown table comparing two benchmark result files fit group by fit group.

A fit group is one (data set, configuration) pair; its ARI is summarised over seeds as the mean
and the population standard deviation (ddof 0),

    mean = (1/n) Σ_s ARI_s,    sd = sqrt((1/n) Σ_s (ARI_s − mean)²),

the same summary as ``dpdcan_benchmark.py --report``. Each row puts a group of the new file
beside the group of the same label in the old file (``not run`` where the old file has none),
with the new file's per-seed ARIs and the number of clusters its fits used. Rows follow the new
file: data sets in order of first appearance, then configurations in order of first appearance.

Usage (from the repo root)::

    python benchmarks/compare_runs.py benchmarks/results/dpdcan.jsonl \
        benchmarks/results/dpdcan_variants_secret.jsonl
    python benchmarks/compare_runs.py --by-rule benchmarks/results/sign_dpdcan.jsonl \
        benchmarks/results/sign_dpdcan_grid_secret.jsonl

``--by-rule`` lays out the sign-optimizer grid (configurations ``DP-DCAN eps=E RULE, …``) as
data set, ε and rule columns, ordered by data set, ε from largest, then rule.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
from pathlib import Path

DATASET_NAMES = {
    "pbmc": "PBMC 4k",
    "bladder": "mouse bladder",
    "goolam": "Goolam",
    "biase": "Biase",
    "yan": "Yan",
}
RULE_NAMES = {
    "sgd": "DP-SGD (cluster lr 0.1)",
    "adam": "DP-Adam",
    "dpsignsgd": "DP-SignSGD",
    "dpsignadam": "DP-SignAdam",
}
Groups = dict[tuple[str, str], dict[int, dict]]


def load_groups(path: Path) -> Groups:
    """Rows of a JSON-lines results file, grouped by (data set, configuration) and keyed by seed."""
    groups: Groups = {}
    for line in path.read_text().splitlines():
        if line.strip():
            row = json.loads(line)
            groups.setdefault((row["dataset"], row["config"]), {})[row["seed"]] = row
    return groups


def summary(fits: dict[int, dict], per_seed: bool) -> str:
    """``mean ± sd`` of the ARI over seeds (ddof 0), optionally followed by the per-seed values."""
    aris = [fits[seed]["ari"] for seed in sorted(fits)]
    text = f"{statistics.mean(aris):.3f} ± {statistics.pstdev(aris):.3f}"
    if len(aris) != 3:
        text += f" [{len(aris)} seeds]"
    return text + (f" ({', '.join(f'{a:.3f}' for a in aris)})" if per_seed else "")


def clusters_used(fits: dict[int, dict]) -> str:
    return ", ".join(str(fits[seed]["n_clusters_found"]) for seed in sorted(fits))


def row(labels: list[str], old: Groups, new: Groups, key: tuple[str, str]) -> str:
    """``| labels… | old | new (per seed) | clusters used |`` for one fit group."""
    before = summary(old[key], per_seed=False) if key in old else "not run"
    cells = [*labels, before, summary(new[key], per_seed=True), clusters_used(new[key])]
    return "| " + " | ".join(cells) + " |"


def by_configuration(old: Groups, new: Groups) -> list[str]:
    """Table ``| data set | configuration | old | new (per seed) | clusters used |``."""
    datasets = list(dict.fromkeys(dataset for dataset, _ in new))
    keys = sorted(new, key=lambda key: datasets.index(key[0]))  # stable: file order within a data set
    head = ["| data set | configuration | seeded | secret noise | clusters used |", "|---|---|---|---|---|"]
    return head + [row([DATASET_NAMES.get(key[0], key[0]), f"`{key[1]}`"], old, new, key) for key in keys]


def by_rule(old: Groups, new: Groups) -> list[str]:
    """Table ``| data set | ε | rule | old | new (per seed) | clusters used |`` of the sign grid."""
    datasets = list(dict.fromkeys(dataset for dataset, _ in new))

    def parts(key: tuple[str, str]) -> tuple[int, int, str]:
        """Data set's position, ε and rule of a configuration ``DP-DCAN eps=E RULE, …``."""
        epsilon = int(re.search(r"eps=(\d+)", key[1]).group(1))
        return datasets.index(key[0]), epsilon, key[1].split()[2].rstrip(",")

    keys = sorted(new, key=lambda key: (parts(key)[0], -parts(key)[1], list(RULE_NAMES).index(parts(key)[2])))
    head = ["| data set | ε | rule | seeded | secret noise | clusters used |", "|---|---|---|---|---|---|"]
    return head + [
        row([DATASET_NAMES.get(key[0], key[0]), str(parts(key)[1]), RULE_NAMES[parts(key)[2]]], old, new, key)
        for key in keys
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("old", type=Path, help="results file of the earlier run")
    parser.add_argument("new", type=Path, help="results file of the rerun; one row per fit group")
    parser.add_argument("--by-rule", action="store_true", help="data set, ε and rule columns")
    args = parser.parse_args()
    old, new = load_groups(args.old), load_groups(args.new)
    print("\n".join((by_rule if args.by_rule else by_configuration)(old, new)))


if __name__ == "__main__":
    main()
