"""``donor_key=``: what a donor-level guarantee keeps of the cell-level result.

For each cohort, ARI against the known types of ``tl.cluster`` at the donor level (``donor_key``:
each cell weighted 1/(its donor's cells), ε per donor) beside the same call at the cell level on
the same cells, with and without a public reference, at ε = 8, ``--runs`` noise draws each; and
the top-10 overlap of ``tl.rank_genes_groups`` (the known types as groups) with scanpy's t-test
markers, per donor and per cell. No constant is chosen here: the donor unit has none (its weights
follow from the mechanism).

Cohorts:
- real donors: TMS liver (reference: the 4 young mice; private: the 5 old ones; 2 types) and
  OneK1K B cells (reference: 50 donors; private: the other 50; naive vs memory B, near 0 ARI for
  scanpy too);
- pseudo-donors (``--donors``): PBMC 4k (a random half as the reference, the other half private)
  and Baron mouse pancreas (mouse 1 as the reference, mouse 2 private), the private cells split
  into D donors of uneven sizes (log-normal, σ = 1), every donor at least one cell.

``tl.fit(donor_key=...)`` is measured the same way with the reference (the model per donor beside
per cell). ``--start-priors`` instead sweeps the weight of the public start in the k-means' Lloyd
round (:data:`dpsc.methods.kmeans.START_PRIOR`, in count-noise sds) over the cohorts with a
reference, per cell and per donor; the report chooses it by leave one cohort out (the value with
the best mean donor / cell ratio on the other cohorts, reported on the one left out).

Commands (2 cores)::

    OMP_NUM_THREADS=2 python benchmarks/donor_unit.py --data ../shared/data --runs 3 \\
        --out benchmarks/results/donor_unit.jsonl
    OMP_NUM_THREADS=2 python benchmarks/donor_unit.py --data ../shared/data --runs 3 \\
        --start-priors 0 1 2 3 --out benchmarks/results/donor_unit_prior.jsonl
    python benchmarks/donor_unit.py --report benchmarks/results/donor_unit.jsonl \\
        --prior-report benchmarks/results/donor_unit_prior.jsonl
"""

from __future__ import annotations

import argparse
import json
import time
import warnings
from pathlib import Path

import anndata as ad
import numpy as np
from sklearn.metrics import adjusted_rand_score

import dpsc


def pseudo_donors(n_obs: int, n_donors: int, seed: int) -> np.ndarray:
    """Assign cells to ``n_donors`` donors of uneven (log-normal) sizes, each at least one cell."""
    rng = np.random.default_rng(seed)
    sizes = rng.lognormal(0.0, 1.0, n_donors)
    sizes = np.maximum(1, np.floor(sizes / sizes.sum() * (n_obs - n_donors)).astype(int) + 1)
    sizes[-1] += n_obs - sizes.sum()
    order = rng.permutation(n_obs)
    donors = np.empty(n_obs, dtype=object)
    start = 0
    for d, size in enumerate(sizes):
        donors[order[start : start + size]] = f"donor{d}"
        start += size
    return donors


def cohorts(data: Path, donor_counts: list[int]):
    """Yield (name, reference, private with obs['donor'], k)."""
    liver = ad.read_h5ad(data / "tms_liver_9mice_counts.h5ad")
    liver.obs["label"] = liver.obs["y"].astype(str)
    young = (liver.obs["condition"] == "YOUNG").to_numpy()
    yield "TMS liver, 5 real mice", liver[young].copy(), liver[~young].copy(), 2
    onek = ad.read_h5ad(data / "onek1k_bcells_100donors_counts.h5ad")
    onek.obs["label"] = onek.obs["y"].astype(str)
    names = np.sort(onek.obs["donor"].unique())
    half = np.isin(onek.obs["donor"], names[::2])
    yield "OneK1K B, 50 real donors", onek[half].copy(), onek[~half].copy(), 2
    pbmc = dpsc.datasets.pbmc4k()
    pbmc.obs["label"] = pbmc.obs["cell_type"].astype(str)
    order = np.random.default_rng(0).permutation(pbmc.n_obs)
    ref, private = (
        pbmc[np.sort(order[: pbmc.n_obs // 2])].copy(),
        pbmc[np.sort(order[pbmc.n_obs // 2 :])].copy(),
    )
    baron = ad.read_h5ad(data / "baron_mouse_pancreas_2donors_counts.h5ad")
    baron.obs["label"] = baron.obs["cell_type"].astype(str)
    one, two = (baron[baron.obs["donor"] == d].copy() for d in ("mouse1", "mouse2"))
    for name, reference, cells in (("PBMC 4k halves", ref, private), ("Baron m1→m2", one, two)):
        k = cells.obs["label"].nunique()
        for n_donors in donor_counts:
            if n_donors > cells.n_obs // 2:
                continue
            cohort = cells.copy()
            cohort.obs["donor"] = pseudo_donors(cohort.n_obs, n_donors, seed=n_donors)
            yield f"{name}, {n_donors} pseudo-donors", reference, cohort, k


def run(args: argparse.Namespace) -> None:
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    for name, reference, cells, k in cohorts(Path(args.data), args.donors):
        truth = cells.obs["label"].to_numpy()
        for with_reference in (False, True):
            for unit in ("cell", "donor"):
                for run_index in range(args.runs):
                    adata = cells.copy()
                    start = time.perf_counter()
                    with warnings.catch_warnings(record=True) as caught:
                        warnings.simplefilter("always")
                        dpsc.tl.cluster(
                            adata,
                            k,
                            epsilon=args.epsilon,
                            donor_key="donor" if unit == "donor" else None,
                            reference=reference if with_reference else None,
                            reference_key="label" if with_reference else None,
                        )
                    row = {
                        "kind": "cluster",
                        "cohort": name,
                        "reference": with_reference,
                        "unit": unit,
                        "run": run_index,
                        "epsilon": args.epsilon,
                        "n_cells": int(adata.n_obs),
                        "n_donors": int(cells.obs["donor"].nunique()),
                        "ari": float(adjusted_rand_score(truth, adata.obs["dp_cluster"])),
                        "seconds": time.perf_counter() - start,
                        "noise_warning": any("dominated by noise" in str(w.message) for w in caught),
                    }
                    with out.open("a") as handle:
                        handle.write(json.dumps(row) + "\n")
                    print(row, flush=True)
        markers(name, cells, args, out)
        fits(name, reference, cells, k, args, out)


def fits(name: str, reference: ad.AnnData, cells: ad.AnnData, k: int, args, out: Path) -> None:
    """ARI of ``tl.fit(reference=...)`` per cell and per donor (the default model, its record's ε)."""
    truth = cells.obs["label"].to_numpy()
    for unit in ("cell", "donor"):
        for run_index in range(args.runs):
            adata = cells.copy()
            start = time.perf_counter()
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                dpsc.tl.fit(
                    adata,
                    k,
                    epsilon=args.epsilon,
                    reference=reference,
                    reference_key="label",
                    donor_key="donor" if unit == "donor" else None,
                    progress_bar=False,
                )
            params = adata.uns["dpsc"]["X_dpdcan"]["params"]
            row = {
                "kind": "fit",
                "cohort": name,
                "unit": unit,
                "run": run_index,
                "epsilon": args.epsilon,
                "n_donors": int(cells.obs["donor"].nunique()),
                "ari": float(adjusted_rand_score(truth, adata.obs["dp_cluster"])),
                "partition": params.get("partition"),
                "seconds": time.perf_counter() - start,
            }
            with out.open("a") as handle:
                handle.write(json.dumps(row) + "\n")
            print(row, flush=True)


def sweep_priors(args: argparse.Namespace) -> None:
    """ARI of ``tl.cluster(reference=...)`` per cell and per donor at each weight of the public start."""
    from dpsc.methods import kmeans as _kmeans

    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    for name, reference, cells, k in cohorts(Path(args.data), args.donors):
        truth = cells.obs["label"].to_numpy()
        for prior in args.start_priors:
            _kmeans.START_PRIOR = prior
            for unit in ("cell", "donor"):
                for run_index in range(args.runs):
                    adata = cells.copy()
                    with warnings.catch_warnings():
                        warnings.simplefilter("ignore")
                        dpsc.tl.cluster(
                            adata,
                            k,
                            epsilon=args.epsilon,
                            donor_key="donor" if unit == "donor" else None,
                            reference=reference,
                            reference_key="label",
                        )
                    row = {
                        "kind": "prior",
                        "cohort": name,
                        "prior": prior,
                        "unit": unit,
                        "run": run_index,
                        "ari": float(adjusted_rand_score(truth, adata.obs["dp_cluster"])),
                    }
                    with out.open("a") as handle:
                        handle.write(json.dumps(row) + "\n")
                    print(row, flush=True)


def prior_report(path: Path) -> str:
    """The leave-one-cohort-out choice of the public start's weight, as a Markdown table."""
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    cohorts_seen = list(dict.fromkeys(r["cohort"] for r in rows))
    priors = sorted({r["prior"] for r in rows})

    def mean_ari(cohort: str, prior: float, unit: str) -> float:
        return float(
            np.mean([r["ari"] for r in rows if (r["cohort"], r["prior"], r["unit"]) == (cohort, prior, unit)])
        )

    def kept(cohort: str, prior: float) -> float:
        return mean_ari(cohort, prior, "donor") / max(mean_ari(cohort, prior, "cell"), 1e-9)

    lines = [
        "### The public start's weight, by leave one cohort out",
        "",
        f"Weight of the reference types' means in the k-means' Lloyd round, in count-noise sds (candidates "
        f"{', '.join(f'{p:g}' for p in priors)}): for each cohort left out, the weight with the best mean "
        "*kept* (donor-level ARI / cell-level ARI at that weight) on the other cohorts, and what it keeps "
        "on the one left out; ε = 8, with the reference, mean of "
        f"{max(r['run'] for r in rows) + 1} noise draws. Command in `benchmarks/donor_unit.py`.",
        "",
        "| cohort left out | chosen on the others | kept (chosen) | kept (0: no weight) "
        "| cell-level ARI (chosen / 0) |",
        "|---|---|---|---|---|",
    ]
    for held in cohorts_seen:
        others = [c for c in cohorts_seen if c != held]
        chosen = max(priors, key=lambda p: (np.mean([kept(c, p) for c in others]), -p))
        lines.append(
            f"| {held} | {chosen:g} | {kept(held, chosen):.2f} | {kept(held, 0.0):.2f} | "
            f"{mean_ari(held, chosen, 'cell'):.3f} / {mean_ari(held, 0.0, 'cell'):.3f} |"
        )
    return "\n".join(lines) + "\n"


def scanpy_markers(cells: ad.AnnData) -> dict[str, list[str]]:
    """scanpy's t-test top-10 genes of each known type (non-private; the yardstick)."""
    import scanpy as sc

    ref = cells.copy()
    sc.pp.normalize_total(ref, target_sum=1e4)
    sc.pp.log1p(ref)
    sc.tl.rank_genes_groups(ref, "label", method="t-test")
    names = ref.uns["rank_genes_groups"]["names"]
    return {group: list(names[group][:10]) for group in names.dtype.names}


def markers(name: str, cells: ad.AnnData, args: argparse.Namespace, out: Path) -> None:
    """Top-10 overlap of tl.rank_genes_groups with scanpy's, per cell and per donor (types as groups)."""
    cells = cells.copy()
    cells.obs["label"] = cells.obs["label"].astype("category")
    truth = scanpy_markers(cells)
    for unit in ("cell", "donor"):
        for run_index in range(args.runs):
            adata = cells.copy()
            start = time.perf_counter()
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                dpsc.tl.rank_genes_groups(
                    adata, "label", epsilon=args.epsilon, donor_key="donor" if unit == "donor" else None
                )
            names = adata.uns["rank_genes_groups"]["names"]
            overlap = np.mean([len(set(names[g][:10]) & set(truth[g])) / 10 for g in truth])
            row = {
                "kind": "markers",
                "cohort": name,
                "unit": unit,
                "run": run_index,
                "epsilon": args.epsilon,
                "n_donors": int(cells.obs["donor"].nunique()),
                "top10": float(overlap),
                "seconds": time.perf_counter() - start,
            }
            with out.open("a") as handle:
                handle.write(json.dumps(row) + "\n")
            print(row, flush=True)


def _by_unit(rows: list[dict], cohort: str) -> tuple[list[dict], list[dict], list[dict], float]:
    """One cohort's rows, its cell- and donor-level rows, and the donor / cell ratio of mean times."""
    pick = [r for r in rows if r["cohort"] == cohort]
    cell = [r for r in pick if r["unit"] == "cell"]
    donor = [r for r in pick if r["unit"] == "donor"]
    timing = np.mean([r["seconds"] for r in donor]) / np.mean([r["seconds"] for r in cell])
    return pick, cell, donor, float(timing)


def report(path: Path) -> str:
    every = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    rows = [r for r in every if r.get("kind", "cluster") == "cluster"]
    cohorts_seen = list(dict.fromkeys(r["cohort"] for r in rows))
    lines = [
        "# The donor unit: `tl.cluster(donor_key=...)` against the cell level",
        "",
        f"ARI against the known types, mean of {max(r['run'] for r in rows) + 1} noise draws at ε = "
        f"{rows[0]['epsilon']:g}; *kept*: donor level / cell level on the same cells; *warned*: the "
        "call said before spending that its k-means would be dominated by noise; times on 2 cores, one "
        "process. Command: `OMP_NUM_THREADS=2 python benchmarks/donor_unit.py --data ../shared/data "
        "--runs 3`, then `--report benchmarks/results/donor_unit.jsonl --prior-report "
        "benchmarks/results/donor_unit_prior.jsonl`; cohorts and pseudo-donors in its docstring.",
        "",
        "| cohort | donors | reference | cell level | donor level | kept | warned | time donor / cell |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for cohort in cohorts_seen:
        for with_reference in (False, True):
            pick = [r for r in rows if r["cohort"] == cohort and r["reference"] == with_reference]
            if not pick:
                continue
            cell = [r for r in pick if r["unit"] == "cell"]
            donor = [r for r in pick if r["unit"] == "donor"]
            a_cell, a_donor = np.mean([r["ari"] for r in cell]), np.mean([r["ari"] for r in donor])
            kept = f"{a_donor / a_cell:.2f}" if a_cell > 0.05 else "–"
            timing = np.mean([r["seconds"] for r in donor]) / np.mean([r["seconds"] for r in cell])
            warned = "yes" if any(r["noise_warning"] for r in donor) else "no"
            lines.append(
                f"| {cohort} | {pick[0]['n_donors']} | {'yes' if with_reference else 'no'} | {a_cell:.3f} | "
                f"{a_donor:.3f} | {kept} | {warned} | {timing:.2f} |"
            )
    fit_rows = [r for r in every if r.get("kind") == "fit"]
    if fit_rows:
        lines += [
            "",
            "The deep model: `tl.fit(reference=..., reference_key=...)` per cell and per donor (DP-SGD draws "
            "donors, one random cell each), ARI, same runs and ε; *model kept*: runs whose labels are the "
            "model's partition rather than its starting clustering's.",
            "",
            "| cohort | donors | cell level | donor level | kept | model kept (donor) | time donor / cell |",
            "|---|---|---|---|---|---|---|",
        ]
        for cohort in dict.fromkeys(r["cohort"] for r in fit_rows):
            pick, cell, donor, timing = _by_unit(fit_rows, cohort)
            a_cell, a_donor = np.mean([r["ari"] for r in cell]), np.mean([r["ari"] for r in donor])
            kept = f"{a_donor / a_cell:.2f}" if a_cell > 0.05 else "–"
            model = sum(r["partition"] == "model" for r in donor)
            lines.append(
                f"| {cohort} | {pick[0]['n_donors']} | {a_cell:.3f} | {a_donor:.3f} | {kept} | "
                f"{model} of {len(donor)} | {timing:.2f} |"
            )
    marker_rows = [r for r in every if r.get("kind") == "markers"]
    if marker_rows:
        lines += [
            "",
            "Markers: top-10 overlap of `tl.rank_genes_groups` (the known types as groups) with scanpy's "
            "t-test markers on the same cells, per cell and per donor, same runs and ε.",
            "",
            "| cohort | donors | cell level | donor level | time donor / cell |",
            "|---|---|---|---|---|",
        ]
        for cohort in dict.fromkeys(r["cohort"] for r in marker_rows):
            pick, cell, donor, timing = _by_unit(marker_rows, cohort)
            lines.append(
                f"| {cohort} | {pick[0]['n_donors']} | {np.mean([r['top10'] for r in cell]):.2f} | "
                f"{np.mean([r['top10'] for r in donor]):.2f} | {timing:.2f} |"
            )
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", default="../shared/data")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--epsilon", type=float, default=8.0)
    parser.add_argument("--donors", type=int, nargs="+", default=[20, 100, 1000])
    parser.add_argument("--out", default="benchmarks/results/donor_unit.jsonl")
    parser.add_argument("--report", default=None, help="Write the Markdown table of this jsonl and stop.")
    parser.add_argument("--prior-report", default=None, help="With --report: add the weight's choice.")
    parser.add_argument("--start-priors", type=float, nargs="+", default=None)
    args = parser.parse_args()
    if args.report:
        path = Path(args.report)
        text = report(path)
        if args.prior_report:
            text += "\n" + prior_report(Path(args.prior_report))
        print(text, end="")
        return
    if args.start_priors:
        sweep_priors(args)
        return
    run(args)


if __name__ == "__main__":
    main()
