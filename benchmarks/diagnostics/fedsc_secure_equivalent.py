r"""What private FedSC can reach under secure aggregation, measured by its one-process equivalent.

The design the private-FedSC issue asks for is DP-FedSGD over SecAgg+ with distributed noise: in
round t every site s draws a Poisson sample of its own cells (rate q, its secret stream), sums
their clipped per-cell gradients (norm ≤ C) and adds its discrete Gaussian share
:math:`\mathcal{N}(0, \sigma^2 C^2 / m)`; SecAgg+ reveals only the total over the m sites, and
the server takes one optimiser step with it. A Poisson sample of every site at rate q is a
Poisson sample of the pooled cells at rate q, and the m shares sum to :math:`\mathcal{N}(0,
\sigma^2 C^2)`, so the released sequence of updates has the distribution of central DP-SGD on the
pooled cells at (σ, q, T) (up to the lattice rounding and discrete-vs-continuous Gaussian); the
split into sites, IID or not, does not enter, and with one local step per round the local and
global models coincide, so FedSC's divergence-aware EMA has nothing to act on (FedSC is BYOL).
The accuracy of that design is therefore the accuracy of this script, which runs the pooled
equivalent in one process with the package's own pieces:

1. ``dpsc.pp.pca`` (Analyze Gauss, the release the federated pipeline makes exactly over sites);
2. DP-SGD of FedSC's network (``dpsc.federated._ssl.local_train_private``: per-cell BYOL losses,
   ghost clipping, Poisson sampling, secret noise) on the PCs, Adam at the package's federated
   learning rate, expected batch ``--batch`` cells, ``--epochs`` passes;
3. ``dpsc.tl.kmeans`` (the pipeline's DP k-means) on the learnt embedding.

The ``-genes`` variants feed the network each cell's unit-norm log1p(CP10k) genes instead (a
function of the cell alone, no gene scaling) and cluster the embedding's own DP principal
components (one Gaussian release of the embedding's unit-row second moment, the mean-like first
component dropped, as ``dpsc.pp.pca`` does for genes), since the DP k-means cannot split the raw
embedding (see the results).

The ``-scaled`` variants z-score those genes first with privately released gene statistics
(:func:`scaled_genes`: the gene-statistics release of ``dpsc.pp.highly_variable_genes``, one more
Gaussian part; the genes whose noisy mean stands 3 noise sds above 0 are kept), as a scanpy user
scales genes before a network reads them, and cluster the embedding's DP principal components as
the ``-genes`` variants do; their four parts share (ε, δ) as gene statistics 0.1, PCA 0.2, DP-SGD
0.5, k-means 0.2.

The three Gaussian parts share one (ε, δ) by ``dpsc.privacy.split_budget`` (RDP composition)
in shares fixed before any run (PCA 0.3, DP-SGD 0.5, k-means 0.2). Every setting here is fixed in
advance (no label was read to choose it); labels only score. Beside it, on the same cells: the
private pipeline alone (PCA 0.6, k-means 0.4: DP-SGD removed), and the same network without
noise (its PCA and k-means at ε = 10⁶, noise negligible). ``ari_exact_kmeans`` scores exact
k-means (scikit-learn, unit rows) on the representation that the DP k-means read: a diagnostic of
the representation alone, not a release. One JSON line per fit to ``--out``.

Usage (from the repo root)::

    python benchmarks/diagnostics/fedsc_secure_equivalent.py --data ../shared/data \
        --datasets pbmc bladder --epsilons 8 4 1 --seeds 0 1 2 \
        --out benchmarks/results/fedsc_secure_equivalent.jsonl
    python benchmarks/diagnostics/fedsc_secure_equivalent.py --data ../shared/data \
        --datasets pbmc bladder --epsilons 8 4 1 --seeds 0 1 2 --latent 16 \
        --variants fedsc-secure fedsc-nonprivate --out benchmarks/results/fedsc_secure_equivalent.jsonl
    python benchmarks/diagnostics/fedsc_secure_equivalent.py --data ../shared/data \
        --datasets pbmc bladder --epsilons 8 4 1 --seeds 0 1 2 \
        --variants fedsc-secure-genes fedsc-nonprivate-genes \
        --out benchmarks/results/fedsc_secure_equivalent.jsonl
    python benchmarks/diagnostics/fedsc_secure_equivalent.py --data ../shared/data \
        --datasets pbmc bladder --epsilons 8 4 1 --seeds 0 1 2 \
        --variants fedsc-secure-scaled fedsc-nonprivate-scaled \
        --out benchmarks/results/fedsc_secure_equivalent.jsonl
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

FILES = {"pbmc": "pbmc_10x_4k_top2000.h5", "bladder": "mouse_bladder_top2000.h5"}
SHARES = {"pca": 0.3, "sgd": 0.5, "kmeans": 0.2}
PIPELINE_SHARES = {"pca": 0.6, "kmeans": 0.4}
SCALED_SHARES = {"genes": 0.1, "pca": 0.2, "sgd": 0.5, "kmeans": 0.2}
DELTA = 1e-5
VARIANTS = (
    "fedsc-secure",
    "pipeline",
    "fedsc-nonprivate",
    "fedsc-secure-genes",
    "fedsc-nonprivate-genes",
    "fedsc-secure-scaled",
    "fedsc-nonprivate-scaled",
)
MAX_Z = 10.0  # scanpy's usual sc.pp.scale(max_value=10)
# a gene enters the input when its noisy mean is 3 noise sds above 0 (pp.highly_variable_genes' rule)
MIN_MEAN_SD = 3.0
NO_NOISE = 1e6  # the ε of the non-private reference's PCA and k-means: noise negligible


def load(name: str, data_dir: Path):
    """Counts and labels of one benchmark file (the DP-DCAN benchmark's loader)."""
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from dpdcan_benchmark import load as load_benchmark

    return load_benchmark(name, data_dir)


def rates(q: float, steps: int) -> dict[str, tuple[float, int]]:
    """``name -> (sample rate, steps)`` of each Gaussian part (k-means: ``dpsc.tl.kmeans``'s plan)."""
    from dpsc.methods._kmeans import kmeans_release_steps
    from dpsc.tl._kmeans import KMEANS_DEFAULTS as K

    kmeans = kmeans_release_steps(K["n_sketch_steps"], K["n_lloyd_rounds"], K["steps_per_round"])
    return {"genes": (1.0, 1), "pca": (1.0, 1), "sgd": (q, steps), "kmeans": (1.0, kmeans)}


def budget(epsilon: float, shares: dict[str, float], q: float, steps: int) -> dict[str, tuple[float, float]]:
    """``name -> (ε_k, σ_k)`` of the parts, composed to (ε, DELTA) by RDP."""
    from dpsc.privacy import split_budget

    of = rates(q, steps)
    parts = {name: (share, *of[name]) for name, share in shares.items()}  # (share, q, steps)
    return split_budget(epsilon, DELTA, parts, tolerance=1e-4)


def embedding_pcs(embedding, sigma: float, n_comps: int = 16):
    r"""Projections of the unit-norm embedding rows on its top DP principal components (mean dropped).

    One Gaussian release of :math:`\sum_i u_i u_i^\top` over the unit rows :math:`u_i` of the
    embedding (sensitivity 1, σ = ``sigma``; 0: exact up to the lattice), the release
    ``dpsc.pp.pca`` makes (``dpsc.methods._pca.released_loadings``), then its post-processing
    (eigenvectors, the first, mean-like one dropped).
    """
    from dpsc.methods import _pca
    from dpsc.privacy import NoiseSource

    stream = NoiseSource().stream("embedding-pca")
    V, _, _ = _pca.released_loadings(embedding, sigma, stream, n_comps, None, True, log_normalize=False)
    return _pca.project(embedding, V, log_normalize=False)


def scaled_genes(matrix, sigma: float):
    r"""Each cell's unit-norm log1p(CP10k) genes z-scored with privately released gene statistics.

    One Gaussian release of the gene statistics of ``dpsc.pp.highly_variable_genes``
    (:math:`\sum_i (z_i, w_i/c, 1)`, sensitivity √3, σ = ``sigma``; 0: exact), post-processed
    into each gene's mean :math:`\hat\mu_g` and variance :math:`\hat v_g`; the genes whose noisy
    mean is ``MIN_MEAN_SD`` noise sds above 0 are kept, and each cell's row becomes
    :math:`\mathrm{clip}((z_{ig} - \hat\mu_g)/\hat s_g, \pm 10)`, with :math:`\hat s_g^2` the
    variance floored at ``MIN_MEAN_SD`` sds of its own noise. A map of each cell and released values
    only, so the DP-SGD that reads it keeps its own guarantee (its per-cell gradients are clipped).
    """
    import numpy as np

    from dpsc.methods import _hvg
    from dpsc.methods._pca import unit_rows
    from dpsc.privacy import NoiseSource

    clip = _hvg.DEFAULT_SQUARE_CLIP
    spec = _hvg.gene_statistics_release(matrix.shape[1], sigma)
    released = spec.release(_hvg.gene_sums(matrix, True, clip), NoiseSource().stream("gene-scaling"))
    means, variances, eligible, _ = _hvg.rank_genes(released, spec, clip, MIN_MEAN_SD, "variance")
    n = max(float(released[-1]), 1.0)
    floor = max(MIN_MEAN_SD * clip * spec.noise_std / n, 1e-12)
    std = np.sqrt(np.maximum(variances[eligible], floor))
    Z = unit_rows(matrix, True)
    Z = np.asarray(Z[:, eligible].toarray() if hasattr(Z, "toarray") else Z[:, eligible])
    return np.clip((Z - means[eligible]) / std, -MAX_Z, MAX_Z).astype(np.float32)


def composed(parts: dict[str, tuple[float, float]], q: float, steps: int) -> float:
    """ε at DELTA of all parts in one RDP accountant (what the split promises)."""
    from dpsc.privacy import history_epsilon

    of = rates(q, steps)
    return history_epsilon([(sigma, *of[name]) for name, (_, sigma) in parts.items()], DELTA)


def run_one(adata, epsilon: float | None, seed: int, variant: str, args) -> dict:
    """One fit of ``variant`` (one of :data:`VARIANTS`); returns its row."""
    import numpy as np
    import torch
    from sklearn.cluster import KMeans
    from sklearn.metrics import adjusted_rand_score, normalized_mutual_info_score

    import dpsc
    from dpsc.federated._ssl import (
        ClientDP,
        SSLConfig,
        SSLNet,
        dp_schedule,
        embed,
        local_train,
        local_train_private,
    )
    from dpsc.methods._pca import unit_rows
    from dpsc.optim._factory import DEFAULT_PRIVATE_LRS

    cells = adata.copy()
    k = cells.obs["label"].nunique()
    q, steps_per_epoch = dp_schedule(cells.n_obs, args.batch)
    steps = args.epochs * steps_per_epoch
    private = epsilon is not None
    scaled = variant.endswith("-scaled")
    shares = PIPELINE_SHARES if variant == "pipeline" else SCALED_SHARES if scaled else SHARES
    parts = budget(epsilon, shares, q, steps) if private else None
    delta = DELTA / len(shares)
    on_genes = variant.endswith(("-genes", "-scaled"))
    start = time.perf_counter()
    if not on_genes:
        dpsc.pp.pca(cells, epsilon=parts["pca"][0] if private else NO_NOISE, delta=delta)
    rep = "X_pca"
    if variant != "pipeline":
        torch.manual_seed(seed)
        config = SSLConfig(batch_size=args.batch, n_latent=args.latent)
        if scaled:
            inputs = scaled_genes(cells.X, parts["genes"][1] if private else 0.0)
        else:
            inputs = unit_rows(cells.X, True) if on_genes else cells.obsm["X_pca"]
            inputs = np.asarray(inputs.toarray() if hasattr(inputs, "toarray") else inputs, dtype=np.float32)
        net = SSLNet(inputs.shape[1], config)
        if private:
            lr = DEFAULT_PRIVATE_LRS["adam"]["federated"]
            dp = ClientDP(noise_multiplier=parts["sgd"][1], optimizer="adam", lr=lr)
            local_train_private(net, inputs, args.epochs, seed, dp)
        else:
            local_train(net, inputs, args.epochs, seed)
        cells.obsm["X_fedsc"] = embed(net, inputs)
        rep = "X_fedsc"
        if on_genes:  # the embedding's own DP principal components, mean direction dropped
            sigma = parts["pca"][1] if private else 0.0
            cells.obsm["X_fedsc_pca"] = embedding_pcs(cells.obsm["X_fedsc"], sigma)
            rep = "X_fedsc_pca"
    eps_kmeans = parts["kmeans"][0] if private else NO_NOISE
    dpsc.tl.kmeans(cells, k, epsilon=eps_kmeans, delta=delta, use_rep=rep, random_state=seed)
    wall = time.perf_counter() - start
    truth, pred = cells.obs["label"].astype(str), cells.obs["dp_cluster"].astype(str)
    # diagnostic of the representation alone (not a release): exact k-means on its unit rows
    unit = np.asarray(cells.obsm[rep], dtype=np.float64)
    unit /= np.maximum(np.linalg.norm(unit, axis=1, keepdims=True), 1e-12)
    exact = KMeans(k, n_init=5, random_state=seed).fit_predict(unit)
    return {
        "variant": variant,
        "epsilon": epsilon,
        "seed": seed,
        "n_obs": int(cells.n_obs),
        "k": int(k),
        "batch": args.batch,
        "epochs": args.epochs,
        "sample_rate": q,
        "sgd_steps": steps if variant != "pipeline" else 0,
        "parts": {name: {"epsilon": e, "sigma": s} for name, (e, s) in (parts or {}).items()},
        "epsilon_composed": composed(parts, q, steps) if private else None,
        "ari": adjusted_rand_score(truth, pred),
        "nmi": normalized_mutual_info_score(truth, pred),
        "clusters_used": int(pred.nunique()),
        "ari_exact_kmeans": adjusted_rand_score(truth, exact),
        "latent": args.latent if variant != "pipeline" else None,
        "input_genes": int(inputs.shape[1]) if variant != "pipeline" else None,
        "wall_s": wall,
        "threads": int(os.environ.get("OMP_NUM_THREADS", "0") or 0),
        "noise": "secret",
    }


def report(path: Path) -> str:
    """Markdown table of ``path``: mean ± std over seeds per data set, variant, width and ε."""
    import pandas as pd

    rows = pd.read_json(path, lines=True)
    rows["epsilon"] = rows["epsilon"].fillna(float("inf"))
    rows["latent"] = rows["latent"].fillna(-1).astype(int)
    keys = ["dataset", "variant", "latent", "epsilon"]
    lines = [
        "| data | variant | embedding width | ε | ARI (DP k-means) "
        "| ARI (exact k-means on the representation) | clusters used | runs | wall s |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for (name, variant, latent, eps), group in rows.groupby(keys, sort=True):
        ari, exact = (
            f"{group[c].mean():.3f} ± {group[c].std(ddof=0):.3f}" for c in ("ari", "ari_exact_kmeans")
        )
        lines.append(
            f"| {name} | {variant} | {'—' if latent < 0 else latent} | "
            f"{'no noise' if eps == float('inf') else f'{eps:g}'} | {ari} | {exact} | "
            f"{group['clusters_used'].mean():.1f} | {len(group)} | {group['wall_s'].mean():.1f} |"
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--data", default="../shared/data")
    parser.add_argument("--datasets", nargs="+", default=list(FILES), choices=list(FILES))
    parser.add_argument("--epsilons", nargs="+", type=float, default=[8.0, 4.0, 1.0])
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument("--batch", type=int, default=512, help="expected cells per DP-SGD step")
    parser.add_argument("--epochs", type=int, default=30)
    parser.add_argument("--latent", type=int, default=60, help="embedding width (FedSC's is 60)")
    parser.add_argument(
        "--variants", nargs="+", default=["fedsc-secure", "pipeline", "fedsc-nonprivate"], choices=VARIANTS
    )
    parser.add_argument("--out", type=Path)
    parser.add_argument("--report", type=Path, help="print the markdown table of this JSON lines file")
    args = parser.parse_args()
    if args.report:
        print(report(args.report), end="")
        return
    if args.out is None:
        parser.error("--out is required to run fits")
    import torch

    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "2")))
    for name in args.datasets:
        adata = load(name, Path(args.data))
        for variant in args.variants:
            epsilons = [None] if variant.startswith("fedsc-nonprivate") else args.epsilons
            for epsilon in epsilons:
                for seed in args.seeds:
                    row = {"dataset": name, **run_one(adata, epsilon, seed, variant, args)}
                    with args.out.open("a") as out:
                        out.write(json.dumps(row) + "\n")
                    print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
