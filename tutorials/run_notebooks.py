"""Run the tutorial notebooks top to bottom and save them with readable outputs.

The notebooks (``tutorials/*.ipynb``) are the tutorials' source: edit them in Jupyter. ``python
tutorials/run_notebooks.py [NAME ...]`` runs the named notebooks (default: all) in ``tutorials/``
with nbclient, as the committed outputs were made (full data; set ``OMP_NUM_THREADS`` to time
them), keeping readable outputs: one stderr block per cell, the last state of each progress line,
no Lightning log lines. With ``DPSC_TUTORIAL_FAST=1`` (small data) the notebooks run but are not
saved, so the committed outputs stay those of full runs.
"""

from __future__ import annotations

import argparse
import os
import re
from pathlib import Path

import nbformat as nbf

HERE = Path(__file__).parent
NOTEBOOKS = sorted(p.name for p in HERE.glob("[0-9][0-9]_*.ipynb"))
#: Lightning's per-fit log lines (accelerator summary, model summary table) in a cell's stderr.
LIGHTNING_LOG = re.compile(
    r"^(GPU available|TPU available|HPU available|IPU available|LOCAL_RANK|`Trainer|You are using|Trainer |"
    r"Missing logger folder|  \| Name|----|\d+ +\S+ +\| |.*Total params|.*Trainable params|"
    r".*Non-trainable params|.*Total estimated|.*Modules in)"
)


def tidy_stderr(cell) -> None:
    """Merge a cell's stderr chunks, keep each progress line's last state, drop Lightning's log."""
    outputs = []
    for out in cell.get("outputs", []):
        if out.output_type == "stream" and out.name == "stderr" and outputs:
            last = outputs[-1]
            if last.output_type == "stream" and last.name == "stderr":
                last.text += out.text
                continue
        outputs.append(out)
    kept = []
    for out in outputs:
        if out.output_type == "stream" and out.name == "stderr":
            lines = [line.split("\r")[-1] for line in out.text.split("\n")]
            out.text = "\n".join(line for line in lines if not LIGHTNING_LOG.match(line))
            if not out.text.strip():
                continue
        kept.append(out)
    cell.outputs = kept


def execute(name: str, timeout: int = 1800) -> None:
    """Run a notebook top to bottom in this folder and save it with tidy outputs."""
    from nbclient import NotebookClient

    nb = nbf.read(HERE / name, as_version=4)
    NotebookClient(
        nb, timeout=timeout, kernel_name="python3", resources={"metadata": {"path": str(HERE)}}
    ).execute()
    for cell in nb.cells:
        if cell.cell_type == "code":
            tidy_stderr(cell)
    if os.environ.get("DPSC_TUTORIAL_FAST") == "1":  # the committed outputs come from full runs only
        print(f"{name}: fast mode, outputs not saved")
        return
    nbf.write(nb, HERE / name)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="*", metavar="NAME", help="notebooks to run (default: all)")
    args = parser.parse_args()
    unknown = sorted(set(args.names) - set(NOTEBOOKS))
    if unknown:
        parser.error(f"unknown notebooks {unknown}; choose from {NOTEBOOKS}")
    for name in args.names or NOTEBOOKS:
        execute(name)
        print(f"{name}: executed")
