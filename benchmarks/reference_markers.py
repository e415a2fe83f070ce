"""Private marker genes measured from a public reference, against the same call without one.

On the reference / private pairs of ``reference_pairs.py`` (Baron donors, CellBench plates, the
endocrinogenesis set as a cross-study reference for Baron, random halves of the labelled files),
``dpsc.tl.rank_genes_groups`` on the private cells grouped by their true labels at ε = 8 and 2
(secret noise, ``--runs`` runs) is compared with scanpy's non-private t-test on the same cells and
groups (``markers_benchmark.compare``: each group's top-10 and top-50 overlap, the Spearman
correlation of all scores). Three variants: no reference; ``reference=`` (the reference's mean as
the centre); ``reference=`` with ``reference_key=`` (also the focused genes from the reference's
types). No constant is chosen here: the variants use the shipped shares and focus size. Groups of
fewer than 2 cells (which scanpy refuses) are left out.

    OMP_NUM_THREADS=1 python benchmarks/reference_markers.py --data ../shared/data \
        --out benchmarks/results/reference_markers.jsonl.gz
    python benchmarks/reference_markers.py --report benchmarks/results/reference_markers.jsonl.gz
"""

from __future__ import annotations

import argparse
import gzip
import json
import time
import warnings
from pathlib import Path

import pandas as pd
from markers_benchmark import compare
from markers_benchmark import reference as scanpy_markers
from reference_pairs import pairs

EPSILONS = (8.0, 2.0)
VARIANTS = {"no reference": None, "reference centre": False, "reference centre and types": True}
#: a further variant: the focused genes as the union of the reference types' and the first table's
UNION = "reference centre, types ∪ table"


def run_pair(name: str, reference, private, runs: int, out, union: bool = False) -> None:
    """Append one row per (variant, ε, run, group) of this pair to ``out``."""
    import dpsc

    counts = private.obs["label"].value_counts()
    cells = private[private.obs["label"].isin(counts.index[counts >= 2])].copy()
    cells.obs["label"] = cells.obs["label"].astype("category")
    truth = scanpy_markers(cells, "label")
    from dpsc.tl import _rank_genes_groups as tool

    variants = dict(VARIANTS) if not union else {UNION: True}
    for variant, with_types in variants.items():
        given = {} if with_types is None else {"reference": reference}
        if with_types:
            given["reference_key"] = "label"
        tool.REFERENCE_FOCUS = "union" if variant == UNION else "types"
        for epsilon in EPSILONS:
            for run in range(runs):
                target = cells.copy()
                start = time.perf_counter()
                dpsc.tl.rank_genes_groups(target, "label", epsilon=epsilon, n_genes=None, **given)
                seconds = time.perf_counter() - start
                spent = dpsc.privacy.get_record(target, "rank_genes_groups")["epsilon"]
                for row in compare(target.uns["rank_genes_groups"], truth):
                    base = {"pair": name, "variant": variant, "epsilon": epsilon, "run": run}
                    out.write(json.dumps({**base, "spent": spent, "seconds": seconds, **row}) + "\n")
            out.flush()


def report(path: Path) -> str:
    """Markdown: mean top-10 / top-50 overlap per pair and variant at each ε, over all pairs, and the
    focused-gene rule chosen by leave one pair out."""
    rows = pd.read_json(path, lines=True)
    variants = [v for v in [*VARIANTS, UNION] if v in set(rows["variant"])]
    lines = [
        "# Private marker genes measured from a public reference",
        "",
        "Mean over groups and runs of the overlap of each group's top-10 and top-50 genes with scanpy's",
        "non-private t-test on the same private cells (true labels as groups).",
        "Command: `python benchmarks/reference_markers.py --data ../shared/data` (module docstring).",
        "",
    ]
    for epsilon in sorted(rows["epsilon"].unique(), reverse=True):
        part = rows[rows["epsilon"] == epsilon]
        table = part.groupby(["pair", "variant"])[["top10", "top50"]].mean().unstack("variant")
        header = " | ".join(f"{v}: top-10 / top-50" for v in variants)
        lines += [f"## ε = {epsilon:g}", "", f"| pair | {header} |", "|---" * (len(variants) + 1) + "|"]
        for pair in table.index:
            cells = [
                f"{table.loc[pair, ('top10', v)]:.2f} / {table.loc[pair, ('top50', v)]:.2f}" for v in variants
            ]
            lines.append(f"| {pair} | " + " | ".join(cells) + " |")
        means = part.groupby(["pair", "variant"])[["top10", "top50"]].mean().groupby("variant").mean()
        cells = [f"**{means.loc[v, 'top10']:.2f} / {means.loc[v, 'top50']:.2f}**" for v in variants]
        lines += ["| mean over pairs | " + " | ".join(cells) + " |", ""]
    return "\n".join(
        lines + held_out(rows, [v for v in variants if v in (UNION, "reference centre and types")])
    )


def held_out(rows: pd.DataFrame, candidates: list[str]) -> list[str]:
    """Leave one pair out: the focused-gene rule with the best mean top-50 on the other pairs (both ε)."""
    if len(candidates) < 2:
        return []
    score = rows[rows["variant"].isin(candidates)].groupby(["pair", "variant"])["top50"].mean().unstack()
    base = rows[rows["variant"] == "no reference"].groupby(["pair", "epsilon"])["top50"].mean().unstack()
    lines = [
        "## Leave one pair out",
        "",
        "The rule for the focused genes with a reference's types (each type's best genes, or those and",
        "the first table's) chosen on the other pairs, scored on the pair left out (top-50 overlap).",
        "",
        "| pair left out | rule chosen | ε = 8 | ε = 2 | no reference: ε = 8 / 2 |",
        "|---|---|---|---|---|",
    ]
    held = []
    for pair in score.index:
        chosen = score.drop(index=pair).mean().idxmax()
        mine = rows[(rows["pair"] == pair) & (rows["variant"] == chosen)].groupby("epsilon")["top50"].mean()
        held.append(mine)
        without = f"{base.loc[pair, 8.0]:.2f} / {base.loc[pair, 2.0]:.2f}"
        lines.append(f"| {pair} | {chosen} | {mine[8.0]:.2f} | {mine[2.0]:.2f} | {without} |")
    mean = pd.concat(held, axis=1).mean(axis=1)
    lines += [
        f"| **mean** | | **{mean[8.0]:.2f}** | **{mean[2.0]:.2f}** | "
        f"**{base[8.0].mean():.2f} / {base[2.0].mean():.2f}** |",
        "",
    ]
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=Path("../shared/data"))
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/reference_markers.jsonl.gz"))
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--only", nargs="*", default=None, help="pair names to run")
    parser.add_argument("--union", action="store_true", help=f"run only the variant {UNION!r}")
    parser.add_argument("--report", type=Path, default=None)
    args = parser.parse_args()
    if args.report:
        print(report(args.report))
        return
    warnings.filterwarnings("ignore")
    opened = gzip.open(args.out, "at") if args.out.suffix == ".gz" else args.out.open("a")
    with opened as out:
        for name, reference, private in pairs(args.data):
            if args.only and name not in args.only:
                continue
            start = time.time()
            run_pair(name, reference, private, args.runs, out, args.union)
            print(f"{name}: {time.time() - start:.0f} s", flush=True)


if __name__ == "__main__":
    main()
