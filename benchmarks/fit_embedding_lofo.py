"""Leave one file out for the default ``tl.fit``'s epochs, scored on the model's embedding.

The default fit writes the clustering's partition unless its model scores clearly better, so what
the model adds is ``obsm["X_dpdcan"]``. For each candidate split of the epochs
(``PC_MODEL_EPOCHS`` of ``dpsc.tl._fit``, ``CANDIDATES``) the default fit runs on each of the six
labelled count files at each ε (secret noise, ``--runs`` runs), beside ``tl.cluster`` at the same
ε; every call scores its embedding's kNN label purity (``fit_default.knn_purity``, k = 15; labels
score only). A fold holds one file out, chooses the candidate with the best mean purity over the
other five (every ε) and reports the held-out file under it, beside ``tl.cluster``'s
``obsm["X_dp_cluster"]`` and the fit's ARI against the clustering's. Each run of the command
(its rows' ``source`` commit) is its own leave-one-file-out, reported in its own section: the
first at a10de17 (the latent in the encoder's input coordinates, the mean coordinate weighted
0.5), the second at 8c1dae9 (the latent in the clustering's coordinates, ``--candidates "0 + 0"
"0 + 10" "0 + 20" --append``).

    OMP_NUM_THREADS=2 python benchmarks/fit_embedding_lofo.py --data ../shared/data --epsilons 8 4 \\
        --out benchmarks/results/fit_embedding_lofo.jsonl
    python benchmarks/fit_embedding_lofo.py --report benchmarks/results/fit_embedding_lofo.jsonl
"""

from __future__ import annotations

from functools import partial
from pathlib import Path

import pandas as pd
from cluster_benchmark import per_file_parser, score, write_per_file
from cluster_lofo import labelled_file
from fit_default import one_run

#: candidate → (instance epochs, cluster epochs) of the default model
CANDIDATES = {"10 + 10": (10, 10), "5 + 10": (5, 10), "0 + 10": (0, 10), "0 + 20": (0, 20), "0 + 0": (0, 0)}
#: What each run of the command measured (its rows' ``source``).
SOURCES = {
    "a10de17": "the latent in the encoder's input coordinates (mean coordinate weighted 0.5)",
    "8c1dae9": "the latent in the clustering's coordinates (untrained: X_dp_cluster scaled)",
}
SHIPPED = "0 + 10"
CLUSTERING = "tl.cluster"


def one_call(adata, truth, k: int, epsilon: float, candidate: str) -> dict:
    """ARI, purity and seconds of one call: the fit at ``candidate``'s epochs, or ``tl.cluster``."""
    if candidate == CLUSTERING:
        labels, seconds, _, _, purity = one_run(adata, k, epsilon, "tl.cluster")
    else:
        instance, cluster = CANDIDATES[candidate]
        labels, seconds, _, _, purity = one_run(
            adata, k, epsilon, "tl.fit", instance_epochs=instance, cluster_epochs=cluster
        )
    return {"ari": score(truth, labels)["ari"], "seconds": seconds, **purity}


def run(
    candidates: list[str], data: Path, name: str, epsilons: list[float], runs: int, commit: str
) -> list[dict]:
    adata, truth, k, reference = labelled_file(data, name)
    rows = []
    for candidate in [*candidates, CLUSTERING]:
        for epsilon in epsilons:
            for r in range(runs):
                scores = one_call(adata, truth, k, epsilon, candidate)
                rows.append(
                    {"dataset": name, "candidate": candidate, "epsilon": epsilon, "run": r, "source": commit}
                    | {m: scores[m] for m in ("ari", "purity", "seconds")}
                    | {"scanpy_ari": reference["ari"]}
                )
    return rows


def report(path: Path) -> str:
    table = pd.read_json(path, lines=True)
    lines = [
        "# The default `tl.fit`'s epochs by leave-one-file-out, scored on its embedding",
        "",
        "Each row is one fold: the epochs (instance + cluster stage) chosen on the other five files",
        '(best mean kNN label purity, k = 15, of `obsm["X_dpdcan"]` over them, every ε), reported on',
        "the held-out file beside `tl.cluster`'s `obsm[\"X_dp_cluster\"]` at the same ε; then the fit's",
        "ARI against the clustering's. Mean over the runs with secret noise; labels score only. One",
        "section per run of the command (the model it measured).",
        "",
        "```",
        "OMP_NUM_THREADS=2 python benchmarks/fit_embedding_lofo.py --data ../shared/data --epsilons 8 4 \\",
        "    --out benchmarks/results/fit_embedding_lofo.jsonl",
        "python benchmarks/fit_embedding_lofo.py --data ../shared/data --epsilons 8 4 \\",
        '    --candidates "0 + 0" "0 + 10" "0 + 20" --append \\',
        "    --out benchmarks/results/fit_embedding_lofo.jsonl",
        "python benchmarks/fit_embedding_lofo.py --report benchmarks/results/fit_embedding_lofo.jsonl",
        "```",
    ]
    for source, rows in table.groupby("source", sort=False):
        lines += ["", f"## {SOURCES.get(source, source)} (rows of {source})", "", *folds(rows)]
    return "\n".join(lines) + "\n"


def folds(table: pd.DataFrame) -> list[str]:
    """The leave-one-file-out of one run of the command, and every candidate's mean purity."""
    means = table.groupby(["dataset", "candidate", "epsilon"])[["purity", "ari"]].mean()
    files = list(dict.fromkeys(table["dataset"]))
    epsilons = sorted(set(table["epsilon"]), reverse=True)
    fits = table[table["candidate"] != CLUSTERING]
    lines = [
        "| held-out file | chosen on the others | "
        + " | ".join(f"ε = {e:g}: X_dpdcan / X_dp_cluster" for e in epsilons)
        + " | "
        + " | ".join(f"ε = {e:g}: fit ARI / tl.cluster ARI" for e in epsilons)
        + " |",
        "|---|---|" + "---|" * (2 * len(epsilons)),
    ]
    for name in files:
        others = fits[fits["dataset"] != name].groupby("candidate")["purity"].mean()
        chosen = others.idxmax()
        purity = [
            f"{means.loc[(name, chosen, e), 'purity']:.3f} / {means.loc[(name, CLUSTERING, e), 'purity']:.3f}"
            for e in epsilons
        ]
        ari = [
            f"{means.loc[(name, chosen, e), 'ari']:.3f} / {means.loc[(name, CLUSTERING, e), 'ari']:.3f}"
            for e in epsilons
        ]
        lines.append(f"| {name} | {chosen} | " + " | ".join(purity + ari) + " |")
    lines += ["", f"Every candidate on every file (purity, mean over runs and ε); shipped: {SHIPPED}.", ""]
    wide = table.groupby(["dataset", "candidate"])["purity"].mean().unstack("candidate")
    order = [c for c in [*CANDIDATES, CLUSTERING] if c in wide.columns]
    lines += [wide[order].round(3).to_markdown(), ""]
    overall = fits.groupby("candidate")["purity"].mean()
    lines += ["Mean over the six files: " + ", ".join(f"{c} {overall[c]:.4f}" for c in order if c in overall)]
    return lines


def main() -> None:
    parser = per_file_parser(__doc__, "benchmarks/results/fit_embedding_lofo.jsonl")
    parser.add_argument("--candidates", nargs="+", default=list(CANDIDATES), choices=list(CANDIDATES))
    args = parser.parse_args()
    if args.report:
        print(report(args.report), end="")
        return
    write_per_file(args, partial(run, args.candidates))


if __name__ == "__main__":
    main()
