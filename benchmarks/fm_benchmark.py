"""Functional mechanism (pCDBN) benchmark: cell-type annotation, epochs vs ε, digits ablation.

Parts (results are appended to a JSON-lines file; ``--report`` writes markdown):

- ``annotation``: PBMC 4k and mouse bladder from ``../shared/data``, 70/30 split by cell (the 30 %
  are the query; the PCA feature map is fitted on them), accuracy and macro-F1 of pCDBN,
  DP-SGD MLP (Opacus) and the non-private MLP at ε ∈ {0.1, 0.5, 1, 2, 8}, seeds 0–2.
- ``epochs``: PBMC, ε = 0.5: pCDBN trained for 1…400 epochs (spent ε flat) vs DP-SGD with the
  noise multiplier that reaches ε = 0.5 after 10 epochs, asked for 1…50 epochs and stopped where
  the next epoch would exceed the budget (spent ε grows).
- ``digits``: scikit-learn ``load_digits`` (1797 8×8 images, 70/30 split), convolutional pCDBN
  vs DP-SGD MLP at ε ∈ {0.5, 1, 2, 8}; and the approximation ablation (Chebyshev vs Taylor at
  L ∈ {3, 5, 7, 9}, 2×2 filters so that the degree-9 moment tensor, 4⁹ entries, fits; piecewise
  linear in the error table only: it is not a polynomial in the weights).

Labels are used for training the classifiers (that is the task) and for scoring; no
hyper-parameter was chosen on these data. Usage (repo root)::

    python benchmarks/fm_benchmark.py --data ../shared/data --parts annotation noiseless epochs digits \
        --out benchmarks/results/fm.jsonl
    python benchmarks/fm_benchmark.py --report benchmarks/results/fm.jsonl
"""

from __future__ import annotations

import argparse
import json
import time
import warnings
from pathlib import Path

import numpy as np

EPSILONS = (0.1, 0.5, 1.0, 2.0, 8.0)
DATASETS = {"pbmc": "pbmc_10x_4k_top2000.h5", "bladder": "mouse_bladder_top2000.h5"}


def split(adata, seed: int):
    rng = np.random.default_rng(seed)
    order = rng.permutation(adata.n_obs)
    cut = int(0.7 * adata.n_obs)
    return adata[np.sort(order[:cut])].copy(), adata[np.sort(order[cut:])].copy()


def score(truth, pred) -> dict:
    from sklearn.metrics import accuracy_score, f1_score

    truth, pred = np.asarray(truth, str), np.asarray(pred, str)
    return {
        "accuracy": float(accuracy_score(truth, pred)),
        "macro_f1": float(f1_score(truth, pred, average="macro")),
    }


def part_annotation(args, emit) -> None:
    import dpsc

    for name in args.datasets:
        adata = dpsc.datasets.read_h5(Path(args.data) / DATASETS[name])
        for seed in args.seeds:
            ref, query = split(adata, seed)
            runs = [("mlp", None)] + [(m, e) for m in ("pcdbn", "dpsgd") for e in EPSILONS]
            for method, eps in runs:
                start = time.perf_counter()
                dpsc.tl.annotate(
                    query, ref, "label", epsilon=eps, method=method, random_state=seed, noise_seed=seed
                )
                row = {"part": "annotation", "dataset": name, "seed": seed, "method": method, "epsilon": eps}
                row.update(score(query.obs["label"], query.obs["dp_label"]))
                row["spent_epsilon"] = query.uns["dpsc"]["dp_label"]["reference"]["epsilon"]
                row["wall_s"] = time.perf_counter() - start
                emit(row)


def part_noiseless(args, emit) -> None:
    """pCDBN with ε = 10⁹ (no effective noise): what the architecture reaches without privacy."""
    import dpsc

    for name in args.datasets:
        adata = dpsc.datasets.read_h5(Path(args.data) / DATASETS[name])
        for seed in args.seeds:
            ref, query = split(adata, seed)
            dpsc.tl.annotate(
                query, ref, "label", epsilon=1e9, method="pcdbn", random_state=seed, noise_seed=seed
            )
            row = {"part": "noiseless", "dataset": name, "seed": seed, "method": "pcdbn"}
            row.update(score(query.obs["label"], query.obs["dp_label"]))
            emit(row)


def part_epochs(args, emit) -> None:
    from opacus.accountants.utils import get_noise_multiplier

    import dpsc

    adata = dpsc.datasets.read_h5(Path(args.data) / DATASETS["pbmc"])
    budget, batch = 0.5, 128
    for seed in args.seeds:
        ref, query = split(adata, seed)
        for epochs in (1, 10, 50, 100, 200, 400):
            dpsc.tl.annotate(
                query, ref, "label", epsilon=budget, method="pcdbn", epochs=epochs, random_state=seed,
                noise_seed=seed,
            )  # fmt: skip
            row = {
                "part": "epochs",
                "seed": seed,
                "method": "pcdbn",
                "epochs_asked": epochs,
                "epochs_trained": epochs,
            }
            row.update(score(query.obs["label"], query.obs["dp_label"]))
            row["spent_epsilon"] = query.uns["dpsc"]["dp_label"]["reference"]["epsilon"]
            emit(row)
        steps = -(-ref.n_obs // batch)  # Opacus: sample rate 1/len(loader), len(loader) steps per epoch
        sigma = get_noise_multiplier(
            target_epsilon=budget,
            target_delta=1e-5,
            sample_rate=1 / steps,
            epochs=10,
            accountant="prv",
        )
        for epochs in (1, 2, 5, 10, 20, 50):
            dpsc.tl.annotate(
                query, ref, "label", epsilon=None, method="dpsgd", noise_multiplier=sigma, max_epsilon=budget,
                epochs=epochs, batch_size=batch, random_state=seed, noise_seed=seed,
            )  # fmt: skip
            record = query.uns["dpsc"]["dp_label"]["reference"]
            row = {"part": "epochs", "seed": seed, "method": "dpsgd", "epochs_asked": epochs}
            row["epochs_trained"] = record["epochs"]
            row["noise_multiplier"] = sigma
            row.update(score(query.obs["label"], query.obs["dp_label"]))
            row["spent_epsilon"] = record["epsilon"]
            row["epsilon_if_all_epochs"] = _epsilon_after(sigma, 1 / steps, epochs, steps)
            emit(row)


def _epsilon_after(sigma: float, rate: float, epochs: int, steps_per_epoch: int) -> float:
    from dpsc.privacy import history_epsilon

    return history_epsilon([(sigma, rate, epochs * steps_per_epoch)], 1e-5, "prv")


def part_digits(args, emit) -> None:
    from sklearn.datasets import load_digits

    from dpsc import fm

    X, y = load_digits(return_X_y=True)
    X = X / 16.0
    for seed in args.seeds:
        order = np.random.default_rng(seed).permutation(len(y))
        tr, te = order[: int(0.7 * len(y))], order[int(0.7 * len(y)) :]
        for eps in (0.5, 1.0, 2.0, 8.0, None):
            for method in ("pcdbn", "dpsgd"):
                start = time.perf_counter()
                if method == "pcdbn":
                    model = fm.PrivateDBN(
                        (8,), epsilon=1e9 if eps is None else eps, image_shape=(8, 8), kernel_size=3, pool=3,
                        epochs=100, random_state=seed, noise_seed=seed,
                    )  # fmt: skip
                else:
                    model = fm.DPSGDClassifier(epsilon=eps, random_state=seed, noise_seed=seed)
                model.fit(X[tr], y[tr])
                row = {"part": "digits", "seed": seed, "method": method, "epsilon": eps}
                row.update(score(y[te], model.predict(X[te])))
                row["wall_s"] = time.perf_counter() - start
                emit(row)
        for kind in ("chebyshev", "taylor"):
            for degree in (3, 5, 7, 9):
                for eps in (1.0, None):
                    model = fm.PrivateDBN(
                        (8,), epsilon=1e9 if eps is None else eps, image_shape=(8, 8), kernel_size=2, pool=3,
                        degree=degree, approximation=kind, epochs=100, random_state=seed, noise_seed=seed,
                    )  # fmt: skip
                    model.fit(X[tr], y[tr])
                    row = {
                        "part": "ablation",
                        "seed": seed,
                        "approximation": kind,
                        "degree": degree,
                        "epsilon": eps,
                    }
                    row.update(score(y[te], model.predict(X[te])))
                    emit(row)


def approximation_table() -> str:
    from dpsc import fm

    lines = [
        "| L | Chebyshev max error | Chebyshev bound | Taylor max error | piecewise-linear max error |",
        "|---|---|---|---|---|",
    ]
    for degree in (3, 5, 7, 9):
        errs = [
            fm.approximate_softplus(k, degree, 4.0).max_error() for k in ("chebyshev", "taylor", "piecewise")
        ]
        bound = fm.chebyshev_error_bound(degree, 4.0)
        lines.append(f"| {degree} | {errs[0]:.4f} | {bound:.4f} | {errs[1]:.3f} | {errs[2]:.4f} |")
    return "\n".join(lines)


def _ms(values) -> str:
    values = np.asarray(values, float)
    return f"{values.mean():.3f} ± {values.std(ddof=1):.3f}" if values.size > 1 else f"{values.mean():.3f}"


def report(path: str) -> str:
    import pandas as pd

    rows = pd.DataFrame([json.loads(line) for line in open(path)])
    out = [
        "# Functional mechanism (pCDBN) benchmark",
        "",
        "Command: `python benchmarks/fm_benchmark.py --data ../shared/data --parts annotation noiseless "
        "epochs digits --out benchmarks/results/fm.jsonl`, then `--report`. Mean ± sd over seeds "
        f"{sorted(rows['seed'].unique().tolist())}; 2 CPU cores. Noise: `noise_seed` = the seed "
        "(repeatable, a benchmark, not a release); each release of a fit draws from its own stream "
        "of that seed.",
        "",
        "pCDBN: one private RBM layer (16 hidden units on 8 query-fitted PCs; for digits 8 convolutional "
        "3×3 filters + 3×3 max pooling), Chebyshev degree 7 on [−4, 4], 200 epochs (digits: 100), ε split "
        "equally between the RBM and the softmax layer, pure ε-DP. DP-SGD: Opacus MLP (64 hidden), "
        "30 epochs, batch 128 (Poisson), C = 1, δ = 1e-5, Opacus PRV accountant.",
    ]
    ann = rows[rows["part"] == "annotation"]
    if len(ann):
        out += ["", "## 1. Cell-type annotation (70/30 split by cell)", ""]
        for metric in ("accuracy", "macro_f1"):
            out += [
                f"**{metric}**",
                "",
                "| dataset | method | " + " | ".join(f"ε={e:g}" for e in EPSILONS) + " | no privacy |",
            ]
            out += ["|---|---|" + "---|" * (len(EPSILONS) + 1)]
            for (name, method), group in ann.groupby(["dataset", "method"], sort=False):
                if method == "mlp":
                    continue
                cells = [_ms(group[group["epsilon"] == e][metric]) for e in EPSILONS]
                mlp = ann[(ann["dataset"] == name) & (ann["method"] == "mlp")][metric]
                ref = f"MLP {_ms(mlp)}"
                free = rows[(rows["part"] == "noiseless") & (rows["dataset"] == name)]
                if method == "pcdbn" and len(free):
                    ref += f"; pCDBN ε=10⁹ {_ms(free[metric])}"
                out.append(f"| {name} | {method} | " + " | ".join(cells) + f" | {ref} |")
            out.append("")
        wall = ann.groupby(["dataset", "method"])["wall_s"].mean()
        out.append(
            "Mean wall time per fit (s): " + ", ".join(f"{d} {m} {v:.1f}" for (d, m), v in wall.items())
        )
    ep = rows[rows["part"] == "epochs"]
    if len(ep):
        out += ["", "## 2. Epochs vs ε at a budget of ε = 0.5 (PBMC)", ""]
        out += [
            "| method | epochs asked | epochs trained | spent ε | ε if all epochs ran | accuracy |",
            "|---|---|---|---|---|---|",
        ]
        for (method, epochs), group in ep.groupby(["method", "epochs_asked"], sort=False):
            would = group["epsilon_if_all_epochs"].mean() if "epsilon_if_all_epochs" in group else np.nan
            would = f"{would:.3f}" if np.isfinite(would) else "same (0.5)"
            trained, spent = group["epochs_trained"].mean(), group["spent_epsilon"].mean()
            acc = _ms(group["accuracy"])
            out.append(f"| {method} | {int(epochs)} | {trained:.0f} | {spent:.3f} | {would} | {acc} |")
    dig = rows[rows["part"] == "digits"]
    if len(dig):
        out += ["", "## 3. Digits (scikit-learn `load_digits`, 70/30)", ""]
        out += ["| method | ε=0.5 | ε=1 | ε=2 | ε=8 | no privacy |", "|---|---|---|---|---|---|"]
        for method, group in dig.groupby("method", sort=False):
            cells = [_ms(group[group["epsilon"] == e]["accuracy"]) for e in (0.5, 1.0, 2.0, 8.0)]
            cells.append(_ms(group[group["epsilon"].isna()]["accuracy"]))
            out.append(f"| {method} | " + " | ".join(cells) + " |")
    abl = rows[rows["part"] == "ablation"]
    if len(abl):
        out += ["", "### Approximation ablation (digits, 2×2 filters, accuracy)", ""]
        out += ["| approximation | L | ε = 1 | no privacy |", "|---|---|---|---|"]
        for (kind, degree), group in abl.groupby(["approximation", "degree"], sort=False):
            out.append(
                f"| {kind} | {int(degree)} | {_ms(group[group['epsilon'] == 1.0]['accuracy'])} "
                f"| {_ms(group[group['epsilon'].isna()]['accuracy'])} |"
            )
    out += ["", "### Approximation error of softplus on [−4, 4]", "", approximation_table(), ""]
    return "\n".join(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--data", default="../shared/data")
    parser.add_argument("--parts", nargs="+", default=["annotation", "noiseless", "epochs", "digits"])
    parser.add_argument("--datasets", nargs="+", default=list(DATASETS))
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", default="benchmarks/results/fm.jsonl")
    parser.add_argument("--report")
    args = parser.parse_args()
    if args.report:
        print(report(args.report))
        return
    import torch

    torch.set_num_threads(args.threads)
    warnings.filterwarnings("ignore")

    def emit(row: dict) -> None:
        print(json.dumps(row), flush=True)
        with open(args.out, "a") as fh:
            fh.write(json.dumps(row) + "\n")

    parts = {
        "annotation": part_annotation,
        "noiseless": part_noiseless,
        "epochs": part_epochs,
        "digits": part_digits,
    }
    for part in args.parts:
        parts[part](args, emit)


if __name__ == "__main__":
    main()
