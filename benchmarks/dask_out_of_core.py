"""``tl.cluster(markers=True)`` out of core: simulated cells written once to zarr, read lazily by Dask.

Two steps, each its own process (peak RSS is the process's own ``ru_maxrss``):

``write``: ``dpsc.datasets.simulate`` draws the cells in pieces (one seed per piece, one atlas
model); the first piece is written as an AnnData to zarr and every later piece is appended to
its sparse ``X`` on disk (``anndata.io.sparse_dataset(...).append``), so no step holds more than
one piece. ``obs["cell_type"]`` is written last.

``cluster``: ``X`` is read lazily (``dpsc.datasets.read_zarr``, row chunks), ``obs``
and ``var`` in memory; one ``dpsc.tl.cluster(n_clusters=8, epsilon=8, markers=True)`` on Dask's
threaded scheduler. It reports the wall time, the peak RSS and the ARI against the simulated types.
With ``--workers 2`` the same call runs on a ``dask.distributed`` cluster on 127.0.0.1 (a
scheduler process and two single-thread worker processes, as ``benchmarks/dask_client.py`` starts
them), then ``dpsc.tl.rank_genes_groups(adata, "dp_cluster", epsilon=2)``; the row adds the
markers' time and the peak RSS of the workers and of the scheduler.

    OMP_NUM_THREADS=2 python benchmarks/dask_out_of_core.py write --cells 10000000 --zarr /tmp/atlas.zarr
    OMP_NUM_THREADS=2 python benchmarks/dask_out_of_core.py cluster --zarr /tmp/atlas.zarr \
        --out benchmarks/results/dask_out_of_core.jsonl
    OMP_NUM_THREADS=1 python benchmarks/dask_out_of_core.py cluster --zarr /tmp/atlas.zarr --workers 2 \
        --out benchmarks/results/dask_out_of_core.jsonl
    python benchmarks/dask_out_of_core.py report --out benchmarks/results/dask_out_of_core.jsonl
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import time
import warnings
from pathlib import Path

import numpy as np
import pandas as pd
from dask_scale import _table
from scale import _peak_rss_gb


def _disk_gb(path: Path) -> float:
    out = subprocess.run(["du", "-sb", str(path)], capture_output=True, text=True, check=True).stdout
    return int(out.split()[0]) / 2**30


def _group(path: Path):
    """The zarr group at ``path``, read and written without its (stale) consolidated metadata."""
    import zarr

    return zarr.open_group(str(path), mode="r+", use_consolidated=False)


def write(n_cells: int, zarr_path: str, piece: int) -> None:
    """Simulate ``n_cells`` cells piece by piece into a zarr AnnData at ``zarr_path``."""
    import anndata as ad
    import zarr

    import dpsc
    from dpsc.datasets import fit_atlas_model

    path = Path(zarr_path)
    if path.exists():
        shutil.rmtree(path)
    model = fit_atlas_model(dpsc.datasets.pbmc4k())
    start = time.perf_counter()
    codes, categories = [], None
    for index, first in enumerate(range(0, n_cells, piece)):
        cells = dpsc.datasets.simulate(min(piece, n_cells - first), model=model, random_state=index)
        categories = list(cells.obs["cell_type"].cat.categories)
        codes.append(cells.obs["cell_type"].cat.codes.to_numpy().astype(np.int8))
        if index == 0:
            ad.AnnData(X=cells.X, var=cells.var).write_zarr(path)
        else:
            ad.io.sparse_dataset(_group(path)["X"]).append(cells.X)
        print(f"{first + cells.n_obs:,} cells written, {time.perf_counter() - start:.0f} s", flush=True)
    obs = pd.DataFrame(
        {"cell_type": pd.Categorical.from_codes(np.concatenate(codes), categories)},
        index=pd.RangeIndex(n_cells).astype(str),
    )
    group = _group(path)
    del group["obs"]
    ad.io.write_elem(group, "obs", obs)
    zarr.consolidate_metadata(str(path))
    row = {
        "step": "write",
        "cells": n_cells,
        "write_s": round(time.perf_counter() - start, 1),
        "zarr_gb": round(_disk_gb(path), 2),
        "peak_rss_gb": round(_peak_rss_gb(), 2),
    }
    print(json.dumps(row))
    (path.parent / (path.name + ".write.json")).write_text(json.dumps(row))


def _worker_peaks_gb(client) -> tuple[float, float]:
    """The largest peak RSS among the workers, and the scheduler's (each its own ``ru_maxrss``)."""

    def peak_gb() -> float:  # defined here: sent by value to processes that cannot import this script
        import resource

        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024**2

    workers = client.run(peak_gb)
    return max(workers.values()), client.run_on_scheduler(peak_gb)


def cluster(zarr_path: str, chunk: int, out: str, workers: int = 0) -> None:
    """Cluster the zarr AnnData out of core (on ``workers`` processes if > 0); append one JSON row."""
    from sklearn.metrics import adjusted_rand_score

    import dpsc

    cluster, client = None, None
    if workers:
        import distributed
        from dask_client import _separate_cluster

        cluster = _separate_cluster(workers)
        client = distributed.Client(cluster)
        client.wait_for_workers(workers, timeout=60)
    try:
        adata = dpsc.datasets.read_zarr(zarr_path, chunk=chunk)
        start = time.perf_counter()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            dpsc.tl.cluster(adata, n_clusters=8, epsilon=8, markers=True)
        seconds = time.perf_counter() - start
        row = {"cells": int(adata.n_obs), "genes": int(adata.n_vars), "chunk_rows": chunk}
        row["scheduler"] = f"distributed, {workers} workers" if workers else "threaded"
        written = Path(zarr_path).parent / (Path(zarr_path).name + ".write.json")
        if written.exists():
            row |= {k: v for k, v in json.loads(written.read_text()).items() if k != "step"}
        row["cluster_s"] = round(seconds, 1)
        row["cluster_peak_rss_gb"] = round(_peak_rss_gb(), 2)
        row["ari"] = round(float(adjusted_rand_score(adata.obs["cell_type"], adata.obs["dp_cluster"])), 3)
        row["clusters_in_use"] = int(adata.uns["dpsc"]["dp_cluster"]["clusters_in_use"])
        row["epsilon"] = round(float(dpsc.privacy.get_record(adata, "dp_cluster")["epsilon"]), 3)
        if client is not None:
            start = time.perf_counter()
            dpsc.tl.rank_genes_groups(adata, "dp_cluster", epsilon=2)
            row["markers_s"] = round(time.perf_counter() - start, 1)
            row["worker_peak_rss_gb"], row["scheduler_peak_rss_gb"] = map(
                lambda gb: round(gb, 2), _worker_peaks_gb(client)
            )
            row["client_peak_rss_gb"] = round(_peak_rss_gb(), 2)
    finally:
        if client is not None:
            client.close()
            cluster.close()
    row |= {"threads": os.environ.get("OMP_NUM_THREADS", ""), "machine": platform.machine()}
    row["cores"] = os.cpu_count()
    print(json.dumps(row))
    with open(out, "a") as f:
        f.write(json.dumps(row) + "\n")


def report(out: str) -> None:
    """Print the Markdown table of the rows in ``out``."""
    rows = pd.DataFrame([json.loads(line) for line in Path(out).read_text().splitlines() if line])
    rows["scheduler"] = rows.get("scheduler", pd.Series(index=rows.index, dtype=object)).fillna("threaded")
    rows["epsilon"] = rows["epsilon"].round(3)
    columns = ["cells", "genes", "chunk_rows", "scheduler", "write_s", "zarr_gb", "peak_rss_gb", "cluster_s"]
    columns += ["cluster_peak_rss_gb", "markers_s", "worker_peak_rss_gb", "scheduler_peak_rss_gb", "ari"]
    columns += ["clusters_in_use", "epsilon", "threads", "cores"]
    rows = rows.reindex(columns=columns).astype(object).where(lambda r: r.notna(), "–")
    text = "\n".join(
        [
            "# The private clustering out of core (zarr on disk, Dask)",
            "",
            "Cells simulated by `dpsc.datasets.simulate` (2,000 genes, 8 types) written once to zarr "
            "piece by piece, then `dpsc.tl.cluster(n_clusters=8, epsilon=8, markers=True)` on `X` read "
            "lazily, on Dask's threaded scheduler (2 cores) or on a `dask.distributed` cluster on "
            "127.0.0.1 (a scheduler process and two single-thread worker processes; the row then adds "
            "`dpsc.tl.rank_genes_groups(epsilon=2)`, `markers_s`). `write_s`, `zarr_gb`, `peak_rss_gb`: "
            "the writing process; `cluster_s`, `cluster_peak_rss_gb`: the clustering process (its "
            "`ru_maxrss`; with distributed, the client), `worker_peak_rss_gb` the larger worker's and "
            "`scheduler_peak_rss_gb` the scheduler's. Each clustering ran alone on the machine; the first "
            "writing shared it with other jobs, so its `write_s` is an upper bound. No process holds the "
            "matrix: row chunks, partial sums, `obs` and the labels.",
            "",
            "Commands: see the docstring of `benchmarks/dask_out_of_core.py` (`write`, `cluster`, `report`).",
            "",
            _table(rows),
            "",
        ]
    )
    print(text, end="")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("step", choices=["write", "cluster", "report"])
    parser.add_argument("--cells", type=int, default=10_000_000)
    parser.add_argument("--piece", type=int, default=250_000, help="Cells simulated and appended at once.")
    parser.add_argument("--chunk", type=int, default=100_000, help="Rows per Dask chunk.")
    parser.add_argument("--zarr", default="/tmp/dpsc_atlas.zarr")
    parser.add_argument("--workers", type=int, default=0, help="Worker processes (0: threaded scheduler).")
    parser.add_argument("--out", default="benchmarks/results/dask_out_of_core.jsonl")
    args = parser.parse_args()
    if args.step == "write":
        write(args.cells, args.zarr, args.piece)
    elif args.step == "cluster":
        cluster(args.zarr, args.chunk, args.out, args.workers)
    else:
        report(args.out)
