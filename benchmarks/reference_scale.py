"""``tl.cluster(reference=...)`` with a large public reference: the basis's time and memory, and its reuse.

Steps, each its own process (peak RSS is the process's own ``ru_maxrss``):

``write``: a reference of ``--cells`` cells simulated by ``dpsc.datasets.simulate`` (synthetic,
PBMC 4k atlas model, 2,000 genes, ``obs["cell_type"]``), written to an ``.h5ad`` file.

``cluster``: 4,271 private cells (the embedded PBMC 4k, whose genes the simulation shares) are
clustered with ``dpsc.tl.cluster(n_clusters=8, epsilon=8, reference=PATH,
reference_key="cell_type")``. The row reports the call's wall time, the time of the reference's
basis alone (:meth:`PublicReference.basis`, timed in the same process before the call), the
process's peak RSS, and the ARI of the private labels against the PBMC types.

``prepare``: ``dpsc.tl.prepare_reference(PATH, pbmc4k, FOLDER, reference_key="cell_type")``: its time,
peak RSS and the folder's size.

``reuse``: the same clustering with ``reference=FOLDER``: its time and peak RSS; then, in the same
process, the clustering with ``reference=PATH``, both at ``noise_seed=0``, and whether the two
give the same labels (the seed only makes the two runs comparable).

``fit``: ``dpsc.tl.fit(pbmc4k, n_clusters=8, epsilon=8, reference=FOLDER, reference_key="cell_type",
reference_model=DIR)`` twice in one process on a new ``DIR``: the first call pretrains the model on
the reference's points (at most ``dpsc.model._dcan_reference.PRETRAIN_MAX_CELLS`` of them) and
saves it, the second loads it. Each call's time, the process's peak RSS and each call's ARI.

    OMP_NUM_THREADS=2 python benchmarks/reference_scale.py write --cells 1000000 --h5ad /tmp/ref.h5ad
    OMP_NUM_THREADS=2 python benchmarks/reference_scale.py cluster --h5ad /tmp/ref.h5ad \
        --out benchmarks/results/reference_scale.jsonl
    OMP_NUM_THREADS=2 python benchmarks/reference_scale.py prepare --h5ad /tmp/ref.h5ad --folder /tmp/ref.prep
    OMP_NUM_THREADS=2 python benchmarks/reference_scale.py reuse --h5ad /tmp/ref.h5ad --folder /tmp/ref.prep
    OMP_NUM_THREADS=2 python benchmarks/reference_scale.py fit --h5ad /tmp/ref.h5ad --folder /tmp/ref.prep
    python benchmarks/reference_scale.py report --out benchmarks/results/reference_scale.jsonl
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import time
import warnings

import pandas as pd
from dask_scale import _table


def _peak_gb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20


def write(n_cells: int, path: str) -> None:
    """Simulate the reference and write it."""
    import dpsc

    start = time.perf_counter()
    reference = dpsc.datasets.simulate(n_cells, random_state=7)
    reference.write_h5ad(path)
    seconds = round(time.perf_counter() - start, 1)
    print({"cells": n_cells, "write_s": seconds, "peak_rss_gb": round(_peak_gb(), 2)})


def cluster(path: str, out: str) -> None:
    """Time the basis, then the whole call; append one JSON row."""
    import anndata as ad
    from sklearn.metrics import adjusted_rand_score

    import dpsc
    from dpsc._public_reference import read_reference  # the reference alone, to time its basis

    private = dpsc.datasets.pbmc4k()
    start = time.perf_counter()
    reference = read_reference(path, private, "cell_type", "benchmark")
    read_s = time.perf_counter() - start
    counts = "backed" if type(reference.counts).__module__.startswith("anndata") else "in memory"
    start = time.perf_counter()
    reference.basis(markers=False)
    basis_s = time.perf_counter() - start
    del reference
    start = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dpsc.tl.cluster(private, n_clusters=8, epsilon=8, reference=path, reference_key="cell_type")
    row = {
        "reference_cells": ad.read_h5ad(path, backed="r").n_obs,
        "read_s": round(read_s, 1),
        "basis_s": round(basis_s, 1),
        "cluster_s": round(time.perf_counter() - start, 1),
        "peak_rss_gb": round(_peak_gb(), 2),
        "ari": round(adjusted_rand_score(private.obs["cell_type"], private.obs["dp_cluster"]), 3),
        "counts": counts,
        "threads": os.environ.get("OMP_NUM_THREADS"),
        "machine": platform.machine(),
        "cores": os.cpu_count(),
    }
    with open(out, "a") as handle:
        handle.write(json.dumps(row) + "\n")
    print(row)


def _append(out: str, row: dict) -> None:
    row |= {"threads": os.environ.get("OMP_NUM_THREADS"), "machine": platform.machine()}
    row["cores"] = os.cpu_count()
    with open(out, "a") as handle:
        handle.write(json.dumps(row) + "\n")
    print(row)


def _cells(path: str) -> int:
    import anndata as ad

    return ad.read_h5ad(path, backed="r").n_obs


def prepare(path: str, folder: str, out: str) -> None:
    """Time ``prepare_reference``; append one JSON row."""
    from pathlib import Path

    import dpsc

    private = dpsc.datasets.pbmc4k()
    start = time.perf_counter()
    dpsc.tl.prepare_reference(path, private, folder, reference_key="cell_type", overwrite=True)
    seconds = time.perf_counter() - start
    size = sum(f.stat().st_size for f in Path(folder).iterdir()) / 2**20
    row = {"step": "prepare", "reference_cells": _cells(path), "prepare_s": round(seconds, 1)}
    _append(out, row | {"peak_rss_gb": round(_peak_gb(), 2), "folder_mb": round(size)})


def reuse(path: str, folder: str, out: str) -> None:
    """Time the clustering on the prepared folder, then compare its labels with the reference's own."""
    import dpsc

    labels = []
    for source in (folder, path):
        private = dpsc.datasets.pbmc4k()
        start = time.perf_counter()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            dpsc.tl.cluster(
                private, n_clusters=8, epsilon=8, reference=source, reference_key="cell_type", noise_seed=0
            )
        if source == folder:
            seconds, peak = time.perf_counter() - start, _peak_gb()
        labels.append(private.obs["dp_cluster"].astype(str).to_numpy())
    row = {"step": "reuse", "reference_cells": _cells(path), "reuse_s": round(seconds, 1)}
    _append(out, row | {"peak_rss_gb": round(peak, 2), "same_labels": bool((labels[0] == labels[1]).all())})


def fit(path: str, folder: str, out: str) -> None:
    """Time ``tl.fit`` on the prepared folder: pretraining and saving the model, then reusing it."""
    import tempfile

    from sklearn.metrics import adjusted_rand_score

    import dpsc

    seconds, aris = [], []
    with tempfile.TemporaryDirectory() as model:
        for _ in range(2):
            private = dpsc.datasets.pbmc4k()
            start = time.perf_counter()
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                dpsc.tl.fit(
                    private,
                    n_clusters=8,
                    epsilon=8,
                    reference=folder,
                    reference_key="cell_type",
                    reference_model=model,
                    progress_bar=False,
                )
            seconds.append(round(time.perf_counter() - start, 1))
            aris.append(round(adjusted_rand_score(private.obs["cell_type"], private.obs["dp_cluster"]), 3))
    row = {"step": "fit", "reference_cells": _cells(path), "pretrain_fit_s": seconds[0], "fit_s": seconds[1]}
    _append(out, row | {"peak_rss_gb": round(_peak_gb(), 2), "ari": aris})


def report(out: str) -> None:
    """Print the Markdown tables of ``out``'s rows: the call on the reference, then its reuse."""
    rows = pd.read_json(out, lines=True).sort_values("reference_cells")
    rows["step"] = rows.get("step", pd.Series(index=rows.index, dtype=object)).fillna("cluster")
    rows["counts"] = rows.get("counts", pd.Series(index=rows.index, dtype=object)).fillna("in memory")
    rows = rows.drop_duplicates(["step", "reference_cells", "counts"], keep="last")
    columns = ["reference_cells", "counts", "read_s", "basis_s", "cluster_s", "peak_rss_gb", "ari"]
    columns += ["threads", "cores"]
    print(_table(rows[rows["step"] == "cluster"][columns]))
    latest = rows.drop_duplicates(["step", "reference_cells"], keep="last")
    prepared = latest[latest["step"] == "prepare"].set_index("reference_cells")
    reused = latest[latest["step"] == "reuse"].set_index("reference_cells")
    if len(prepared) and len(reused):
        both = prepared[["prepare_s", "peak_rss_gb", "folder_mb"]].join(
            reused[["reuse_s", "peak_rss_gb", "same_labels"]], rsuffix="_reuse"
        )
        both = both.round(2).astype({"folder_mb": int, "same_labels": bool})
        print()
        print(_table(both.reset_index()))
    fits = latest[latest["step"] == "fit"]
    if len(fits):
        print()
        fits = fits.assign(ari=fits["ari"].map(lambda runs: " / ".join(f"{a:.3f}" for a in runs)))
        print(_table(fits[["reference_cells", "pretrain_fit_s", "fit_s", "peak_rss_gb", "ari"]].round(2)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("step", choices=("write", "cluster", "prepare", "reuse", "fit", "report"))
    parser.add_argument("--cells", type=int, default=100_000)
    parser.add_argument("--h5ad", default="/tmp/reference.h5ad")
    parser.add_argument("--folder", default="/tmp/reference.prepared")
    parser.add_argument("--out", default="benchmarks/results/reference_scale.jsonl")
    args = parser.parse_args()
    if args.step == "write":
        write(args.cells, args.h5ad)
    elif args.step == "cluster":
        cluster(args.h5ad, args.out)
    elif args.step == "prepare":
        prepare(args.h5ad, args.folder, args.out)
    elif args.step == "reuse":
        reuse(args.h5ad, args.folder, args.out)
    elif args.step == "fit":
        fit(args.h5ad, args.folder, args.out)
    else:
        report(args.out)


if __name__ == "__main__":
    main()
