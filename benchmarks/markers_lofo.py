"""Leave one file out for the private markers' constants: centre, bounds and gene weights.

``dpsc.tl.rank_genes_groups`` first releases the cells' mean expression with ``CENTER_SHARE`` of
its ε, then histograms of the cells' norms from it with ``NORM_SHARE``, and bounds each cell's
expression and squares at the bins where the noisy cumulative counts reach ``NORM_QUANTILE``
(``dpsc.methods.markers``); each gene's part of the table is weighted by ``(m + 0.05)^a`` of its
released mean m, ``a = GENE_WEIGHT_POWER`` (0: the same noise on every gene). Here each candidate
(``CANDIDATES``) runs the markers benchmark (``markers_benchmark.run``: groups = the labels and
``tl.cluster``'s clusters, every ε, ``--runs`` runs with secret noise) on each of the six labelled
count files; a fold holds one file out, chooses the candidate with the best mean top-10 overlap
with scanpy's markers over the other five (every ε, both groupings) and reports the held-out file
under it.

    OMP_NUM_THREADS=2 python benchmarks/markers_lofo.py --data ../shared/data \
        --out benchmarks/results/markers_lofo.jsonl.gz
    python benchmarks/markers_lofo.py --report benchmarks/results/markers_lofo.jsonl.gz

The gene-weight candidates were added later to the same file, one command each:
``--candidates "gene weight 0.25" "gene weight 0.5" --append``, then
``--candidates "gene weight 0.25, centre share 0.2" --append``, the same for 0.3, then the two
offsets, the part weights, the four lighter part weights, the two shares with the shipped part
weights (two names per command), then the power and the two quantiles (one command), then
quantile 0.7 and quantile 0.8 with power 0.35 (one command), then quantiles 0.6 and 0.5, then 0.4 and 0.3,
then, after the groups' variances were shrunk toward their trend (post-processing; the candidates
before ran without it), the three "variances shrunk" candidates (one command), then, after the
released sums were projected on their directions above the noise (``NOISE_EDGE``; 0: every
direction kept, as all the candidates before ran), "sums projected" (one command), then, after
a second, focused table over each group's best genes joined the release (the candidates before ran
with one table), the four "focused" candidates (two processes, three files each).
"""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd
from cluster_lofo import (
    candidate_table,
    constants_table,
    fold_choice,
    held_out_header,
    held_out_rows,
    lofo_main,
    noise_rule_text,
    report_commands,
)
from markers_benchmark import run as markers_run

_SHIPPED_PARTS = {"sum": 1.0, "squares": 0.5, "detected": 0.5, "count": 0.5}
_PART_WEIGHTS = {"sum": 1.0, "squares": 0.4, "detected": 0.3, "count": 0.4}
#: the same noise on every gene; the shipped weights of the row's parts (and its Δ)
_EVEN = {
    "GENE_WEIGHT_POWER": 0.0,
    "GENE_WEIGHT_OFFSET": 0.05,
    "WEIGHTS": _SHIPPED_PARTS,
    "SENSITIVITY": math.sqrt(sum(w**2 for w in _SHIPPED_PARTS.values())),
}


def _weighted(power: float, centre: float, offset: float = 0.05) -> dict:
    """Gene weights (m + offset)^power from the released centre, the centre at this share of ε."""
    return {
        "NORM_QUANTILE": 0.9,
        "NORM_SHARE": 0.1,
        "CENTER_SHARE": centre,
        "GENE_WEIGHT_POWER": power,
        "GENE_WEIGHT_OFFSET": offset,
        "WEIGHTS": _SHIPPED_PARTS,
        "SENSITIVITY": _EVEN["SENSITIVITY"],
    }


CANDIDATES = {
    "centre share 0.05": {"NORM_QUANTILE": 0.9, "NORM_SHARE": 0.1, "CENTER_SHARE": 0.05, **_EVEN},
    "centre share 0.1": {"NORM_QUANTILE": 0.9, "NORM_SHARE": 0.1, "CENTER_SHARE": 0.1, **_EVEN},
    "quantile 0.8": {"NORM_QUANTILE": 0.8, "NORM_SHARE": 0.1, "CENTER_SHARE": 0.05, **_EVEN},
    # gene weights from the released centre: less noise on the expressed genes
    "gene weight 0.25": _weighted(0.25, 0.1),
    "gene weight 0.5": _weighted(0.5, 0.1),
    # the weights read the centre: a better centre for them
    "gene weight 0.25, centre share 0.2": _weighted(0.25, 0.2),
    "gene weight 0.25, centre share 0.3": _weighted(0.25, 0.3),
    "gene weight 0.25, centre share 0.3, offset 0.01": _weighted(0.25, 0.3, 0.01),
    "gene weight 0.25, centre share 0.3, offset 0.2": _weighted(0.25, 0.3, 0.2),
    # less of the row's bound on the parts that do not rank the genes (Δ from 1.32 to 1.19)
    "gene weight 0.25, centre share 0.3, part weights": {
        **_weighted(0.25, 0.3),
        "WEIGHTS": _PART_WEIGHTS,
        "SENSITIVITY": math.sqrt(sum(w**2 for w in _PART_WEIGHTS.values())),
    },
}
# lighter still: the count and the detections only rescale a group's means or give its fractions
# (the detections give each gene's fraction of expressing cells: the last two keep their 0.3)
for _parts in ((1.0, 0.3, 0.2, 0.2), (1.0, 0.25, 0.15, 0.15), (1.0, 0.25, 0.3, 0.15), (1.0, 0.2, 0.3, 0.1)):
    _weights = dict(zip(("sum", "squares", "detected", "count"), _parts, strict=True))
    CANDIDATES[f"part weights {_parts[1:]}"] = {
        **_weighted(0.25, 0.3),
        "WEIGHTS": _weights,
        "SENSITIVITY": math.sqrt(sum(w**2 for w in _weights.values())),
    }
# the shares of ε, the gene weights' power and the bounds' quantile again, with the shipped part weights
_SHIPPED_CANDIDATE = CANDIDATES["part weights (0.25, 0.3, 0.15)"]
for _label, _constant, _value in (
    ("centre share 0.2", "CENTER_SHARE", 0.2),
    ("norm share 0.05", "NORM_SHARE", 0.05),
    ("gene weight 0.35", "GENE_WEIGHT_POWER", 0.35),
    ("quantile 0.8", "NORM_QUANTILE", 0.8),
    ("quantile 0.95", "NORM_QUANTILE", 0.95),
):
    CANDIDATES[f"part weights (0.25, 0.3, 0.15), {_label}"] = {**_SHIPPED_CANDIDATE, _constant: _value}
for _label, _changes in (
    ("quantile 0.7", {"NORM_QUANTILE": 0.7}),
    ("quantile 0.6", {"NORM_QUANTILE": 0.6}),
    ("quantile 0.5", {"NORM_QUANTILE": 0.5}),
    ("quantile 0.4", {"NORM_QUANTILE": 0.4}),
    ("quantile 0.3", {"NORM_QUANTILE": 0.3}),
    ("quantile 0.8, gene weight 0.35", {"NORM_QUANTILE": 0.8, "GENE_WEIGHT_POWER": 0.35}),
):
    CANDIDATES[f"part weights (0.25, 0.3, 0.15), {_label}"] = {**_SHIPPED_CANDIDATE, **_changes}
# rerun after the variances were shrunk toward their trend (``shrunk_variances``, post-processing):
# the shipped constants again, and the centre's share of ε on either side
_QUANTILE_03 = CANDIDATES["part weights (0.25, 0.3, 0.15), quantile 0.3"]
for _label, _changes in (
    ("", {}),
    (", centre share 0.2", {"CENTER_SHARE": 0.2}),
    (", centre share 0.4", {"CENTER_SHARE": 0.4}),
):
    CANDIDATES[f"quantile 0.3, variances shrunk{_label}"] = {**_QUANTILE_03, **_changes}
# every candidate above ran with the released sums as they are: NOISE_EDGE 0 keeps every direction
for _constants in CANDIDATES.values():
    _constants["NOISE_EDGE"] = 0.0
CANDIDATES["quantile 0.3, variances shrunk, sums projected"] = {
    **CANDIDATES["quantile 0.3, variances shrunk"],
    "NOISE_EDGE": 1.0,
}
# a second, focused table over each group's best genes in the first (``FOCUS_GENES`` per group, the
# five releases' shares ``FOCUSED_SHARES``); every candidate above ran with one table
_ONE_TABLE = CANDIDATES["quantile 0.3, variances shrunk, sums projected"]
_SHARES = {"center": 0.15, "norms": 0.05, "table": 0.3, "focus_norms": 0.05, "focus_table": 0.45}
for _label, _genes, _changes in (
    ("focused 50", 50, {}),
    ("focused 25", 25, {}),
    ("focused 15", 15, {}),
    ("focused 25, first table 0.2", 25, {"table": 0.2}),
):
    CANDIDATES[_label] = {**_ONE_TABLE, "FOCUS_GENES": _genes, "FOCUSED_SHARES": {**_SHARES, **_changes}}
SHIPPED = "focused 50"
#: A fold chooses among the candidates that keep at least this weight on the detections: a gene's
#: fraction of expressing cells (``pts``, the dot plots' circle sizes) carries noise of sd
#: σΔC_d / (w_d ñ_g), so a lighter w_d makes every fraction noisier, which the top-10 overlap does
#: not measure. The lighter candidates are run and shown, not chosen.
MIN_DETECTED_WEIGHT = 0.3
ONLY: list[str] = []  # --candidates: the candidates this run makes rows for (empty: all)


def set_candidate(constants: dict) -> None:
    from dpsc.methods import markers as _markers

    for name, value in constants.items():
        setattr(_markers, name, value)


def run(data: Path, name: str, epsilons: list[float], runs: int, commit: str) -> list[dict]:
    from dpsc.methods import markers as _markers

    shipped = {constant: getattr(_markers, constant) for constant in CANDIDATES[SHIPPED]}
    rows = []
    for candidate, constants in CANDIDATES.items():
        if ONLY and candidate not in ONLY:
            continue
        set_candidate(constants)
        rows += [{**row, "candidate": candidate} for row in markers_run(data, name, epsilons, runs, commit)]
    set_candidate(shipped)
    return rows


def report(path: Path) -> str:
    table = pd.read_json(path, lines=True)
    table = table[~table["small_group"]]  # groups below 2 % of the cells are reported apart there
    per_run = table.groupby(["dataset", "candidate", "epsilon", "grouping", "run"])["top10"].mean()
    means = per_run.groupby(["dataset", "candidate", "epsilon"]).mean()
    files = list(dict.fromkeys(table["dataset"]))
    epsilons = sorted(set(table["epsilon"]), reverse=True)
    lines = [
        "# The private markers' constants by leave-one-file-out",
        "",
        "Each row is one fold: the candidate chosen on the other five files (best mean top-10 overlap",
        "with scanpy's t-test markers over them, every ε, groups = labels and `tl.cluster`'s clusters,",
        "groups of at least 2 % of the cells), reported on the held-out file (mean over groups,",
        "groupings and runs with secret noise); the candidates' constants are listed below the tables.",
        f"A fold chooses among the candidates that keep a weight of at least {MIN_DETECTED_WEIGHT:g} on",
        "the detections (the fractions of expressing cells in every dot plot carry noise inversely",
        "proportional to it); the lighter ones are shown in the last tables.",
        *noise_rule_text(SHIPPED),
        "",
        *report_commands("markers_lofo"),
        "",
        "The gene-weight and part-weight candidates were run later into the same file (`--candidates",
        'NAME --append`); the first three use even weights (`GENE_WEIGHT_POWER` 0). The three "variances',
        "shrunk\" candidates ran after each group's noisy variances were shrunk toward their trend",
        "(post-processing, `dpsc.methods.markers.shrunk_variances`); the others ran without it.",
        '"Sums projected" ran last, after the released sums were kept where they stand above the noise',
        "(post-processing, `dpsc.methods.markers.projected_sums`, `NOISE_EDGE` 1); every candidate before",
        "ran with the sums as released (`NOISE_EDGE` 0).",
        "",
        *held_out_header(epsilons),
    ]

    eligible = [c for c, v in CANDIDATES.items() if v["WEIGHTS"]["detected"] >= MIN_DETECTED_WEIGHT]

    def chosen_for(name: str) -> str:
        others = per_run[per_run.index.get_level_values("dataset") != name]
        others = others[others.index.get_level_values("candidate").isin(eligible)]
        mean = others.groupby(["dataset", "candidate", "epsilon"]).mean().groupby("candidate").mean()
        return fold_choice(mean, others.groupby(["candidate", "run"]).mean(), SHIPPED)

    def cell(name: str, chosen: str, eps: float) -> tuple[float, str]:
        value = means.loc[(name, chosen, eps)]
        return value, f"{value:.2f}"

    lines += held_out_rows(files, epsilons, chosen_for, cell)
    lines += ["", "Every candidate on every file (top-10 overlap, mean):", ""]
    lines += candidate_table(means, epsilons, [f"{e:g}" for e in epsilons])
    lines += constants_table(CANDIDATES, table)
    return "\n".join(lines) + "\n"


def main() -> None:
    lofo_main(__doc__, "benchmarks/results/markers_lofo.jsonl.gz", report, run, ONLY)


if __name__ == "__main__":
    main()
