r"""Would gene z-scoring of the encoder's input help DP-DCAN? An oracle with exact statistics.

The DP-DCAN reference scripts z-score every gene of the log-normalised input with the mean and
standard deviation over all cells (scDCC's ``normalize(..., normalize_input=True)``), a
statistic of the private data set that they do not account for. dpsc's encoder sees
:math:`r_{ig} = \log(1 + 10^4 x_{ig} / \sum_{g'} x_{ig'})`, computed from each cell alone
(:func:`dpsc.module.input_representation`). Before building a private release of the gene
statistics (which would cost part of ε and add noise to them), this diagnostic asks whether the
*exact* statistics would help at all: the encoder sees

.. math:: \tilde r_{ig} = (r_{ig} - \bar r_g) / s_g, \qquad
   \bar r_g = \tfrac1n \textstyle\sum_i r_{ig}, \quad s_g = \max(\mathrm{sd}_i(r_{ig}), 10^{-3}),

and everything else is a default DP-DCAN fit (``dpsc.tl.fit``). The statistics are not private,
so these fits are **not** (ε, δ)-DP: they are an upper bound on what a private release of the
same statistics could give. Labels are used for scoring only. ``--scaling none`` runs the
default fit for a comparison on the same machine.

Usage (from the repo root; one thread per fit)::

    python benchmarks/diagnostics/gene_scaling_oracle.py --data ../shared/data --scaling none exact \
        --epsilon 8 4 --seeds 0 1 2 --out benchmarks/results/gene_scaling_oracle.jsonl
    python benchmarks/diagnostics/gene_scaling_oracle.py --report benchmarks/results/gene_scaling_oracle.jsonl
"""

from __future__ import annotations

import argparse
import json
import sys
from contextlib import contextmanager, nullcontext
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parents[1]))  # benchmarks/
sys.path.insert(0, str(Path(__file__).parent))  # diagnostics/
from dpdcan_benchmark import ALL_CONFIGS, load, run_one
from instance_latent import common_arguments, emit, summarize

SCALINGS = ("none", "exact")
COVERS = {  # what the row's epsilon is a claim about
    "none": "the default scope='encoder' fit's (epsilon, delta) guarantee and caveat "
    "(its privacy statement in adata.uns['dpsc']['privacy'])",
    "exact": "nothing: not differentially private, the input is z-scored with exact statistics of "
    "all cells; epsilon is the Opacus accounting of the fit's DP-SGD and release steps only",
}


@contextmanager
def exact_gene_scaling(counts: np.ndarray):
    """Within the block the encoder's input is z-scored with the exact gene statistics of ``counts``."""
    import torch

    from dpsc.module import _dcan

    rep = np.log1p(counts / counts.sum(1, keepdims=True) * _dcan.TARGET_SUM)
    mean = torch.as_tensor(rep.mean(0), dtype=torch.float32)
    scale = torch.as_tensor(np.maximum(rep.std(0), 1e-3), dtype=torch.float32)
    original = _dcan.input_representation

    def scaled(x, likelihood):
        r = original(x, likelihood)
        return (r - mean.to(r.device)) / scale.to(r.device)

    _dcan.input_representation = scaled
    try:
        yield
    finally:
        _dcan.input_representation = original


def run_fit(
    dataset: str, data: Path, scaling: str, epsilon: float, seed: int, threads: int, noise: str = "secret"
) -> dict:
    """One default DP-DCAN fit (:func:`dpdcan_benchmark.run_one`) with the given input scaling."""
    config = f"DP-DCAN eps={epsilon:g}"
    if config not in ALL_CONFIGS:
        raise ValueError(f"No benchmark configuration {config!r}; use ε = 8, 6 or 4.")
    exact = scaling == "exact"
    context = (
        exact_gene_scaling(load(dataset, data).X.toarray().astype(np.float64)) if exact else nullcontext()
    )
    args = argparse.Namespace(
        dataset=dataset, data=str(data), config=config, seed=seed, threads=threads, noise=noise
    )
    with context:
        row = run_one(args)
    return {**row, "scaling": scaling, "covers": COVERS[scaling]}


def report(path: Path) -> str:
    """Markdown table: ARI mean ± sd (ddof 0) and per seed, per (ε, scaling)."""
    import pandas as pd

    df = pd.DataFrame([json.loads(line) for line in path.read_text().splitlines() if line.strip()])
    out = ["| ε | input scaling | ARI | per seed | clusters found |", "|---|---|---|---|---|"]
    for (eps, scaling), g in df.groupby(["target_epsilon", "scaling"], sort=False):
        g = g.sort_values("seed")
        ari, per_seed = summarize(g.ari)
        found = ", ".join(str(c) for c in g.n_clusters_found)
        out.append(f"| {eps:g} | {scaling} | {ari} | {per_seed} | {found} |")
    return "\n".join(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    common_arguments(parser)
    parser.add_argument("--scaling", nargs="+", choices=SCALINGS, default=list(SCALINGS))
    parser.add_argument("--epsilon", nargs="+", type=float, default=[8.0])
    parser.add_argument("--noise", choices=["secret", "seeded"], default="secret")
    args = parser.parse_args()
    if args.report:
        print(report(args.report))
        return
    for epsilon in args.epsilon:
        for scaling in args.scaling:
            for seed in args.seeds:
                row = run_fit(args.dataset, Path(args.data), scaling, epsilon, seed, args.threads, args.noise)
                emit(row, args.out)


if __name__ == "__main__":
    main()
