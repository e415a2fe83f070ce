"""Leave one file out for the default ``tl.fit``'s epochs, scored on the model's embedding.

The default fit writes the clustering's partition unless its model scores clearly better, so what
the model adds is ``obsm["X_dpdcan"]``. For each candidate split of the epochs
(``PC_MODEL_EPOCHS`` of ``dpsc.tl._fit``, ``CANDIDATES``) the default fit runs on each of the six
labelled count files at each ε (secret noise, ``--runs`` runs), beside ``tl.cluster`` at the same
ε; every call scores its embedding's kNN label purity (``fit_default.knn_purity``, k = 15; labels
score only). A fold holds one file out, chooses the candidate with the best mean purity over the
other five (every ε) and reports the held-out file under it, beside ``tl.cluster``'s
``obsm["X_dp_cluster"]`` and the fit's ARI against the clustering's.

    OMP_NUM_THREADS=2 python benchmarks/fit_embedding_lofo.py --data ../shared/data --epsilons 8 4 \\
        --out benchmarks/results/fit_embedding_lofo.jsonl
    python benchmarks/fit_embedding_lofo.py --report benchmarks/results/fit_embedding_lofo.jsonl
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd
from cluster_benchmark import per_file_main, score
from cluster_lofo import labelled_file
from fit_default import one_run

#: candidate → (instance epochs, cluster epochs) of the default model
CANDIDATES = {"10 + 10": (10, 10), "5 + 10": (5, 10), "0 + 10": (0, 10), "0 + 20": (0, 20)}
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


def run(data: Path, name: str, epsilons: list[float], runs: int, commit: str) -> list[dict]:
    adata, truth, k, reference = labelled_file(data, name)
    rows = []
    for candidate in [*CANDIDATES, CLUSTERING]:
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
    means = table.groupby(["dataset", "candidate", "epsilon"])[["purity", "ari"]].mean()
    files = list(dict.fromkeys(table["dataset"]))
    epsilons = sorted(set(table["epsilon"]), reverse=True)
    fits = table[table["candidate"] != CLUSTERING]
    lines = [
        "# The default `tl.fit`'s epochs by leave-one-file-out, scored on its embedding",
        "",
        "Each row is one fold: the epochs (instance + cluster stage) chosen on the other five files",
        '(best mean kNN label purity, k = 15, of `obsm["X_dpdcan"]` over them, every ε), reported on',
        "the held-out file beside `tl.cluster`'s `obsm[\"X_dp_cluster\"]` at the same ε; then the fit's",
        "ARI against the clustering's. Mean over the runs with secret noise; labels score only.",
        "",
        "```",
        "OMP_NUM_THREADS=2 python benchmarks/fit_embedding_lofo.py --data ../shared/data --epsilons 8 4 \\",
        "    --out benchmarks/results/fit_embedding_lofo.jsonl",
        "python benchmarks/fit_embedding_lofo.py --report benchmarks/results/fit_embedding_lofo.jsonl",
        "```",
        "",
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
    lines += [wide[[*CANDIDATES, CLUSTERING]].round(3).to_markdown()]
    return "\n".join(lines) + "\n"


def main() -> None:
    per_file_main(__doc__, "benchmarks/results/fit_embedding_lofo.jsonl", report, run)


if __name__ == "__main__":
    main()
