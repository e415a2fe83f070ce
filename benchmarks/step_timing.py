"""Time one DP step against one non-private step of DP-DCAN on PBMC 4k, and a fit on one or two processes.

DP and non-DP steps are interleaved, so background load affects both alike. With ``--ddp`` a whole
``dpsc.tl.fit(epsilon=8)`` on PBMC 4k runs on one process (``--threads`` threads), then data-parallel
on two CPU processes (Lightning's DDP over gloo, one thread each, started as ``torchrun`` would); the
table gives each wall time and what each fit's record says (σ, q, steps, ε). Usage::

    python benchmarks/step_timing.py --repeats 30 --threads 2 --ddp > benchmarks/results/step_timing.md
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import socket
import statistics
import tempfile
import time
import warnings
from pathlib import Path

import torch
import torch.multiprocessing as mp

import dpsc
from dpsc.module import DCANModule
from dpsc.privacy import DPSGDSettings, NoiseSource, make_accountant
from dpsc.train import DCANTrainingPlan


def make_plan(module: DCANModule, stage: str, private: bool) -> DCANTrainingPlan:
    dp = None
    if private:
        dp = DPSGDSettings(
            noise_multiplier=2.0,
            max_grad_norm=0.1,
            sample_rate=0.1,
            expected_batch_size=427,
            accountant=make_accountant("rdp"),
            noise=NoiseSource(0),  # repeatable timing runs: no guarantee against this seed
        )
    plan = DCANTrainingPlan(
        module, stage=stage, dp=dp, optimizer="adam", lr=1e-3, private_optimizer="sgd", private_lr=0.1
    )
    plan.attach_privacy()
    return plan


#: The fit timed on one and on two processes (everything else at ``tl.fit``'s defaults).
FIT = {"epsilon": 8, "accelerator": "cpu", "progress_bar": False}
#: What the table reads of each fit's record.
RECORD = ("noise_multiplier", "sample_rate", "steps", "epsilon")


def _timed_fit(out: Path, **extra) -> None:
    """Run ``tl.fit`` on PBMC 4k, write its wall time, record and ARI to ``out``."""
    from sklearn.metrics import adjusted_rand_score

    adata = dpsc.datasets.pbmc4k()
    start = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dpsc.tl.fit(adata, **FIT, **extra)
    seconds = time.perf_counter() - start
    record = dpsc.privacy.get_record(adata, "X_dpdcan")
    ari = adjusted_rand_score(adata.obs["cell_type"], adata.obs["dp_cluster"])
    out.write_text(json.dumps({"seconds": seconds, "ari": ari, **{k: record[k] for k in RECORD}}))


def _ddp_rank(rank: int, port: int, folder: str) -> None:
    """One of two processes of a data-parallel fit, launched outside Lightning as ``torchrun`` does."""
    os.environ.update(
        MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), LOCAL_RANK=str(rank), NODE_RANK="0", WORLD_SIZE="2"
    )
    torch.set_num_threads(1)
    _timed_fit(Path(folder, f"rank{rank}.json"), devices=2, strategy="ddp")


def ddp_table(threads: int) -> None:
    """Print one fit on one process against the same fit on two DDP processes."""
    with tempfile.TemporaryDirectory() as folder:
        torch.set_num_threads(threads)
        _timed_fit(Path(folder, "one.json"))
        with socket.socket() as free:
            free.bind(("127.0.0.1", 0))
            port = free.getsockname()[1]
        mp.spawn(_ddp_rank, args=(port, folder), nprocs=2, join=True)
        one = json.loads(Path(folder, "one.json").read_text())
        ranks = [json.loads(Path(folder, f"rank{r}.json").read_text()) for r in range(2)]
    print(
        f"\n## `tl.fit` on one process and data-parallel on two (PBMC 4k, ε = 8)\n\n"
        f"One process at {threads} threads, then two processes of one thread each (Lightning's DDP "
        "over gloo on 127.0.0.1, both on this machine's cores); wall time of the whole `tl.fit` "
        "call (its clustering start included), the slower rank for DDP. Secret noise, one run each.\n"
    )
    print("| run | wall s | σ | q | steps | ε | ARI |\n|---|---|---|---|---|---|---|")
    rows = [("1 process", one), *((f"DDP rank {r}", ranks[r]) for r in range(2))]
    for name, row in rows:
        print(
            f"| {name} | {row['seconds']:.1f} | {row['noise_multiplier']:.4g} | {row['sample_rate']:.4g} "
            f"| {row['steps']} | {row['epsilon']:.3f} | {row['ari']:.3f} |"
        )
    slower = max(r["seconds"] for r in ranks)
    print(f"\nDDP wall time against one process: {slower / one['seconds']:.2f}.")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--ddp", action="store_true", help="also time a whole fit on one and two processes")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    adata = dpsc.datasets.pbmc4k()
    x = torch.as_tensor(adata.X[:427].toarray(), dtype=torch.float32)
    print("# DP-DCAN step time, DP vs non-private (PBMC 4k shape: 2000→256→64→32, batch 427)\n")
    print(
        f"Command: `python benchmarks/step_timing.py --repeats {args.repeats} --threads {args.threads}"
        f"{' --ddp' if args.ddp else ''}`; "
        f"torch {torch.__version__}, {args.threads} threads, median of {args.repeats} interleaved steps.\n"
    )
    print("| stage | non-private ms | DP (ghost clipping) ms | ratio |\n|---|---|---|---|")
    for stage in ("instance", "cluster"):
        torch.manual_seed(0)
        module = DCANModule(n_input=adata.n_vars)
        twin = copy.deepcopy(module)  # same weights, no Opacus hooks on it
        plain, private = make_plan(twin, stage, False), make_plan(module, stage, True)
        times = {"plain": [], "dp": []}
        for i in range(args.repeats + 3):
            for name, plan in (("plain", plain), ("dp", private)):
                start = time.perf_counter()
                loss, _ = plan.per_cell_loss(x)
                plan.plain_step(loss) if name == "plain" else plan.private_step(loss)
                elapsed = time.perf_counter() - start
                if i >= 3:  # warm-up
                    times[name].append(elapsed)
        p, d = statistics.median(times["plain"]), statistics.median(times["dp"])
        print(f"| {stage} | {1000 * p:.0f} | {1000 * d:.0f} | {d / p:.2f} |")
        private.detach_privacy()
    if args.ddp:
        ddp_table(args.threads)


if __name__ == "__main__":
    main()
