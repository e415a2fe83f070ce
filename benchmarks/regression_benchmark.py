"""Robust private linear regression benchmark (Honkela et al. 2018): synthetic and GDSC.

1. Synthetic (the shape of the paper's Figs. 3–4): d = 10, ε = 2, n private samples in
   100…800, 20 repeats; Spearman on 1000 held-out samples of the same generative model.
2. GDSC subset (``../shared/data``): Monte Carlo cross-validation, 50 splits per drug, 10 public
   samples, 15 held-out test samples, the rest private; the 10 genes are the most variable among
   the public samples of the split; ε ∈ {1, 2}; Spearman per drug and the wpc-index over drugs.

Usage (from the repo root)::

    python benchmarks/regression_benchmark.py --data ../shared/data \
        --out benchmarks/results/regression.json.gz
    python benchmarks/regression_benchmark.py --report benchmarks/results/regression.json.gz
"""

from __future__ import annotations

import argparse
import gzip
import json
import sys
import time
from pathlib import Path

import numpy as np

from dpsc import datasets, linear

METHODS = {
    "robust private LR": lambda eps, s, **kw: linear.RobustPrivateLR(eps, random_state=s, noise_seed=s, **kw),
    "private LR, no projection": None,  # bounds from the data range, built below
    "output perturbation": lambda eps, s, **kw: linear.OutputPerturbationLR(
        eps, random_state=s, noise_seed=s, **kw
    ),
    "functional mechanism (diffprivlib)": lambda eps, s, **kw: linear.FunctionalMechanismLR(
        eps, random_state=s, **kw
    ),
    "non-private Bayesian LR": lambda eps, s, **kw: linear.BayesianLR(**kw),
    "non-private lasso": lambda eps, s, **kw: linear.LassoLR(random_state=s, **kw),
}


def _make(name: str, eps: float, seed: int, y_priv_std: np.ndarray, **kw):
    if name == "private LR, no projection":
        # B_x = 1 cannot clip a unit-norm sample; B_y = the largest |y| of the private samples,
        # read from the data (not private: the paper's unprojected variant, optimistic).
        bound_y = float(np.abs(y_priv_std).max())
        return linear.RobustPrivateLR(eps, bounds=(1.0, bound_y), random_state=seed, noise_seed=seed, **kw)
    return METHODS[name](eps, seed, **kw)


def synthetic(n_values, repeats, d=10, eps=2.0, n_test=1000):
    rows = []
    for n in n_values:
        for rep in range(repeats):
            rng = np.random.default_rng(10_000 + 97 * n + rep)
            X, y = linear.synthetic_auxiliary(n + n_test, d, rng)
            Xtr, ytr, Xte, yte = X[:n], y[:n], X[n:], y[n:]
            for name in METHODS:
                t0 = time.perf_counter()
                model = _make(name, eps, rep, ytr, y_center=0.0, y_scale=1.0).fit(Xtr, ytr)
                rows.append(
                    {
                        "part": "synthetic",
                        "n": n,
                        "repeat": rep,
                        "method": name,
                        "epsilon": eps,
                        "spearman": linear.spearman(yte, model.predict(Xte)),
                        "seconds": time.perf_counter() - t0,
                    }
                )
        print(f"synthetic n={n} done", file=sys.stderr, flush=True)
    return rows


def gdsc(data: Path, eps_values, n_splits, n_public=10, n_test=15, n_genes=10):
    adata = datasets.read_gdsc(
        data / "gdsc_subset_rnaseq_fpkm.csv", data / "gdsc_subset_gdsc2_drug_response.csv"
    )
    X_all = np.asarray(adata.X)
    rows = []
    for drug in adata.obs.columns:
        y_all = adata.obs[drug].to_numpy(dtype=float)
        idx = np.flatnonzero(np.isfinite(y_all))
        for split in range(n_splits):
            rng = np.random.default_rng(split)
            perm = rng.permutation(idx)
            pub, test, priv = perm[:n_public], perm[n_public : n_public + n_test], perm[n_public + n_test :]
            genes = np.argsort(-X_all[pub].var(0), kind="stable")[:n_genes]  # public samples only
            X = X_all[:, genes]
            y_std_priv = (y_all[priv] - y_all[pub].mean()) / y_all[pub].std()
            for eps in eps_values:
                for name in METHODS:
                    if name.startswith("non-private") and eps != eps_values[0]:
                        continue
                    model = _make(name, eps, split, y_std_priv).fit(X[priv], y_all[priv], X[pub], y_all[pub])
                    pred = model.predict(X[test])
                    rows.append(
                        {
                            "part": "gdsc",
                            "drug": drug,
                            "split": split,
                            "method": name,
                            "epsilon": None if name.startswith("non-private") else eps,
                            "n_private": int(priv.size),
                            "spearman": linear.spearman(y_all[test], pred),
                            "pc": linear.probabilistic_c_index(y_all[test], pred),
                            "null_pc_sd": linear.null_pc_sd(
                                y_all[test], n_permutations=100, random_state=split
                            ),
                        }
                    )
        print(f"gdsc {drug} done", file=sys.stderr, flush=True)
    return rows


def report(path: Path) -> str:
    import pandas as pd

    payload = json.loads(gzip.decompress(path.read_bytes()) if path.suffix == ".gz" else path.read_text())
    df = pd.DataFrame(payload["rows"])
    n_const = int(df.spearman.isna().sum())
    # A constant prediction (e.g. the lasso shrinking every coefficient to 0) has no rank
    # correlation; it carries no information, so it counts as 0 rather than being dropped.
    df["spearman"] = df.spearman.fillna(0.0)
    out = ["# Robust private linear regression benchmark", "", f"Command: `{payload['command']}`", ""]
    out += [
        f"Wall time: {payload['seconds']:.0f} s on {payload['machine']}{payload.get('wall_note', '')}.",
        "",
    ]
    out += [
        "Noise: `noise_seed` = the repeat's seed (repeatable, a benchmark, not a release); each "
        "release of a fit draws from its own stream of that seed.",
        "",
    ]
    out += [f"{n_const} fits gave constant predictions; their Spearman counts as 0.", ""]
    syn = df[df.part == "synthetic"]
    if len(syn):
        out += ["## Synthetic data (d = 10, ε = 2): Spearman on held-out samples, mean ± sd over repeats", ""]
        table = syn.groupby(["method", "n"]).spearman.agg(["mean", "std"]).reset_index()
        ns = sorted(int(n) for n in syn.n.dropna().unique())
        out.append("| method | " + " | ".join(f"n={n}" for n in ns) + " |")
        out.append("|---" * (len(ns) + 1) + "|")
        for method in METHODS:
            cells = []
            for n in ns:
                r = table[(table.method == method) & (table.n == n)]
                cells.append(f"{r['mean'].iloc[0]:.3f} ± {r['std'].iloc[0]:.3f}" if len(r) else "")
            out.append(f"| {method} | " + " | ".join(cells) + " |")
        out.append("")
    g = df[df.part == "gdsc"]
    if len(g):
        out += ["## GDSC subset (Monte Carlo CV, 10 genes chosen on the public samples)", ""]
        g = g.assign(config=g.method + g.epsilon.map(lambda e: "" if pd.isna(e) else f", ε={e:g}"))
        per_split = []
        for (config, _split), grp in g.groupby(["config", "split"]):
            pc = dict(zip(grp.drug, grp.pc, strict=True))
            sd = dict(zip(grp.drug, grp.null_pc_sd, strict=True))
            per_split.append({"config": config, "wpc": linear.wpc_index(pc, sd)})
        wpc = pd.DataFrame(per_split).groupby("config").wpc.agg(["mean", "std"])
        sp = g.groupby("config").spearman.agg(["mean", "std"])
        drugs = sorted(g.drug.unique())
        out.append("Mean over splits and drugs (sd over splits for wpc, over split×drug for Spearman):")
        out.append("")
        out.append("| method | Spearman | wpc-index |")
        out.append("|---|---|---|")
        for config in sp.index:
            out.append(
                f"| {config} | {sp.loc[config, 'mean']:.3f} ± {sp.loc[config, 'std']:.3f} | "
                f"{wpc.loc[config, 'mean']:.3f} ± {wpc.loc[config, 'std']:.3f} |"
            )
        out += ["", "Spearman per drug (mean over splits):", ""]
        per_drug = g.groupby(["config", "drug"]).spearman.mean().unstack()
        out.append("| method | " + " | ".join(drugs) + " |")
        out.append("|---" * (len(drugs) + 1) + "|")
        for config in per_drug.index:
            out.append(f"| {config} | " + " | ".join(f"{per_drug.loc[config, d]:.2f}" for d in drugs) + " |")
        out.append("")
    return "\n".join(out)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--data", type=Path, default=Path("../shared/data"))
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/regression.json.gz"))
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--splits", type=int, default=50)
    parser.add_argument("--n-values", type=int, nargs="+", default=[100, 200, 300, 400, 500, 600, 700, 800])
    parser.add_argument("--parts", nargs="+", default=["synthetic", "gdsc"])
    parser.add_argument("--report", type=Path)
    args = parser.parse_args()
    if args.report:
        print(report(args.report))
        return
    t0 = time.perf_counter()
    rows = []
    if "synthetic" in args.parts:
        rows += synthetic(args.n_values, args.repeats)
    if "gdsc" in args.parts:
        rows += gdsc(args.data, [1.0, 2.0], args.splits)
    import platform

    payload = {
        "command": "python " + " ".join(sys.argv),
        "seconds": time.perf_counter() - t0,
        "machine": f"{platform.machine()}, {__import__('os').cpu_count()} cores",
        "rows": rows,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    text = json.dumps(payload)
    if args.out.suffix == ".gz":
        args.out.write_bytes(gzip.compress(text.encode()))
    else:
        args.out.write_text(text)


if __name__ == "__main__":
    main()
