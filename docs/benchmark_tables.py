"""Build the tables of the benchmarks page from the committed rows at every docs build.

Each table is what one benchmark script prints from its rows file (``--report`` or its ``report``
step) and nothing else: the rows in ``benchmarks/results`` are the record, the tables are made
from them here, so a table cannot drift from its rows. The prose around a table is in the docs
page that includes it (``_generated/benchmarks/NAME.md``). A report that fails stops the build.
"""

from __future__ import annotations

import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OUT = Path(__file__).resolve().parent / "_generated" / "benchmarks"

#: Table name → the command that prints it: a script of ``benchmarks/`` and its arguments, ``R/``
#: standing for ``benchmarks/results/``.
TABLES: dict[str, str] = {
    "audit": "audit_benchmark.py --report R/audit.jsonl",
    "cluster": "cluster_benchmark.py --report R/cluster.jsonl",
    "cluster_lofo": "cluster_lofo.py --report R/cluster_lofo.jsonl.gz",
    "cluster_scale": "cluster_scale.py --report R/cluster_scale.jsonl",
    "dask_client": "dask_client.py report --out R/dask_client.jsonl",
    "dask_out_of_core": "dask_out_of_core.py report --out R/dask_out_of_core.jsonl",
    "dask_scale": "dask_scale.py --report R/dask_scale.jsonl",
    "donor_unit": "donor_unit.py --report R/donor_unit.jsonl --prior-report R/donor_unit_prior.jsonl",
    "dp_pipeline": "dp_pipeline.py --report R/dp_pipeline.jsonl",
    "dpdcan": "dpdcan_benchmark.py --report R/dpdcan.jsonl",
    "dpdcan_defaults_secret": "dpdcan_benchmark.py --report R/dpdcan_defaults_secret.jsonl",
    "dpdcan_variants_compare": "compare_runs.py R/dpdcan.jsonl R/dpdcan_variants_secret.jsonl",
    "federated": "federated_benchmark.py --report R/federated.jsonl",
    "federated_pipeline_residual": "federated_pipeline.py --report R/federated_pipeline_residual.jsonl",
    "fit_default": "fit_default.py --report R/fit_default.jsonl",
    "fit_lofo": "fit_lofo.py --report R/fit_lofo.jsonl",
    "fit_embedding_lofo": "fit_embedding_lofo.py --report R/fit_embedding_lofo.jsonl",
    "fm": "fm_benchmark.py --report R/fm.jsonl",
    "input_canary_audit": "input_canary_audit.py --report R/input_canary_audit.jsonl",
    "markers": "markers_benchmark.py --report R/markers.jsonl.gz",
    "markers_lofo": "markers_lofo.py --report R/markers_lofo.jsonl.gz",
    "one_run_audit": "one_run_audit.py --report R/one_run_audit.jsonl",
    "raw_matrix": "dpdcan_benchmark.py --report R/raw_matrix.jsonl",
    "reference_cluster_markers": "reference_cluster_markers.py --report R/reference_cluster_markers.jsonl",
    "reference_fit": "reference_fit.py --report R/reference_fit.jsonl",
    "reference_markers": "reference_markers.py --report R/reference_markers.jsonl.gz",
    "reference_names": "reference_names.py --report R/reference_names.jsonl",
    "reference_pairs": "reference_pairs.py --report R/reference_pairs.jsonl",
    "reference_scale": "reference_scale.py report --out R/reference_scale.jsonl",
    "regression": "regression_benchmark.py --report R/regression.json.gz",
    "scale": "scale.py --report R/scale.jsonl",
    "sign_digits": "sign_digits.py --report R/sign_digits.json",
    "sign_dpdcan": "dpdcan_benchmark.py --report R/sign_dpdcan.jsonl",
    "sign_dpdcan_grid_compare": (
        "compare_runs.py --by-rule R/sign_dpdcan.jsonl R/sign_dpdcan_grid_secret.jsonl"
    ),
}

#: Figure file → the command that draws it; the figure's path is added after the last argument.
FIGURES: dict[str, str] = {
    "cluster_ari.png": "cluster_benchmark.py --report R/cluster.jsonl --plot",
    "scale.png": "scale.py --report R/scale.jsonl --figure",
}


def _run(command: list[str]) -> str:
    """Return what ``benchmarks/SCRIPT ARGS…`` prints (refused, with its error, when it fails)."""
    script, *arguments = (argument.replace("R/", "benchmarks/results/", 1) for argument in command)
    done = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / script), *arguments],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env={**os.environ, "MPLBACKEND": "Agg", "OMP_NUM_THREADS": "1"},
    )
    if done.returncode != 0:
        raise RuntimeError(f"benchmark report failed: {' '.join(command)}\n{done.stderr}")
    return done.stdout


def build_tables(_app=None) -> None:
    """Write every table to ``_generated/benchmarks/NAME.md`` and every figure beside them."""
    OUT.mkdir(parents=True, exist_ok=True)
    commands = [command.split() for command in TABLES.values()]
    commands += [[*command.split(), str(OUT / name)] for name, command in FIGURES.items()]
    with ThreadPoolExecutor(max_workers=2) as pool:
        printed = list(pool.map(_run, commands))
    for name, text in zip(TABLES, printed, strict=False):
        (OUT / f"{name}.md").write_text(text.rstrip("\n") + "\n")


def setup(app) -> dict:
    """Sphinx hook: the tables are built before the pages are read."""
    app.connect("builder-inited", build_tables)
    return {"parallel_read_safe": True}
