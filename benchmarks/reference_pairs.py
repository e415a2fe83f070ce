"""Reference-guided ``tl.cluster`` on reference / private pairs, against the same call without one.

Pairs (all in ``../shared/data``): Baron mouse pancreas donor 1 → donor 2 and back; CellBench,
each plate private with the other two as reference; the endocrinogenesis pancreas as a
cross-study reference for Baron (both donors); the labelled files split in two random disjoint
halves (seed 0: the first half is the reference); and pairs with a condition shift
(``shift_pairs``): TMS liver young → old mice and back, Baron m1 → m2 and the PBMC halves with an
interferon-like program added to the private cells (``stimulated``). Per pair: the issue's non-private scanpy
reference on the private cells alone (``cluster_lofo.scanpy_reference``), ``tl.cluster`` without
a reference and with one for every candidate, ε = 8 and 2, noise seeds 20, 21, 22, plus one run
without noise; and, where a type can be left out of the reference, the F1 of the cluster that
best holds that type's private cells (``missing``). Labels score only.

    OMP_NUM_THREADS=1 python benchmarks/reference_pairs.py --data ../shared/data \
        --out benchmarks/results/reference_pairs.jsonl
    python benchmarks/reference_pairs.py --report benchmarks/results/reference_pairs.jsonl
"""

from __future__ import annotations

import argparse
import json
import time
import warnings
from pathlib import Path

import anndata as ad
import numpy as np
import pandas as pd
from cluster_benchmark import load
from cluster_lofo import scanpy_reference
from sklearn.metrics import adjusted_rand_score

EPSILONS = (8.0, 2.0)
SEEDS = (20, 21, 22)
#: candidate: (components, radius quantile (None = unit sphere), where the DP k-means starts[,
#: its Lloyd rounds of the k public starting centroids (``PUBLIC_START_ROUNDS``)]). "sketch": its
#: own sketch release, as without a reference; "type means": the reference types' mean points
#: with ``reference_key`` (else the sketch). HISTORICAL candidates ran on the code of commit
#: 6f54837 and before, whose public starts ("reference kmeans": k-means of the reference's points;
#: "type means" without rounds: 4k starting centroids, oversampled Lloyd rounds) are gone.
CANDIDATES = {
    "ball, median radius": (16, 0.5, "sketch"),
    "sphere": (16, None, "sketch"),
    "ball, 0.9 radius": (16, 0.9, "sketch"),
    "ball, median radius, 32 components": (32, 0.5, "sketch"),
    "ball, 0.9 radius, reference k-means start": (16, 0.9, "reference kmeans"),
    "ball, 0.9 radius, type means start": (16, 0.9, "type means"),
    "ball, 0.9 radius, 8 components": (8, 0.9, "sketch"),
    "ball, 0.9 radius, 12 components": (12, 0.9, "sketch"),
    "ball, 0.9 radius, reference k-means start, 2 rounds of k": (16, 0.9, "reference kmeans", 2),
    "ball, 0.9 radius, type means start, 1 round of k": (16, 0.9, "type means", 1),
    "ball, 0.9 radius, type means start, 2 rounds of k": (16, 0.9, "type means", 2),
    "ball, 0.9 radius, type means start when most cells lie in a type, 1 round of k": (16, 0.9, "gated", 1),
}
HISTORICAL = (
    "ball, 0.9 radius, reference k-means start",
    "ball, 0.9 radius, type means start",
    "ball, 0.9 radius, reference k-means start, 2 rounds of k",
)
SHIPPED = "ball, 0.9 radius, type means start when most cells lie in a type, 1 round of k"
#: "gated" (shipped): one count release first (``dpsc.methods.type_gate``), then the type means
#: start unless the released share of cells within a reference type's spread is clearly below half
#: pairs whose reference has the private cells' types (names are scored there)
SAME_TYPES = ("baron", "cellbench", "halves", "tms")
HALVES = ("pbmc", "bladder", "bladder_allgenes", "paul15", "pancreas")
MISSING = {"baron m1→m2": "ductal", "cellbench plate1": "H1975"}
#: the stimulated pairs' program: a random share of the genes gains Poisson(EXTRA x size factor)
#: counts in every private cell (an interferon-like response shared by every type)
STIMULATED_GENES, EXTRA = 0.05, 2.0
#: the pairs whose private cohort is also run stimulated
STIMULATED = ("baron m1→m2", "pbmc halves")


def pairs(data: Path):
    """Yield (name, reference, private) AnnData pairs with ``obs["label"]``: both kinds below."""
    stimulate = []
    for pair in same_condition_pairs(data):
        yield pair
        if pair[0] in STIMULATED:
            stimulate.append(pair)
    yield from shift_pairs(data, stimulate)


def both_ways(cells, label: str, column: str, groups: tuple[str, str], names: tuple[str, str]):
    """Yield the two pairs of ``cells`` split by ``column`` into ``groups``, each group the reference once."""
    cells.obs["label"] = cells.obs[label].astype(str)
    first, second = (cells[cells.obs[column] == group].copy() for group in groups)
    yield names[0], first, second
    yield names[1], second, first


def same_condition_pairs(data: Path):
    """Yield the pairs whose cohort is in the reference's condition (or another study's)."""
    baron = ad.read_h5ad(data / "baron_mouse_pancreas_2donors_counts.h5ad")
    yield from both_ways(baron, "cell_type", "donor", ("mouse1", "mouse2"), ("baron m1→m2", "baron m2→m1"))
    bench = ad.read_h5ad(data / "cellbench_celseq2_5celllines_3plates_counts.h5ad")
    bench.obs["label"] = bench.obs["cell_type"].astype(str)
    for plate in ("plate1", "plate2", "plate3"):
        private = bench.obs["plate"] == plate
        yield f"cellbench {plate}", bench[~private].copy(), bench[private].copy()
    cross = load(data, "pancreas")
    yield "endocrinogenesis→baron", cross, baron.copy()
    for name in HALVES:
        cells = load(data, name)
        order = np.random.default_rng(0).permutation(cells.n_obs)
        half = cells.n_obs // 2
        yield f"{name} halves", cells[order[:half]].copy(), cells[order[half:]].copy()


def stimulated(cells, seed: int = 0):
    """Return ``cells`` with the stimulated pairs' program added to their counts (module constants)."""
    rng = np.random.default_rng(seed)
    counts = np.asarray(cells.X.toarray() if hasattr(cells.X, "toarray") else cells.X, dtype=np.float64)
    genes = rng.permutation(cells.n_vars)[: int(STIMULATED_GENES * cells.n_vars)]
    size = counts.sum(axis=1, keepdims=True) / counts.sum(axis=1).mean()
    counts[:, genes] += rng.poisson(EXTRA * size, size=(cells.n_obs, len(genes)))
    out = cells.copy()
    out.X = counts.astype(np.float32)
    return out


def shift_pairs(data: Path, stimulate: list):
    """Yield the pairs with a condition shift: TMS liver young / old mice, and the ``stimulate`` pairs'
    cohorts with the stimulated program (:func:`stimulated`)."""
    liver = ad.read_h5ad(data / "tms_liver_9mice_counts.h5ad")
    names = ("tms liver young→old", "tms liver old→young")
    yield from both_ways(liver, "y", "condition", ("YOUNG", "OLD"), names)
    for name, reference, private in stimulate:
        yield f"{name}, stimulated", reference, stimulated(private)


def best_f1(truth: np.ndarray, labels: np.ndarray, kind: str) -> float:
    """F1 of the cluster that best holds the private cells of type ``kind``."""
    inside = truth == kind
    scores = []
    for cluster in np.unique(labels):
        chosen = labels == cluster
        hit = (inside & chosen).sum()
        scores.append(2 * hit / (inside.sum() + chosen.sum()))
    return float(max(scores))


def _candidate(n_comps: int, quantile: float | None, start: str, rounds: int = 1) -> None:
    """Set the shipped code's switches to one candidate (module constants; restored by the shipped one)."""
    import dpsc._public_reference as public_reference
    import dpsc.tl._reference as reference_module
    from dpsc.methods import cluster_design
    from dpsc.methods import public_basis as public_basis

    public_reference.N_COMPS, public_basis.RADIUS_QUANTILE = n_comps, quantile
    cluster_design.PUBLIC_START_ROUNDS = rounds
    starts = {"type means": public_reference.type_start, "sketch": lambda *_: None}
    reference_module.type_start = starts.get(start, public_reference.type_start)
    # "gated" (shipped): the count chooses the start; "type means": the type start without the count
    reference_module.type_radii = public_reference.type_radii if start == "gated" else lambda *_: None


def run_pair(name: str, reference, private, out, candidates=None, baselines: bool = True) -> None:
    import dpsc

    truth = private.obs["label"].to_numpy()
    k = len(np.unique(truth))
    rows = []
    if baselines:
        rows.append(
            {
                "pair": name,
                "variant": "scanpy",
                "epsilon": None,
                "seed": 0,
                "ari": scanpy_ari(private, truth, k),
            }
        )
    for epsilon in EPSILONS if baselines else ():
        for seed in SEEDS:
            cells = private.copy()
            dpsc.tl.cluster(cells, k, epsilon=epsilon, noise_seed=seed)
            rows.append(row(name, "no reference", epsilon, seed, cells, truth))
    shared = reference[:, reference.var_names.isin(private.var_names)]
    named = any(word in name for word in SAME_TYPES)
    if named and baselines:
        rows.append(
            {"pair": name, "variant": "ingest", "epsilon": None, "seed": 0, "names": ingest(shared, private)}
        )
    for candidate, settings in CANDIDATES.items():
        if (candidates and candidate not in candidates) or candidate in HISTORICAL:
            continue
        _candidate(*settings)
        key = "label" if named else None
        for epsilon in (*EPSILONS, None):
            for seed in SEEDS if epsilon else (0,):
                cells = private.copy()
                start = time.process_time()
                dpsc.tl.cluster(
                    cells, k, epsilon=epsilon, reference=shared, reference_key=key, noise_seed=seed
                )
                entry = row(name, candidate, epsilon, seed, cells, truth, time.process_time() - start)
                entry.update(started(cells))
                if named:
                    entry["names"] = float((cells.obs["dp_cluster_names"].astype(str) == truth).mean())
                rows.append(entry)
        if name in MISSING:
            kind = MISSING[name]
            lacking = shared[shared.obs["label"] != kind].copy()
            for seed in SEEDS:
                cells = private.copy()
                dpsc.tl.cluster(
                    cells, k, epsilon=8.0, reference=lacking, reference_key="label", noise_seed=seed
                )
                found = best_f1(truth, cells.obs["dp_cluster"].to_numpy(), kind)
                unmatched = float(
                    (cells.obs["dp_cluster_names"].astype(str)[truth == kind] == "unmatched").mean()
                )
                entry = {**row(name, candidate, 8.0, seed, cells, truth), "missing": kind, "f1": found}
                rows.append({**entry, "missing_unmatched": unmatched})
    _candidate(*CANDIDATES[SHIPPED])
    for entry in rows:
        out.write(json.dumps(entry) + "\n")
    out.flush()


def started(cells) -> dict:
    """Which start a gated clustering's count chose (from its record; nothing for another plan)."""
    statement = cells.uns["dpsc"]["dp_cluster"]["privacy"]["statement"]
    if "which chose the start" not in statement:
        return {}
    return {"typed": "which chose the start (the types' mean points)" in statement}


def ingest(reference, private) -> float:
    """Accuracy of non-private label transfer as ``sc.tl.ingest`` makes it (15 neighbours, reference PCA).

    ``sc.tl.ingest`` itself fails with this environment's pynndescent, so its steps are written
    out: normalise and log both, the reference's 2,000 variable genes and 32 components, the query
    projected on them (centred by the reference's means), the majority label of 15 neighbours.
    """
    import scanpy as sc
    from sklearn.neighbors import KNeighborsClassifier

    genes = reference.var_names.intersection(private.var_names)
    ref, query = reference[:, genes].copy(), private[:, genes].copy()
    for cells in (ref, query):
        sc.pp.normalize_total(cells)
        sc.pp.log1p(cells)
    sc.pp.highly_variable_genes(ref, n_top_genes=min(2000, len(genes)), subset=True)
    query = query[:, ref.var_names].copy()
    sc.pp.pca(ref, n_comps=32)
    means = np.asarray(ref.X.mean(0)).ravel()
    projected = (
        np.asarray(query.X.toarray() if hasattr(query.X, "toarray") else query.X) - means
    ) @ ref.varm["PCs"]
    vote = KNeighborsClassifier(15).fit(ref.obsm["X_pca"], ref.obs["label"].astype(str))
    return float((vote.predict(projected) == private.obs["label"].astype(str).to_numpy()).mean())


def scanpy_ari(private, truth, k: int) -> float:
    return float(adjusted_rand_score(truth, scanpy_reference(private, k)))


def row(name, variant, epsilon, seed, cells, truth, cpu=None) -> dict:
    entry = {
        "pair": name,
        "variant": variant,
        "epsilon": epsilon,
        "seed": seed,
        "ari": float(adjusted_rand_score(truth, cells.obs["dp_cluster"].to_numpy())),
    }
    if cpu is not None:
        entry["cpu_s"] = round(cpu, 2)
    return entry


def report(path: Path) -> str:
    """Leave one pair out: the candidate chosen on the other pairs, reported on the held-out one."""
    rows = pd.read_json(path, lines=True)
    if "missing" not in rows:
        rows["missing"] = None
    plain = rows[rows["missing"].isna()]
    scanpy = plain[plain["variant"] == "scanpy"].set_index("pair")["ari"]
    private = plain[plain["epsilon"].isin(EPSILONS)]
    mean = private.groupby(["pair", "variant", "epsilon"])["ari"].mean().unstack("epsilon")
    ratio = mean.div(scanpy, level="pair", axis=0)
    pairs = list(scanpy.index)
    choice = {}
    for held in pairs:
        others = ratio.drop(index=held, level="pair").drop(index="no reference", level="variant")
        choice[held] = others.mean(axis=1).groupby("variant").mean().idxmax()
    lines = [
        "# `tl.cluster(reference=...)` on reference / private pairs, each pair held out",
        "",
        "ARI on the private cells, mean of 3 runs (noise seeds 20–22), composed ε;",
        "scanpy: the non-private recipe on the private cells alone (normalise, log1p, 2,000 variable",
        "genes, scale, 32 PCs, k-means), k = the number of labels. The candidate of each row is the one",
        "with the best mean ARI / scanpy over the other pairs (both ε); `no reference` is `tl.cluster`",
        "without one on the same cells. Cluster names are scored on the same releases, rule by rule, in",
        "the names table (next); this run keeps `sc.tl.ingest`'s accuracy for it.",
        "",
        "    OMP_NUM_THREADS=1 python benchmarks/reference_pairs.py --data ../shared/data \\",
        "        --out benchmarks/results/reference_pairs.jsonl",
        "    python benchmarks/reference_pairs.py --report benchmarks/results/reference_pairs.jsonl",
        "",
        "The four pairs with a condition shift (TMS liver young / old, the stimulated cohorts) ran later,",
        "with `--only` and their names, on the same candidates (the historical ones no longer exist).",
        "",
        "| held-out pair | candidate chosen | scanpy | reference ε=8 | reference ε=2 | no reference ε=8 "
        "| no reference ε=2 |",
        "|---|---|---|---|---|---|---|",
    ]
    held_ratios = {8.0: [], 2.0: []}
    plain_ratios = {8.0: [], 2.0: []}
    for pair in pairs:
        chosen = choice[pair]
        cells = [mean.loc[(pair, chosen), e] for e in EPSILONS] + [
            mean.loc[(pair, "no reference"), e] for e in EPSILONS
        ]
        for e in EPSILONS:
            held_ratios[e].append(mean.loc[(pair, chosen), e] / scanpy[pair])
            plain_ratios[e].append(mean.loc[(pair, "no reference"), e] / scanpy[pair])
        text = " | ".join(f"{c:.2f}" for c in cells)
        lines.append(f"| {pair} | {chosen} | {scanpy[pair]:.2f} | {text} |")
    lines += [
        "",
        "Mean ARI relative to scanpy over the held-out pairs (lowest pair in brackets):",
        "",
    ]
    for e in EPSILONS:
        guided, alone = np.array(held_ratios[e]), np.array(plain_ratios[e])
        lines.append(
            f"- ε = {e:g}: with a reference {guided.mean():.2f} ({guided.min():.2f}), without "
            f"{alone.mean():.2f} ({alone.min():.2f}); with ≥ without on {int((guided >= alone).sum())} of "
            f"{len(guided)} pairs"
        )
    exact = plain[(plain["variant"] == SHIPPED) & plain["epsilon"].isna()].groupby("pair")["ari"].mean()
    exact = exact.div(scanpy).dropna()
    lines.append(
        f"- without noise (the shipped call with `epsilon=None`, one run): {exact.mean():.2f} "
        f"({exact.min():.2f}): what this pipeline reaches on these pairs when privacy costs nothing"
    )
    lines += ["", "Every candidate on every pair (ARI / scanpy, mean of both ε):", ""]
    table = ratio.mean(axis=1).unstack("variant")
    lines.append("| pair | " + " | ".join(table.columns) + " |")
    lines.append("|---" * (len(table.columns) + 1) + "|")
    for pair in pairs:
        lines.append(f"| {pair} | " + " | ".join(f"{v:.2f}" for v in table.loc[pair]) + " |")
    overall = table.drop(columns="no reference").mean()
    lines += [
        "",
        "Over all pairs (the choice of what ships): "
        + ", ".join(f"{name} {value:.3f}" for name, value in overall.sort_values(ascending=False).items())
        + f"; shipped: {SHIPPED}. The `start` candidates (the DP k-means started from public centroids "
        "of the reference's points, k-means or the types' means, and no sketch release; `rounds of k`: "
        "only that many Lloyd releases of the k starting centroids; `when most cells lie in a type`: a "
        "released count of the cells within the types' spreads chooses between that start and the "
        "sketch, `dpsc.methods.type_gate`) and the 8 and 12 component ones "
        "(fewer coordinates for the same noise) ran later, with `--no-baselines --candidates …`; "
        + "; ".join(f"`{name}`" for name in HISTORICAL)
        + " ran on code this commit no longer has (module docstring). Every "
        "candidate tried stays in the protocol, so the held-out figures are over all of them.",
    ]
    missing = rows[rows["missing"].notna()]
    if len(missing):
        lines += ["", "A type left out of the reference (ε = 8): F1 of the cluster that best holds that", ""]
        lines[-2] += " type's private cells (their names: `reference_names.jsonl`):"
        lines += ["| pair (type left out) | candidate | F1 |", "|---|---|---|"]
        summary = missing.groupby(["pair", "missing", "variant"])["f1"].mean()
        for (pair, kind, variant), f1 in summary.items():
            lines.append(f"| {pair} ({kind}) | {variant} | {f1:.2f} |")
    cpu = plain[plain["variant"] == SHIPPED].groupby("pair")["cpu_s"].mean()
    lines += [
        "",
        f"CPU seconds of one `tl.cluster(reference=...)` call ({SHIPPED}): "
        + ", ".join(f"{p} {v:.1f}" for p, v in cpu.items())
        + ".",
    ]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=Path("../shared/data"))
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/reference_pairs.jsonl"))
    parser.add_argument("--only", nargs="*", default=None, help="pair names to run")
    parser.add_argument("--candidates", nargs="*", default=None, help="candidates to run (default: all)")
    parser.add_argument(
        "--no-baselines", action="store_true", help="only the candidates (scanpy and no-reference rows exist)"
    )
    parser.add_argument("--report", type=Path, default=None)
    args = parser.parse_args()
    if args.report:
        print(report(args.report))
        return
    warnings.filterwarnings("ignore")
    with args.out.open("a") as out:
        for name, reference, private in pairs(args.data):
            if args.only and name not in args.only:
                continue
            start = time.time()
            run_pair(name, reference, private, out, args.candidates, not args.no_baselines)
            print(f"{name}: {time.time() - start:.0f} s", flush=True)


if __name__ == "__main__":
    main()
