"""Which noise costs the private markers, and which levers help (one file, top-10 overlap with scanpy).

On one labelled file (groups = the true labels), the exact per-group table of
``dpsc.privacy._markers`` is released 3 times with seeded noise at each ε; each variant changes one
thing and prints the mean top-10 overlap with scanpy's t-test: noise on the sums only, on the squares
only, no noise term in the standard error, the variances taken from the rest or pooled, and
clipping at a quantile of the cells' own norms (an oracle: what a private quantile would give).

    OMP_NUM_THREADS=2 python benchmarks/diagnostics/markers_levers.py pbmc
"""

from __future__ import annotations

import math
import sys
import warnings
from pathlib import Path

import numpy as np
import scanpy as sc
import scipy.sparse as sp

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from cluster_benchmark import load

from dpsc.privacy import NoiseSource, calibrate_noise_multiplier
from dpsc.privacy import _markers as m


def main(name: str) -> None:
    warnings.filterwarnings("ignore")
    adata = load(Path("../shared/data"), name)
    adata.obs["group"] = adata.obs["label"].astype("category")
    ref = adata.copy()
    sc.pp.normalize_total(ref, target_sum=1e4)
    sc.pp.log1p(ref)
    sc.tl.rank_genes_groups(ref, "group", method="t-test", n_genes=adata.n_vars)
    groups = list(ref.obs["group"].cat.categories)
    codes = ref.obs["group"].cat.codes.to_numpy()
    truth = [list(ref.uns["rank_genes_groups"]["names"][g]) for g in groups]
    genes = np.asarray(adata.var_names)

    def overlap(order):
        return np.mean([len(set(genes[order[k, :10]]) & set(truth[k][:10])) / 10 for k in range(len(groups))])

    def rank(stats, variance="welch"):
        if variance == "welch":
            return m.rank_markers(stats).order
        counts = np.maximum(stats.counts, 1.0)
        rest = lambda x: x.sum(0, keepdims=True) - x  # noqa: E731
        mg, vg, ng, nzg = m._moments(stats.sums, stats.squares, counts, stats.sum_noise_sd)
        rc = np.maximum(rest(counts[:, None])[:, 0], 1.0)
        sd_rest = stats.sum_noise_sd * math.sqrt(len(counts) - 1)
        mr, vr, nr, nzr = m._moments(rest(stats.sums), rest(stats.squares), rc, sd_rest)
        if variance == "rest":
            vg = vr
        else:  # pooled over all cells
            _, pooled, _, _ = m._moments(
                stats.sums.sum(0, keepdims=True),
                stats.squares.sum(0, keepdims=True),
                np.array([counts.sum()]),
                0,
            )
            vg = vr = np.broadcast_to(pooled, vg.shape)
        return np.argsort(-(mg - mr) / np.sqrt(vg / ng + vr / nr + nzg + nzr), axis=1)

    table = m.MarkerTable(len(groups), adata.n_vars)
    exact = m.group_table(adata.X, codes, table)
    G = adata.n_vars
    for eps in (8.0, 2.0):
        release = m.marker_release(table, calibrate_noise_multiplier(eps, 1e-5, 1.0, 1))
        results = {}
        for variant in ("all noise", "sums only", "squares only", "no noise term", "rest var", "pooled var"):
            scores = []
            for r in range(3):
                noise = (release.release(exact, NoiseSource(r).stream("x")) - exact).reshape(len(groups), -1)
                noisy = exact.reshape(len(groups), -1).copy()
                if variant == "sums only":
                    noisy[:, :G] += noise[:, :G]
                elif variant == "squares only":
                    noisy[:, G : 2 * G] += noise[:, G : 2 * G]
                else:
                    noisy += noise
                stats = m.group_statistics(noisy.reshape(-1), table, release)
                if variant == "no noise term":
                    stats.sum_noise_sd = 0.0
                kind = {"rest var": "rest", "pooled var": "pooled"}.get(variant, "welch")
                scores.append(overlap(rank(stats, kind)))
            results[variant] = round(float(np.mean(scores)), 2)
        print(name, f"eps={eps:g}", results)
    X = sp.csr_matrix(adata.X, dtype=np.float64)
    totals = np.asarray(X.sum(1)).ravel()
    L = sp.diags(1e4 / np.where(totals > 0, totals, 1.0)) @ X
    L.data = np.log1p(L.data)
    norms = np.sqrt(np.asarray(L.multiply(L).sum(1)).ravel())
    L.data = L.data**2
    square_norms = np.sqrt(np.asarray(L.multiply(L).sum(1)).ravel())
    bound_of = m.MarkerTable.bounds
    for q in (0.5, 0.9, 1.0):
        bounds = {"sum": float(np.quantile(norms, q)), "squares": float(np.quantile(square_norms, q))}
        m.MarkerTable.bounds = property(lambda self, b=bounds: {**bound_of.fget(self), **b})
        clipped = m.group_table(adata.X, codes, table)
        for eps in (8.0, 2.0):
            release = m.marker_release(table, calibrate_noise_multiplier(eps, 1e-5, 1.0, 1))
            scores = [
                overlap(
                    m.rank_markers(
                        m.group_statistics(
                            release.release(clipped, NoiseSource(r).stream("x")), table, release
                        )
                    ).order
                )
                for r in range(3)
            ]
            print(name, f"clip at norm quantile {q}", f"eps={eps:g}", round(float(np.mean(scores)), 2))
    m.MarkerTable.bounds = bound_of


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "pbmc")
