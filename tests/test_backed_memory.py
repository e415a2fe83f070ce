"""``tl.annotate``, ``tl.private_regression`` and ``tl.audit`` stream a backed 10⁵-cell AnnData.

Each tool runs in its own process: first once on 2,000 in-memory cells (so that every import and
model is warm), then, with the peak resident size reset (``/proc/self/clear_refs``), on a
``backed="r"`` file of 10⁵ cells × 2,000 genes (sparse, 1 % non-zero). One dense copy of that
matrix takes 800 MB in float32 (1.6 GB in float64); the test allows 400 MB above the resident
size before the call and prints each peak. The audit runs with its default Poisson batches of
10 % of the cells (10⁴ here), which the DP-SGD loop takes in chunks of
``dpsc.privacy._engine.MAX_PHYSICAL_BATCH`` cells, so only one chunk's activations are in memory.
"""

import json
import subprocess
import sys
import textwrap

import anndata as ad
import numpy as np
import pandas as pd
import pytest
import scipy.sparse as sp

N_CELLS, N_GENES = 100_000, 2_000
ALLOWED_MB = 400

SCRIPT = textwrap.dedent(
    """
    import json, sys, warnings
    warnings.simplefilter("ignore")
    import anndata as ad
    import dpsc, dpsc.tl

    def status_mb(field):
        with open("/proc/self/status") as status:
            return int(next(row for row in status if row.startswith(field)).split()[1]) / 1024

    def run(adata, tool):
        if tool == "annotate":
            dpsc.tl.annotate(adata[:500].to_memory(), adata, "cell_type", epsilon=8, epochs=1)
        elif tool == "regression":
            genes = list(adata.var_names[:10])
            dpsc.tl.private_regression(
                adata, "response", epsilon=8, genes=genes, y_center=0.0, y_scale=1.0
            )
        else:
            dpsc.tl.audit(adata, method="one_run", epsilon=8, epochs=1, n_canaries=200)

    path, tool = sys.argv[1], sys.argv[2]
    run(ad.read_h5ad(path, backed="r")[:2000].to_memory(), tool)
    with open("/proc/self/clear_refs", "w") as refs:
        refs.write("5")  # the peak (VmHWM) starts again from the current resident size
    before = status_mb("VmRSS")
    run(ad.read_h5ad(path, backed="r"), tool)
    print(json.dumps({"tool": tool, "before_mb": before, "peak_mb": status_mb("VmHWM")}))
    """
)


@pytest.fixture(scope="module")
def backed_file(tmp_path_factory):
    rng = np.random.default_rng(0)
    counts = sp.random(N_CELLS, N_GENES, density=0.01, format="csr", random_state=0, dtype=np.float32)
    counts.data = rng.integers(1, 20, counts.nnz).astype(np.float32)
    adata = ad.AnnData(counts)
    adata.obs_names = [f"c{i}" for i in range(N_CELLS)]
    adata.var_names = [f"g{j}" for j in range(N_GENES)]
    adata.obs["cell_type"] = pd.Categorical(rng.choice(["a", "b", "c"], N_CELLS))
    adata.obs["response"] = rng.normal(size=N_CELLS)
    path = tmp_path_factory.mktemp("backed") / "cells.h5ad"
    adata.write_h5ad(path)
    return path


@pytest.mark.slow
@pytest.mark.parametrize("tool", ["annotate", "regression", "audit"])
def test_tool_streams_a_backed_matrix(backed_file, tmp_path, tool):
    script = tmp_path / "run.py"
    script.write_text(SCRIPT)
    done = subprocess.run(
        [sys.executable, str(script), str(backed_file), tool], capture_output=True, text=True, timeout=900
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    print(result)
    assert result["peak_mb"] - result["before_mb"] < ALLOWED_MB
