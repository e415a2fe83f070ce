"""In-process replica of the FedSC Flower loop, for diagnosing collapse (no Flower, one thread).

Same partition, networks, local training, divergence-aware EMA and example-weighted averaging as
``dpsc.tl.fit_federated`` (``dpsc.federated``), so seed 1 on PBMC reproduces the Flower run
(ARI 0.131, loss 0.00072). Prints one JSON line at rounds 0 (untrained), 1, 2, 5, every 10 and
the last: mean client loss, EMA weights μ, k-means ARI of the global embedding and its effective
rank (exp of the entropy of the normalised singular values; label-free).

Usage (from the repo root; the numbers in ``results/federated.md``)::

    python benchmarks/diagnostics/fedsc_collapse_replica.py --seed 1 --variant base --rounds 50
    python benchmarks/diagnostics/fedsc_collapse_replica.py --seed 1 --variant layernorm --rounds 40
    python benchmarks/diagnostics/fedsc_collapse_replica.py --seed 1 --variant tau996 --rounds 30
    python benchmarks/diagnostics/fedsc_collapse_replica.py --seed 1 --variant zscore --rounds 50
    python benchmarks/diagnostics/fedsc_collapse_replica.py --seed 1 --variant batchnorm --rounds 50
    python benchmarks/diagnostics/fedsc_collapse_replica.py --seed 1 --variant zscore --rounds 250 \
        --local-epochs 1

``--local-epochs`` (default 5) sets the local epochs per round.
"""

from __future__ import annotations

import argparse
import copy
import itertools
import json
from pathlib import Path

VARIANTS = ("base", "layernorm", "tau996", "zscore", "batchnorm")


def main() -> None:
    formatter = argparse.RawDescriptionHelpFormatter
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=formatter)
    parser.add_argument("--data", default="../shared/data")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--variant", choices=VARIANTS, default="base")
    parser.add_argument("--rounds", type=int, default=50)
    parser.add_argument("--local-epochs", type=int, default=5)
    args = parser.parse_args()

    import numpy as np
    import scanpy as sc
    import torch
    from sklearn.cluster import KMeans
    from sklearn.metrics import adjusted_rand_score
    from torch import nn

    import dpsc
    from dpsc.federated import (
        SSLConfig,
        SSLNet,
        _ssl,
        apply_scaling,
        calibrate_lambda,
        divergence,
        divergence_aware_update,
        ema_weight,
        embed,
        local_train,
        pooled_scaling,
        site_sums,
    )
    from dpsc.tl._federated import represent

    torch.set_num_threads(1)
    norms = {"layernorm": nn.LayerNorm, "batchnorm": nn.BatchNorm1d}
    if args.variant in norms:  # a norm after every hidden layer (LayerNorm: per cell; BatchNorm: not)
        norm = norms[args.variant]

        def mlp(n_in: int, hidden: tuple[int, ...], n_out: int) -> nn.Sequential:
            layers: list[nn.Module] = []
            for a, b in itertools.pairwise([n_in, *hidden]):
                layers += [nn.Linear(a, b), norm(b), nn.ReLU()]
            return nn.Sequential(*layers, nn.Linear(([n_in, *hidden])[-1], n_out))

        _ssl._mlp = mlp
    cfg = SSLConfig(method="fedsc", **({"tau": 0.996} if args.variant == "tau996" else {}))
    adata = dpsc.datasets.read_h5(Path(args.data) / "pbmc_10x_4k_top2000.h5")
    sc.pp.filter_genes(adata, min_counts=1)
    truth = adata.obs["label"].astype(str).to_numpy()
    k = len(set(truth))
    dpsc.pp.partition(adata, 4, label_key="label", types_per_site=2, random_state=args.seed)
    sites = adata.obs["site"].astype(str)
    X = represent(adata.X, "zinb")
    parts = [X[(sites == s).to_numpy()] for s in sorted(sites.unique())]
    if args.variant == "zscore":  # what fit_federated(scale_genes=True) does
        scaling = pooled_scaling([site_sums(p) for p in parts])
        X, parts = apply_scaling(X, *scaling), [apply_scaling(p, *scaling) for p in parts]

    def report(r: int, state: dict, losses: list[float], mus: list[float]) -> None:
        net = SSLNet(X.shape[1], cfg)
        net.load_shared(state)
        Z = embed(net, X)
        s = np.linalg.svd(Z - Z.mean(0), compute_uv=False)
        p = s / s.sum()
        labels = KMeans(k, n_init=10, random_state=args.seed).fit_predict(Z)
        row = {
            "seed": args.seed, "variant": args.variant, "local_epochs": args.local_epochs, "round": r,
            "loss": round(float(np.mean(losses)), 5) if losses else None,
            "mu": [round(m, 2) for m in mus],
            "ari": round(adjusted_rand_score(truth, labels), 3),
            "effective_rank": round(float(np.exp(-(p * np.log(p + 1e-12)).sum())), 2),
        }  # fmt: skip
        print(json.dumps(row), flush=True)

    torch.manual_seed(args.seed)
    global_state = SSLNet(X.shape[1], cfg).shared_state()
    report(0, global_state, [], [])
    local: list[dict | None] = [None] * len(parts)
    lam: list[float | None] = [None] * len(parts)
    for r in range(1, args.rounds + 1):
        states, sizes, losses, mus = [], [], [], []
        for pid, Xc in enumerate(parts):
            net, mu = SSLNet(X.shape[1], cfg), 0.0
            if local[pid] is None:
                net.load_shared(global_state)
                net.target.load_state_dict(net.online.state_dict())
            else:
                net.load_state_dict(local[pid])
                own = net.shared_state()
                div = divergence(global_state, own)
                lam[pid] = calibrate_lambda(0.7, div) if lam[pid] is None else lam[pid]
                mu = ema_weight(lam[pid], div)
                net.load_shared(divergence_aware_update(own, global_state, mu))
            losses.append(local_train(net, Xc, args.local_epochs, seed=args.seed * 100_003 + 1009 * pid + r))
            local[pid] = copy.deepcopy(net.state_dict())
            states.append(net.shared_state())
            sizes.append(len(Xc))
            mus.append(mu)
        w = np.asarray(sizes) / sum(sizes)
        global_state = {key: sum(wi * s[key] for wi, s in zip(w, states, strict=True)) for key in states[0]}
        if r in (1, 2, 5) or r % 10 == 0 or r == args.rounds:
            report(r, global_state, losses, mus)


if __name__ == "__main__":
    main()
