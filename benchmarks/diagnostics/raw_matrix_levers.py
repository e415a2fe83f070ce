"""Where `tl.fit` loses accuracy on an all-genes matrix, and why its collapse note stays silent.

Five questions, each printed one line per fit (labels only score; results in
``benchmarks/results/raw_matrix_diagnostics.md``)::

    # the same full-scope fit without noise: is exact gene selection as good as the file's list?
    python benchmarks/diagnostics/raw_matrix_levers.py no-noise bladder_all bladder
    # the gene selection's share of the fit's ε (full scope, ε = 8, seeds 0-2)
    python benchmarks/diagnostics/raw_matrix_levers.py share bladder_all 0.1,0.2,0.3
    python benchmarks/diagnostics/raw_matrix_levers.py share paul 0.1,0.2,0.3
    # the statistic the gene selection ranks by, released and exact (full scope, ε = 8, seeds 0-4)
    python benchmarks/diagnostics/raw_matrix_levers.py statistic bladder_all paul
    python benchmarks/diagnostics/raw_matrix_levers.py statistic bladder_all paul dp_mean_alone
    # released DEC frequencies against the labels the fit writes (full scope, ε = 8, seeds 0-2)
    python benchmarks/diagnostics/raw_matrix_levers.py frequencies bladder bladder_all pbmc
    # the collapse note on the released label counts (ε = 8, seeds 0-2, secret noise)
    python benchmarks/diagnostics/raw_matrix_levers.py note encoder paul bladder_all
    python benchmarks/diagnostics/raw_matrix_levers.py note full paul bladder_all

Run from the repository root with ``OMP_NUM_THREADS=1``; the data sets are those of
``benchmarks/dpdcan_benchmark.py`` (``--data`` defaults to ``../shared/data``).
"""

from __future__ import annotations

import json
import sys
import warnings
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import dpdcan_benchmark as bench

DATA = Path("../shared/data")


def _ari(adata) -> float:
    from sklearn.metrics import adjusted_rand_score

    return round(float(adjusted_rand_score(adata.obs["label"], adata.obs["dp_cluster"])), 3)


def no_noise(names: list[str]) -> None:
    """Full-scope fits without noise (exact gene selection on an all-genes file)."""
    import dpsc

    for name in names:
        for seed in (0, 1):
            adata = bench.load(name, DATA)
            k = adata.obs["label"].nunique()
            dpsc.tl.fit(
                adata, epsilon=None, scope="full", n_clusters=k, random_state=seed, progress_bar=False
            )
            print(name, seed, "non-private full", _ari(adata), flush=True)


def share(name: str, shares: str) -> None:
    """Full-scope fits at ε = 8 with the gene selection taking each share of the ε split."""
    import dpsc
    import dpsc.model._dcan_privacy as plan_module

    for value in map(float, shares.split(",")):
        plan_module.GENE_SELECTION_SHARE = value
        for seed in (0, 1, 2):
            adata = bench.load(name, DATA)
            k = adata.obs["label"].nunique()
            dpsc.tl.fit(adata, epsilon=8, scope="full", n_clusters=k, random_state=seed, progress_bar=False)
            sigma = adata.uns["dpsc"]["X_dpdcan"]["privacy"].get("genes_noise_multiplier", np.nan)
            print(name, value, seed, _ari(adata), "sigma_g", round(float(sigma), 2), flush=True)


STATISTICS = ("second_moment", "mean", "variance", "dispersion")
#: ``mean_alone``: rank by the mean from a release of the sums of z alone (sensitivity 1, n public),
#: which is all a mean ranking reads; emulated by the release at sensitivity 1 (noise sd σ on S1).


def _ranking(statistic: str):
    """``_hvg.rank_genes`` ordering the eligible genes by ``statistic`` (dispersion: variance / mean)."""
    from dpsc.methods import _hvg

    rank = _hvg.rank_genes

    def ranked(released, release, square_clip, min_mean_sd, flavor):
        if statistic != "dispersion":
            return rank(released, release, square_clip, min_mean_sd, statistic)
        means, variances, eligible, _ = rank(released, release, square_clip, min_mean_sd, flavor)
        score = np.where(eligible, variances / np.maximum(means, 1e-12), -np.inf)
        return means, variances, eligible, np.lexsort((-score, ~eligible))

    return ranked


def statistic(names: list[str], only: tuple[str, ...] = ()) -> None:
    """Full-scope fits at ε = 8 whose gene selection ranks by each statistic, from the released
    gene statistics (``dp``) and from the exact ones (``exact``: the selection alone without noise,
    the rest of the fit private as usual; ``dp_mean_alone``: see :data:`STATISTICS`). Source
    names among ``names`` restrict the run to those sources."""
    import dpsc
    from dpsc.methods import _hvg

    release, rank = _hvg.gene_statistics_release, _hvg.rank_genes
    sources = {
        "dp": release,
        "exact": lambda n_genes, sigma: release(n_genes, 0.0),
        "dp_mean_alone": lambda n_genes, sigma: _hvg.GaussianSum("gene means", 2 * n_genes + 1, 1.0, sigma),
    }
    chosen = {"dp": STATISTICS, "exact": ("second_moment", "dispersion"), "dp_mean_alone": ("mean",)}
    for name in names:
        for source in sources if not only else only:
            for stat in chosen[source]:
                _hvg.rank_genes = _ranking(stat)
                _hvg.gene_statistics_release = sources[source]
                for seed in range(5):
                    adata = bench.load(name, DATA)
                    k = adata.obs["label"].nunique()
                    dpsc.tl.fit(
                        adata, epsilon=8, scope="full", n_clusters=k, random_state=seed, progress_bar=False
                    )
                    print(name, source, stat, seed, _ari(adata), flush=True)
    _hvg.gene_statistics_release, _hvg.rank_genes = release, rank


def frequencies(names: list[str]) -> None:
    """Released DEC frequencies and their noise beside the count of cells each cluster labels."""
    import dpsc

    for name in names:
        for seed in (0, 1, 2):
            adata = bench.load(name, DATA)
            k = adata.obs["label"].nunique()
            model = dpsc.tl.fit(
                adata,
                epsilon=8,
                scope="full",
                n_clusters=k,
                random_state=seed,
                progress_bar=False,
                return_model=True,
            )
            released = np.asarray(model.released_frequencies())
            counts = np.bincount(adata.obs["dp_cluster"].astype(int), minlength=k)
            row = {
                "data": name,
                "seed": seed,
                "n": adata.n_obs,
                "k": k,
                "noise_sd": float(model.frequency_noise_),
            }
            print(json.dumps({**row, "f": released.round(1).tolist(), "hard": counts.tolist()}), flush=True)


def note(scope: str, names: list[str]) -> None:
    """Whether the collapse note fires: released label counts beside the labels the fit writes."""
    import dpsc

    for name in names:
        for seed in (0, 1, 2):
            adata = bench.load(name, DATA)
            k = adata.obs["label"].nunique()
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                model = dpsc.tl.fit(
                    adata,
                    epsilon=8,
                    scope=scope,
                    n_clusters=k,
                    random_state=seed,
                    progress_bar=False,
                    return_model=True,
                )
            hard = np.bincount(adata.obs["dp_cluster"].astype(int), minlength=k)
            row = {
                "data": name,
                "scope": scope,
                "seed": seed,
                "n": adata.n_obs,
                "k": k,
                "noise_sd": round(float(model.label_count_noise_), 3),
                "released": np.asarray(model.released_label_counts()).round(1).tolist(),
                "in_use": int(adata.uns["dpsc"]["X_dpdcan"]["clusters_in_use"]),
                "note": any("clusters hold" in str(w.message) for w in caught),
                "hard": hard.tolist(),
                "hard_2pct": int((hard >= 0.02 * adata.n_obs).sum()),
                "ari": _ari(adata),
            }
            print(json.dumps(row), flush=True)


def main() -> None:
    warnings.filterwarnings("ignore")
    torch.set_num_threads(1)
    question, *rest = sys.argv[1:]
    if question == "no-noise":
        no_noise(rest)
    elif question == "share":
        share(rest[0], rest[1])
    elif question == "statistic":
        sources = tuple(name for name in rest if name.startswith(("dp", "exact")))
        statistic([name for name in rest if name not in sources], sources)
    elif question == "frequencies":
        frequencies(rest)
    elif question == "note":
        note(rest[0], rest[1:])
    else:
        raise SystemExit(f"unknown question {question!r}: no-noise, share, statistic, frequencies or note")


if __name__ == "__main__":
    main()
