"""Cluster names from a public reference: the density test with and without each centroid's noise.

On the reference / private pairs of ``reference_pairs.py`` whose reference has the private cells'
types (Baron donors, CellBench plates, the random halves), ``tl.cluster(reference=...,
reference_key="label")`` at ε = 8 and 2 (noise seeds 20, 21, 22) names its clusters; each run's
released centroids are also named by the other rule (``dpsc._public_reference.name_centroids``
with and without the centroids' noise, ``NOISE_AWARE``). Scored: the share of cells whose cluster
name is their type, and, where one type is left out of the reference (``MISSING``), the share of
that type's cells named ``"unmatched"`` (and of the other cells). Two further columns bound the
rules: each cluster named after the nearest reference type with no density test, and after the
majority type of its own cells (labels: the ceiling of any naming of these clusters).

    OMP_NUM_THREADS=1 python benchmarks/reference_names.py --data ../shared/data \
        --out benchmarks/results/reference_names.jsonl
    python benchmarks/reference_names.py --report benchmarks/results/reference_names.jsonl \
        > benchmarks/results/reference_names.md
"""

from __future__ import annotations

import argparse
import json
import warnings
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pandas as pd
from reference_pairs import MISSING, SAME_TYPES, SEEDS, pairs


def _named(names: pd.Series, clusters: np.ndarray) -> np.ndarray:
    return pd.Series(names.to_numpy(), index=names.index.astype(str)).reindex(clusters).to_numpy()


def run(name: str, reference, private, out) -> None:
    """Append one row per (case, ε, seed) of this pair to ``out``."""
    import dpsc
    import dpsc._public_reference as naming
    from dpsc.tl._reference import reference_basis

    truth = private.obs["label"].astype(str).to_numpy()
    k = len(np.unique(truth))
    shared = reference[:, reference.var_names.isin(private.var_names)]
    cases = [("full", shared, (8.0, 2.0))]
    if name in MISSING:
        cases.append(("missing", shared[shared.obs["label"] != MISSING[name]].copy(), (8.0,)))
    for case, ref, epsilons in cases:
        public, basis = reference_basis(ref, "label", private, "benchmark")
        points, labels = naming.reference_points(public, basis), public.labels.astype(str).to_numpy()
        for epsilon in epsilons:
            for seed in SEEDS:
                cells = private.copy()
                with _seen_noise() as seen:
                    dpsc.tl.cluster(
                        cells, k, epsilon=epsilon, reference=ref, reference_key="label", noise_seed=seed
                    )
                clusters = cells.obs["dp_cluster"].astype(str).to_numpy()
                centroids = np.asarray(cells.uns["dpsc"]["dp_cluster"]["centroids"])
                noise = seen["noise"]
                rows = {}
                for rule, aware in (("shipped test", False), ("noise-aware test", True)):
                    naming.NOISE_AWARE = aware
                    names = naming.name_centroids(centroids, points, labels, noise)
                    rows[rule] = _named(names["name"], clusters)
                    rows["nearest type"] = _named(names["nearest_type"], clusters)
                naming.NOISE_AWARE = False
                majority = pd.Series(truth).groupby(clusters).agg(lambda x: x.value_counts().index[0])
                rows["majority (ceiling)"] = majority.reindex(clusters).to_numpy()
                entry = {"pair": name, "case": case, "epsilon": epsilon, "seed": seed}
                for rule, named in rows.items():
                    entry[rule] = float((named == truth).mean())
                    if case == "missing":
                        lacking = truth == MISSING[name]
                        entry[f"{rule}: missing type unmatched"] = float(
                            (named[lacking] == "unmatched").mean()
                        )
                        entry[f"{rule}: others unmatched"] = float((named[~lacking] == "unmatched").mean())
                out.write(json.dumps(entry) + "\n")
                out.flush()


@contextmanager
def _seen_noise():
    """Keep the centroids' noise that ``tl.cluster`` hands to its naming (the same call's release)."""
    import dpsc.tl._cluster as tool

    seen: dict = {}
    original = tool.name_clusters

    def keep(centroids, public, basis, noise=None):
        seen["noise"] = noise
        return original(centroids, public, basis, noise)

    tool.name_clusters = keep
    try:
        yield seen
    finally:
        tool.name_clusters = original


def report(path: Path) -> str:
    rows = pd.read_json(path, lines=True)
    rules = ["shipped test", "noise-aware test", "nearest type", "majority (ceiling)"]
    full = rows[rows["case"] == "full"]
    lines = [
        "# Cluster names from a public reference: the density test and the centroids' noise",
        "",
        "Share of private cells whose cluster is named after their own type (pairs whose reference has",
        "the private types; seeds 20–22). `nearest type`: no density test; `majority`: each cluster",
        "named after its own cells' most frequent type (labels; the ceiling for these clusters).",
        "Command: `python benchmarks/reference_names.py --data ../shared/data` (module docstring).",
        "",
        "| pair | ε | " + " | ".join(rules) + " |",
        "|---|---|" + "---|" * len(rules),
    ]
    table = full.groupby(["pair", "epsilon"])[rules].mean()
    for (pair, epsilon), values in table.iterrows():
        lines.append(f"| {pair} | {epsilon:g} | " + " | ".join(f"{values[r]:.2f}" for r in rules) + " |")
    for epsilon, values in full.groupby("epsilon")[rules].mean().sort_index(ascending=False).iterrows():
        lines.append(
            f"| **mean** | {epsilon:g} | " + " | ".join(f"**{values[r]:.2f}**" for r in rules) + " |"
        )
    missing = rows[rows["case"] == "missing"]
    if len(missing):
        lines += [
            "",
            "A type left out of the reference (ε = 8): share of its cells named `unmatched` (in brackets:",
            "of the other cells).",
            "",
            "| pair (type left out) | shipped test | noise-aware test |",
            "|---|---|---|",
        ]
        for pair, part in missing.groupby("pair"):
            cells = []
            for rule in ("shipped test", "noise-aware test"):
                lacking, others = part[f"{rule}: missing type unmatched"], part[f"{rule}: others unmatched"]
                cells.append(f"{lacking.mean():.2f} ({others.mean():.2f})")
            lines.append(f"| {pair} ({MISSING[pair]}) | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=Path("../shared/data"))
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/reference_names.jsonl"))
    parser.add_argument("--report", type=Path, default=None)
    args = parser.parse_args()
    if args.report:
        print(report(args.report), end="")
        return
    warnings.filterwarnings("ignore")
    with args.out.open("a") as out:
        for name, reference, private in pairs(args.data):
            if any(word in name for word in SAME_TYPES) and "endocrinogenesis" not in name:
                run(name, reference, private, out)
                print(name, flush=True)


if __name__ == "__main__":
    main()
