"""One-run black-box audit of whole DP-DCAN fits with input canaries, both scopes.

``dpsc.tl.audit(method="one_run", canaries="input")`` on a random subsample of the embedded
PBMC 4k (``--cells``, genes without counts in it removed): m inserted canary cells (real cells
with their counts permuted across genes), each added with probability ½, one default fit
(50 + 40 epochs) per run, 10 % guessed on each side, 95 % confidence for the two scores
together. The noise is secret (no noise_seed): an audit must face the noise a user gets.

    python benchmarks/input_canary_audit.py --out benchmarks/results/input_canary_audit.jsonl
    python benchmarks/input_canary_audit.py --report benchmarks/results/input_canary_audit.jsonl
"""

from __future__ import annotations

import argparse
import json
import platform
import time
import warnings

import numpy as np
import pandas as pd
import torch

warnings.filterwarnings("ignore")


def cells(n: int, seed: int = 0):
    import scanpy as sc

    import dpsc

    adata = dpsc.datasets.pbmc4k()
    keep = np.sort(np.random.default_rng(seed).choice(adata.n_obs, size=min(n, adata.n_obs), replace=False))
    adata = adata[keep].copy()
    sc.pp.filter_genes(adata, min_counts=1)
    return adata


def _finite(value):
    return None if isinstance(value, float) and not np.isfinite(value) else value


def run(args) -> None:
    import dpsc

    torch.set_num_threads(args.threads)
    adata = cells(args.cells)
    for eps in args.epsilons:
        for scope in args.scopes if eps else ["encoder"]:  # without DP the scope changes nothing
            for seed in args.seeds:
                start = time.perf_counter()
                table = dpsc.tl.audit(
                    adata.copy(),
                    epsilon=None if eps == 0 else eps,
                    method="one_run",
                    canaries="input",
                    n_canaries=args.canaries,
                    random_state=seed,
                    scope=scope,
                )
                wall = time.perf_counter() - start
                with open(args.out, "a") as fh:
                    for _, row in table.iterrows():
                        out = {k: _finite(v) for k, v in row.items()}
                        out.update(seed=seed, wall_s=wall, cells=adata.n_obs, cpu=platform.machine())
                        fh.write(json.dumps(out, default=float) + "\n")
                print(eps, scope, seed, table[["score", "epsilon_lower"]].values.tolist(), flush=True)


def report(path: str) -> str:
    df = pd.read_json(path, lines=True)
    df["claim"] = df["epsilon_claimed"].round(1).fillna(np.inf)  # the spent ε of each run, to 0.1
    lines = [
        "# One-run black-box audit of DP-DCAN fits (input canaries)",
        "",
        f"Command: `python benchmarks/input_canary_audit.py --out {path}`, then `--report {path}`. "
        f"PBMC 4k subsample of {int(df['cells'].iloc[0])} cells, {int(df['n_canaries'].iloc[0])} canary "
        f"cells, {int(df['n_guesses'].iloc[0])} guesses per score, default fit (50 + 40 epochs), secret "
        "noise, 95 % confidence for the two scores together. 'view agreement' uses only the shared "
        "encoder; 'reconstruction' uses the decoder (covered by ε under scope='full', never shared "
        "under scope='encoder'). A bound above the claim would prove a leak; the ceiling is the most "
        "these canaries can show.",
        "",
        "| claimed ε | scope (guarantee) | score | ε lower bound (per run) | correct / guesses | ceiling |",
        "|---|---|---|---|---|---|",
    ]
    for (claim, scope, score), g in df.groupby(["claim", "scope", "score"], sort=True):
        lows = ", ".join(f"{v:.2f}" for v in g["epsilon_lower"])
        correct = ", ".join(f"{int(c)}/{int(r)}" for c, r in zip(g["n_correct"], g["n_guesses"], strict=True))
        label = "none (non-private)" if np.isinf(claim) else f"{claim:.3g}"
        scope_label = "–" if np.isinf(claim) else f"{scope} ({g['guarantee'].iloc[0]})"
        ceiling = g["ceiling"].iloc[0]
        lines.append(f"| {label} | {scope_label} | {score} | {lows} | {correct} | {ceiling:.2f} |")
    return "\n".join(lines) + f"\n\nRan on: {', '.join(sorted(df['cpu'].astype(str).unique()))}.\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epsilons", nargs="+", type=float, default=[8, 2, 0], help="0 = non-private")
    parser.add_argument("--scopes", nargs="+", default=["encoder", "full"], choices=["encoder", "full"])
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1])
    parser.add_argument("--cells", type=int, default=1000)
    parser.add_argument("--canaries", type=int, default=1000)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", default="benchmarks/results/input_canary_audit.jsonl")
    parser.add_argument("--report")
    args = parser.parse_args()
    if args.report:
        print(report(args.report), end="")
        return
    run(args)


if __name__ == "__main__":
    main()
