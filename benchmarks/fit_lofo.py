"""Leave one file out for the default ``tl.fit``'s split of ε between its start and its training.

The default fit gives ``START_SHARE`` of ε to the private clustering it starts from and
``TRAINING_SHARE`` to its training (``dpsc.model._dcan_privacy``; the partition choice has the
rest, 0.05) and trains ``PC_MODEL_EPOCHS`` (``dpsc.tl._fit``). For each candidate
(``CANDIDATES``) the default fit runs on each of the six labelled count files at each ε (secret
noise, ``--runs`` runs); a fold holds one file out, chooses the candidate with the best mean ARI
relative to scanpy over the other five (every ε) and reports the held-out file under it.

    OMP_NUM_THREADS=2 python benchmarks/fit_lofo.py --data ../shared/data --epsilons 8 4 \
        --out benchmarks/results/fit_lofo.jsonl
    python benchmarks/fit_lofo.py --report benchmarks/results/fit_lofo.jsonl

The choice's share (``choice share 0.1``: start 0.8, training 0.1) is a candidate too; a
candidate added later runs alone and appends:

    FIT_LOFO_CANDIDATES="choice share 0.1" \
        OMP_NUM_THREADS=2 python benchmarks/fit_lofo.py --data ../shared/data --append \
        --out benchmarks/results/fit_lofo.jsonl

Until the model's centroids started at the encoder's image of the clustering's released centroids
(no release), they started from sampled releases of each start cluster's latent sum, whose number
(5, 10 or 20) was a candidate here too; those rows left with that code.
"""

from __future__ import annotations

import os
import time
import warnings
from pathlib import Path

import pandas as pd
from cluster_benchmark import FILES, per_file_main, score
from cluster_lofo import (
    candidate_table,
    constants_table,
    fold_choice,
    held_out_header,
    held_out_rows,
    labelled_file,
    noise_rule_text,
    report_commands,
)

FILES["cite_cbmc"] = "cite_cbmc_top2000.h5"
EPOCHS = {"instance_epochs": 10, "cluster_epochs": 10}
DEFAULT = {"START_SHARE": 0.85, "TRAINING_SHARE": 0.1, "PC_MODEL_EPOCHS": EPOCHS}
CANDIDATES = {
    "start share 0.6": DEFAULT | {"START_SHARE": 0.6, "TRAINING_SHARE": 0.35},
    "start share 0.75": DEFAULT | {"START_SHARE": 0.75, "TRAINING_SHARE": 0.2},
    "default": DEFAULT,
    "start share 0.9": DEFAULT | {"START_SHARE": 0.9, "TRAINING_SHARE": 0.05},
    "choice share 0.1": DEFAULT | {"START_SHARE": 0.8},
}


def set_candidate(constants: dict) -> None:
    from dpsc.model import _dcan_privacy
    from dpsc.tl import _fit

    _dcan_privacy.START_SHARE = constants["START_SHARE"]
    _dcan_privacy.TRAINING_SHARE = constants["TRAINING_SHARE"]
    _fit.PC_MODEL_EPOCHS = dict(constants["PC_MODEL_EPOCHS"])


def run(data: Path, name: str, epsilons: list[float], runs: int, commit: str) -> list[dict]:
    import dpsc

    adata, truth, k, reference = labelled_file(data, name)
    rows = []
    chosen = os.environ.get("FIT_LOFO_CANDIDATES")  # a comma-separated subset, to add candidates later
    for candidate, constants in CANDIDATES.items():
        if chosen and candidate not in chosen.split(","):
            continue
        set_candidate(constants)
        for epsilon in epsilons:
            for r in range(runs):
                cells = adata.copy()
                start = time.perf_counter()
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    dpsc.tl.fit(cells, epsilon=epsilon, n_clusters=k, progress_bar=False)
                row = score(truth, cells.obs["dp_cluster"].to_numpy())
                rows.append(
                    {"dataset": name, "candidate": candidate, "epsilon": epsilon, "run": r}
                    | {m: row[m] for m in ("ari", "nmi", "clusters_used")}
                    | {
                        "scanpy_ari": reference["ari"],
                        "seconds": time.perf_counter() - start,
                        "source": commit,
                    }
                )
    set_candidate(CANDIDATES["default"])
    return rows


def report(path: Path) -> str:
    table = pd.read_json(path, lines=True)
    table["ratio"] = table["ari"] / table["scanpy_ari"]
    means = table.groupby(["dataset", "candidate", "epsilon"])[["ari", "ratio"]].mean()
    files = list(dict.fromkeys(table["dataset"]))
    epsilons = sorted(set(table["epsilon"]), reverse=True)
    lines = [
        "# The default `tl.fit`'s constants by leave-one-file-out",
        "",
        "Each row is one fold: the candidate chosen on the other five files (best mean ARI relative",
        "to scanpy over them, every ε), reported on the held-out file: ARI / scanpy's ARI (the",
        "file's ARI in brackets), mean over the runs with secret noise; the candidates' constants",
        "are listed below the tables.",
        *noise_rule_text("default"),
        "",
        *report_commands("fit_lofo", " --epsilons 8 4"),
        "",
        *held_out_header(epsilons),
    ]

    def chosen_for(name: str) -> str:
        others = table[table["dataset"] != name]
        mean = others.groupby("candidate")["ratio"].mean()
        return fold_choice(mean, others.groupby(["candidate", "run"])["ratio"].mean(), "default")

    def cell(name: str, chosen: str, eps: float) -> tuple[float, str]:
        value = means.loc[(name, chosen, eps)]
        return value["ratio"], f"{value['ratio']:.2f} ({value['ari']:.3f})"

    lines += held_out_rows(files, epsilons, chosen_for, cell)
    lines += ["", "Every candidate on every file (ARI / scanpy, mean over runs):", ""]
    lines += candidate_table(means["ratio"], epsilons, [f"{e:g}" for e in epsilons])
    lines += constants_table(CANDIDATES, table)
    return "\n".join(lines) + "\n"


def main() -> None:
    per_file_main(__doc__, "benchmarks/results/fit_lofo.jsonl", report, run)


if __name__ == "__main__":
    main()
