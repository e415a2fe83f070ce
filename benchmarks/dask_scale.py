"""``tl.cluster(markers=True)`` on a Dask-backed AnnData against the same cells in memory, in one run.

Cells come from ``dpsc.datasets.simulate`` (synthetic, 2,000 genes, 8 types). One process
simulates the atlas, runs an untimed warm-up, then clusters the same cells twice with the same
noise seed: from the in-memory CSR matrix, and from a Dask array of row chunks of it (Dask's
threaded scheduler, or ``--workers N`` processes of a ``dask.distributed.LocalCluster`` on
127.0.0.1). It reports each wall time, their ratio, whether the labels agree, and the peak RSS.

    cd benchmarks && OMP_NUM_THREADS=2 python dask_scale.py --cells 1000000 --out results/dask_scale.jsonl
    python dask_scale.py --report results/dask_scale.jsonl
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
import warnings
from pathlib import Path

import pandas as pd
from scale import _peak_rss_gb


def run(n_cells: int, chunk: int, workers: int, out: str) -> None:
    """Cluster ``n_cells`` simulated cells in memory and through Dask; one JSON row."""
    import dask.array as da
    import numpy as np

    import dpsc

    warm = dpsc.datasets.pbmc4k()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dpsc.tl.cluster(warm, n_clusters=8, epsilon=8, markers=True)  # untimed: first-call costs
    memory = dpsc.datasets.simulate(n_cells, random_state=0)
    lazy = memory.copy()
    lazy.X = da.from_array(memory.X, chunks=(chunk, memory.n_vars), asarray=False)
    client = None
    if workers:
        import distributed

        client = distributed.Client(
            distributed.LocalCluster(n_workers=workers, threads_per_worker=1, host="127.0.0.1")
        )
    times = {}
    for name, adata in (("memory", memory), ("dask", lazy)):
        start = time.perf_counter()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            dpsc.tl.cluster(adata, n_clusters=8, epsilon=8, markers=True, noise_seed=1)
        times[name] = time.perf_counter() - start
    if client is not None:
        client.close()
    row = {
        "cells": n_cells,
        "genes": int(memory.n_vars),
        "chunk_rows": chunk,
        "scheduler": f"LocalCluster({workers} processes)" if workers else "threaded",
        "memory_s": round(times["memory"], 1),
        "dask_s": round(times["dask"], 1),
        "dask_over_memory": round(times["dask"] / times["memory"], 2),
        "labels_equal": bool(np.array_equal(memory.obs["dp_cluster"], lazy.obs["dp_cluster"])),
        "process_peak_rss_gb": round(_peak_rss_gb(), 2),
        "threads": os.environ.get("OMP_NUM_THREADS", ""),
        "machine": platform.machine(),
        "cores": os.cpu_count(),
    }
    print(json.dumps(row))
    with open(out, "a") as f:
        f.write(json.dumps(row) + "\n")


def _table(rows: pd.DataFrame) -> str:
    """A markdown table of ``rows`` (no optional dependency)."""
    lines = ["| " + " | ".join(rows.columns) + " |", "|" + "---|" * len(rows.columns)]
    lines += ["| " + " | ".join(str(v) for v in row) + " |" for row in rows.itertuples(index=False)]
    return "\n".join(lines)


def report(path: str) -> None:
    """Print the Markdown table of the rows at ``path`` (a heading, the command and the table)."""
    rows = pd.DataFrame([json.loads(line) for line in Path(path).read_text().splitlines() if line])
    text = "\n".join(
        [
            "# The private clustering on a Dask-backed AnnData",
            "",
            "`dpsc.tl.cluster(markers=True)` at ε = 8 on cells simulated by `dpsc.datasets.simulate` (2,000 "
            "genes), once from the in-memory CSR matrix and once from a Dask array of row chunks of it, in "
            "one process with the same noise seed; `dask_over_memory` divides the two wall times. "
            "`labels_equal`: the two runs wrote the same labels.",
            "",
            "Command: `cd benchmarks && OMP_NUM_THREADS=2 python dask_scale.py --cells 1000000 "
            "--out results/dask_scale.jsonl`, then `python dask_scale.py --report results/dask_scale.jsonl`.",
            "",
            _table(rows),
            "",
        ]
    )
    print(text, end="")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cells", type=int, default=1_000_000)
    parser.add_argument("--chunk", type=int, default=50_000, help="Rows per Dask chunk.")
    parser.add_argument("--workers", type=int, default=0, help="LocalCluster worker processes (0: threads).")
    parser.add_argument("--out", default="benchmarks/results/dask_scale.jsonl")
    parser.add_argument("--report", default=None)
    args = parser.parse_args()
    if args.report:
        report(args.report)
    else:
        run(args.cells, args.chunk, args.workers, args.out)
