"""Two diagnostics of the choices a reference-guided clustering and fit make (labels score only).

``--part coverage`` (no release): whether one released count could tell a reference whose types
are the private cells' from one whose types are not, before the DP k-means starts from the
types' means. For each pair (``reference_key`` given, as ``reference_pairs.py`` does), the share
of the private cells whose point in the public basis lies within :math:`r_t` of the nearest
reference type's mean :math:`m_t` (:math:`r_t` the ``TYPE_RADIUS_QUANTILE`` quantile of t's own
cells' distances to :math:`m_t`, as the cluster names use), beside the same share for the
reference's own cells; and, from ``reference_pairs.jsonl``, the ARI of the type start and of the
sketch start on that pair (mean of both ε and 3 runs). The count of covered cells has sensitivity
1: a release of it costs little ε, so a rule "type start when the released share ≥ c" could be
planned; this part shows what c would have to separate, without noise.

``--part model``: why the fine-tuned model's partition is never kept by ``tl.fit(reference=…)``.
Per pair, ε = 8 and without noise (``epsilon=None``: the same fit, no DP), seeds 20–22: the ARI of
the clustering's partition the fit starts from and of the model's own; the exact k-means objective
of both in the clustering's points (:math:`W/n`, :mod:`dpsc.methods._selection`: the larger, the
tighter), which is what the private choice estimates; and which partition the fit kept.

    OMP_NUM_THREADS=1 python benchmarks/diagnostics/reference_start_choice.py --data ../shared/data \\
        --part coverage
    OMP_NUM_THREADS=1 python benchmarks/diagnostics/reference_start_choice.py --data ../shared/data \\
        --part model
"""

from __future__ import annotations

import argparse
import json
import sys
import warnings
from pathlib import Path

import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from reference_pairs import CANDIDATES, SEEDS, pairs

SKETCH = "ball, 0.9 radius"  # the same basis, the DP k-means started from its own sketch
TYPES = "ball, 0.9 radius, type means start, 1 round of k"  # started from the types' means, no count


def _public(reference, private):
    from dpsc.tl._reference import optional_reference

    shared = reference[:, reference.var_names.isin(private.var_names)].copy()
    public = optional_reference(shared, "label", private, "diagnostic")
    return shared, public, public.basis(markers=False)


def coverage(reference, private, jsonl: Path, name: str) -> dict:
    """Shares of private and reference cells within their nearest type's radius; both starts' ARI."""
    from dpsc._public_reference import TYPE_RADIUS_QUANTILE, reference_points

    _, public, basis = _public(reference, private)
    own = reference_points(public, basis)
    labels = public.labels.astype(str).to_numpy()
    kinds = np.unique(labels)
    means = np.stack([own[labels == kind].mean(0) for kind in kinds])
    radii = np.array(
        [
            np.quantile(np.linalg.norm(own[labels == kind] - m, axis=1), TYPE_RADIUS_QUANTILE)
            for kind, m in zip(kinds, means, strict=True)
        ]
    )

    def share(points: np.ndarray) -> float:
        distances = np.linalg.norm(points[:, None, :] - means[None], axis=2)
        nearest = distances.argmin(1)
        return float((distances[np.arange(len(points)), nearest] <= radii[nearest]).mean())

    runs = [json.loads(line) for line in jsonl.open()] if jsonl.exists() else []
    ari = {
        label: np.mean(
            [r["ari"] for r in runs if r["pair"] == name and r["variant"] == candidate] or [np.nan]
        )
        for label, candidate in (("type start", TYPES), ("sketch", SKETCH))
    }
    private_points = np.asarray(basis.points(private.X))
    return {"pair": name, "private covered": share(private_points), "reference covered": share(own), **ari}


def model(reference, private, name: str) -> list[dict]:
    """Per run: both partitions' ARI and exact k-means objective, and the partition kept."""
    import torch
    from sklearn.metrics import adjusted_rand_score

    import dpsc
    from dpsc.methods import _selection
    from dpsc.methods._clustering import cell_points

    shared, _, basis = _public(reference, private)
    truth = private.obs["label"].to_numpy()
    k = len(np.unique(truth))
    rows = []
    for epsilon in (8.0, None):
        for seed in SEEDS if epsilon else SEEDS[:1]:
            cells = private.copy()
            fitted = dpsc.tl.fit(
                cells, epsilon=epsilon, n_clusters=k, reference=shared, reference_key="label",
                noise_seed=seed, random_state=seed, progress_bar=False, return_model=True,
            )  # fmt: skip
            latent = torch.as_tensor(fitted.get_latent_representation())
            own = fitted.module.soft_assignment(latent).argmax(1).numpy()
            points = cell_points(cells.X, None, None, basis)  # the public basis the fit's clustering reads
            start = fitted._start_centroids  # the clustering's released centroids the fit started from
            start_labels = np.linalg.norm(points[:, None] - start[None], axis=2).argmin(1)
            exact = _selection.partition_tables(points, (start_labels, own), k).reshape(2, k, -1)
            objective = [_between(table) / len(points) for table in exact]
            params = cells.uns["dpsc"]["X_dpdcan"]["params"]
            rows.append(
                {
                    "pair": name,
                    "epsilon": epsilon or "none",
                    "seed": seed,
                    "start ARI": adjusted_rand_score(truth, start_labels),
                    "model ARI": adjusted_rand_score(truth, own),
                    "start W/n": objective[0],
                    "model W/n": objective[1],
                    "kept": params.get("partition", "?"),
                }
            )
    return rows


def _between(table: np.ndarray) -> float:
    """W = Σ_j ‖S_j‖² / n_j of one exact table (rows (S_j, n_j)), empty clusters left out."""
    used = table[:, -1] > 0
    return float(((table[used, :-1] ** 2).sum(1) / table[used, -1]).sum())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, required=True)
    parser.add_argument("--part", choices=("coverage", "model"), required=True)
    parser.add_argument("--only", nargs="*", default=None)
    parser.add_argument(
        "--pairs-jsonl",
        type=Path,
        default=Path(__file__).resolve().parents[1] / "results/reference_pairs.jsonl",
    )
    args = parser.parse_args()
    assert TYPES in CANDIDATES and SKETCH in CANDIDATES
    warnings.filterwarnings("ignore")
    rows = []
    for name, reference, private in pairs(args.data):
        if args.only and name not in args.only:
            continue
        if args.part == "coverage":
            rows.append(coverage(reference, private, args.pairs_jsonl, name))
        else:
            rows.extend(model(reference, private, name))
        print(pd.DataFrame(rows[-1:]).round(3).to_string(index=False, header=len(rows) == 1), flush=True)
    print(pd.DataFrame(rows).round(3).to_markdown(index=False))


if __name__ == "__main__":
    main()
