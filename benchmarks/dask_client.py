"""The client's own cost of ``tl.cluster`` on a Dask AnnData whose cells live on the workers.

The cells are generated on the workers (``dpsc.datasets.simulate`` per row chunk, 2,000 genes,
one seed per chunk): the client never holds them. Two worker processes (one thread each) on
127.0.0.1, with the scheduler either in its own process (``--scheduler separate``:
``distributed``'s ``SubprocessCluster``, as on a real cluster) or in the client's process
(``--scheduler local``: ``distributed.LocalCluster``). One ``dpsc.tl.cluster(n_clusters=8, epsilon=8)`` per
process; the row reports the client's CPU seconds (``time.process_time``), its peak RSS
(``ru_maxrss``) and its idle RSS just before the call.

    OMP_NUM_THREADS=1 python benchmarks/dask_client.py run --cells 100000 --scheduler separate \
        --out benchmarks/results/dask_client.jsonl
    (the same with --cells 1000000, and with --scheduler local)
    python benchmarks/dask_client.py report --out benchmarks/results/dask_client.jsonl
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import time
import warnings

import numpy as np
import pandas as pd
import scipy.sparse as sp
from dask_scale import _table

GENES = 2000


def _rss_gb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20


def lazy_atlas(n_cells: int, chunk: int, model):
    """A Dask array of simulated counts whose chunks are drawn where they are computed."""
    import dask.array as da

    import dpsc

    sizes = tuple(min(chunk, n_cells - start) for start in range(0, n_cells, chunk))

    def block(block_info=None):
        index = block_info[None]["chunk-location"][0]
        cells = dpsc.datasets.simulate(sizes[index], model=model, random_state=index, n_jobs=1)
        return cells.X.tocsr().astype(np.float32)

    meta = sp.csr_matrix((0, GENES), dtype=np.float32)
    return da.map_blocks(block, chunks=(sizes, (GENES,)), dtype=np.float32, meta=meta)


def _separate_cluster(n_workers: int = 2):
    """A scheduler and ``n_workers`` single-thread workers on 127.0.0.1, each in its own process."""
    from distributed.deploy.subprocess import SubprocessCluster

    return SubprocessCluster(
        host="127.0.0.1", n_workers=n_workers, threads_per_worker=1, dashboard_address=None
    )


def run(n_cells: int, chunk: int, scheduler: str, out: str) -> None:
    """Cluster ``n_cells`` cells generated on the workers; append one JSON row to ``out``."""
    import anndata as ad
    import distributed

    import dpsc

    model = dpsc.datasets.fit_atlas_model(dpsc.datasets.pbmc4k())
    if scheduler == "separate":
        cluster = _separate_cluster()
    else:
        cluster = distributed.LocalCluster(
            n_workers=2, threads_per_worker=1, host="127.0.0.1", dashboard_address=None
        )
    client = distributed.Client(cluster)
    try:
        client.wait_for_workers(2, timeout=60)
        obs = pd.DataFrame(index=pd.RangeIndex(n_cells).astype(str))
        adata = ad.AnnData(
            lazy_atlas(n_cells, chunk, model), obs=obs, var=pd.DataFrame(index=map(str, range(GENES)))
        )
        idle = _rss_gb()
        cpu, start = time.process_time(), time.perf_counter()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            dpsc.tl.cluster(adata, n_clusters=8, epsilon=8, noise_seed=1)
        row = {
            "cells": n_cells,
            "chunk_rows": chunk,
            "scheduler": scheduler,
            "wall_s": round(time.perf_counter() - start, 1),
            "client_cpu_s": round(time.process_time() - cpu, 1),
            "client_idle_rss_gb": round(idle, 2),
            "client_peak_rss_gb": round(_rss_gb(), 2),
            "projections_lazy": type(adata.obsm["X_dp_cluster"]).__module__.startswith("dask"),
            "machine": platform.machine(),
            "cores": os.cpu_count(),
        }
    finally:
        client.close()
        cluster.close()
    with open(out, "a") as handle:
        handle.write(json.dumps(row) + "\n")
    print(row)


def report(out: str) -> None:
    """Print the Markdown table of ``out``'s rows, with the client's rise and CPU growth per scheduler."""
    rows = pd.read_json(out, lines=True).drop_duplicates(["scheduler", "cells"], keep="last")
    rows = rows.sort_values(["scheduler", "cells"])  # the latest run of each
    rows["client_rise_gb"] = (rows["client_peak_rss_gb"] - rows["client_idle_rss_gb"]).round(2)
    first = rows.groupby("scheduler")["client_cpu_s"].transform("first")
    rows["cpu_over_smallest"] = (rows["client_cpu_s"] / first).round(2)
    columns = ["cells", "chunk_rows", "scheduler", "wall_s", "client_cpu_s", "cpu_over_smallest"]
    columns += ["client_idle_rss_gb", "client_peak_rss_gb", "client_rise_gb", "projections_lazy"]
    print(_table(rows[columns]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("step", choices=("run", "report"))
    parser.add_argument("--cells", type=int, default=100_000)
    parser.add_argument("--chunk", type=int, default=20_000)
    parser.add_argument("--scheduler", choices=("separate", "local"), default="separate")
    parser.add_argument("--out", default="benchmarks/results/dask_client.jsonl")
    args = parser.parse_args()
    if args.step == "run":
        run(args.cells, args.chunk, args.scheduler, args.out)
    else:
        report(args.out)


if __name__ == "__main__":
    main()
