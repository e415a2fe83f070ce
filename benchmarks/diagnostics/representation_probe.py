"""Probe: a centred, gene-scaled, norm-clipped representation against tl.cluster's unit-norm one.

A prototype of the clustering issue's item 2, with seeded numpy noise (a benchmark, not a
release): the gene statistics release gives each gene's mean and variance (of the unit-norm
log1p(CP10k) cell); each cell becomes y = (z - mean) / variance**power on the kept genes, clipped
to ``clip_c`` times the public RMS norm sqrt(sum of variance / scale**2) and divided by it; one
release of the second moment of these rows (sensitivity 1) gives the top ``n_comps`` loadings;
the projections, clipped to ``radius_c`` times the RMS projection norm from the released
eigenvalues, go to the same DP k-means (Euclidean). The cell-sum release is not needed (its
share is left unused). Variants: ``unit`` (``tl.cluster`` itself), ``scaled`` (power 0.5, clip
1, radius 1), ``centred`` (no gene scale), ``scaled_c2`` / ``scaled_c05`` (clip 2 / 0.5),
``scaled_r2`` (radius 2), ``scaled_half`` (power 0.25), ``scaled_e05`` (edge share 0.05).

    OMP_NUM_THREADS=2 python benchmarks/diagnostics/representation_probe.py --eps 2 8 --runs 2 \
        --variants unit,scaled,scaled_c2,scaled_r2,scaled_c05 >> benchmarks/results/representation_probe.jsonl
    OMP_NUM_THREADS=2 python benchmarks/diagnostics/representation_probe.py --eps 2 8 --runs 2 \
        --files bladder_allgenes paul15 cite_cbmc bladder --variants scaled_half,scaled_e05,scaled_half_e05 \
        >> benchmarks/results/representation_probe.jsonl
"""

from __future__ import annotations

import argparse
import json
import sys
import warnings
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from cluster_benchmark import FILES, load, score
from cluster_lofo import scanpy_reference

from dpsc.methods import _clustering, _hvg, _kmeans, _pca

FILES["cite_cbmc"] = "cite_cbmc_top2000.h5"
VARIANTS = {
    "scaled": {},
    "centred": {"gene_scale": False},
    "scaled_c2": {"clip_c": 2.0},
    "scaled_r2": {"radius_c": 2.0},
    "scaled_c05": {"clip_c": 0.5},
    "scaled_half": {"power": 0.25},
    "scaled_e05": {"edge": 0.05},
    "scaled_half_e05": {"power": 0.25, "edge": 0.05},
    "scaled_32": {"n_comps": 32},
}


def scaled_rows(Z, centre, scale, clip):
    Y = (Z - centre) / scale
    norms = np.linalg.norm(Y, axis=1, keepdims=True)
    return Y * np.minimum(1.0, clip / np.maximum(norms, 1e-12)) / clip


def run_scaled(
    X, k, epsilon, rng, gene_scale=True, clip_c=1.0, radius_c=1.0, n_comps=16, edge=0.02, power=0.5
):
    n, n_vars = X.shape
    sig = (
        _clustering._split(epsilon, 1e-5, _clustering.KINDS, 3, "rdp")
        if epsilon
        else dict.fromkeys(_clustering.KINDS, 0.0)
    )
    # give the sum's share to nothing (prototype: the sum release is not needed)
    _clustering.EDGE_SHARE = edge
    G = _clustering.genes_for(n, sig["pca"], n_vars) if epsilon else min(n_vars, 2000)
    _clustering.EDGE_SHARE = 0.02
    spec = _hvg.gene_statistics_release(n_vars, sig["genes"])
    noisy = _hvg.gene_sums(X, True, _hvg.DEFAULT_SQUARE_CLIP)
    noisy = noisy + rng.normal(0, spec.noise_std, noisy.shape)
    means, variances, _, order = _hvg.rank_genes(noisy, spec, _hvg.DEFAULT_SQUARE_CLIP, 3.0, "second_moment")
    genes = np.sort(order[:G])
    nn = max(float(noisy[-1]), 1.0)
    var_noise = _hvg.DEFAULT_SQUARE_CLIP * spec.noise_std / nn
    v = np.maximum(variances[genes], max(2 * var_noise, 1e-6))
    centre = means[genes]
    scale = v**power if gene_scale else np.full(G, np.sqrt(v.mean()))
    clip = clip_c * np.sqrt((variances[genes].clip(0) / scale**2).sum())
    Z = _pca.unit_rows(X[:, genes], True)
    Z = Z.toarray() if hasattr(Z, "toarray") else Z
    Y = scaled_rows(Z, centre, scale, clip)
    S = Y.T @ Y
    if epsilon:
        E = rng.normal(0, sig["pca"], S.shape)
        S = S + np.triu(E) + np.triu(E, 1).T
    w, V = np.linalg.eigh(S)
    top = np.argsort(w)[::-1][:n_comps]
    V, lam = V[:, top], w[top]
    P = Y @ V
    R = radius_c * np.sqrt(max(lam.clip(0).sum(), 1e-12) / nn)
    P = _kmeans._clip_rows(P, R) / R

    def release_table(assignment):
        t = _kmeans.kmeans_table(P, assignment, 1.0, 0.3)
        if epsilon:
            t = t + rng.normal(0, sig["kmeans"] * _kmeans.table_sensitivity(1.0, 0.3), t.shape)
        return _kmeans.split_table(t, assignment.n_rows, P.shape[1], 1.0, 0.3)

    plan = dict(_clustering.KMEANS_PLAN)
    cents = _kmeans.dp_kmeans_centroids(
        release_table,
        k,
        P.shape[1],
        noise_multiplier=sig["kmeans"] or 1e-9,
        clip_norm=1.0,
        random_state=0,
        **plan,
    )
    return _kmeans._nearest(P, cents)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--data", type=Path, default=Path("../shared/data"))
    p.add_argument("--files", nargs="*", default=list(FILES))
    p.add_argument("--eps", nargs="*", type=float, default=[2.0, 8.0])
    p.add_argument("--runs", type=int, default=2)
    p.add_argument("--variants", default="unit,scaled,centred")
    args = p.parse_args()
    import dpsc

    for name in args.files:
        adata = load(args.data, name)
        truth = adata.obs["label"].to_numpy()
        k = len(np.unique(truth))
        ref = score(truth, scanpy_reference(adata, k))["ari"]
        for eps in [*args.eps, None]:
            for variant in args.variants.split(","):
                aris = []
                for r in range(1 if eps is None else args.runs):
                    rng = np.random.default_rng(100 + r)
                    with warnings.catch_warnings():
                        warnings.simplefilter("ignore")
                        if variant == "unit":
                            cells = adata.copy()
                            dpsc.tl.cluster(cells, k, epsilon=eps)
                            pred = cells.obs["dp_cluster"].to_numpy()
                        else:
                            opts = VARIANTS[variant]
                            pred = run_scaled(adata.X, k, eps, rng, **opts)
                    aris.append(score(truth, pred)["ari"])
                print(
                    json.dumps(
                        {
                            "file": name,
                            "eps": eps,
                            "variant": variant,
                            "ari": float(np.mean(aris)),
                            "ratio": float(np.mean(aris) / ref),
                            "scanpy": ref,
                        }
                    ),
                    flush=True,
                )


if __name__ == "__main__":
    main()
