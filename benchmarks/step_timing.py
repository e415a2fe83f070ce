"""Time one DP step against one non-private step of DP-DCAN on PBMC 4k (same batch, same model shape).

DP and non-DP steps are interleaved, so background load affects both alike. Usage::

    python benchmarks/step_timing.py --repeats 30 --threads 2 > benchmarks/results/step_timing.md
"""

from __future__ import annotations

import argparse
import copy
import statistics
import time

import torch

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


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    adata = dpsc.datasets.pbmc4k()
    x = torch.as_tensor(adata.X[:427].toarray(), dtype=torch.float32)
    print("# DP-DCAN step time, DP vs non-private (PBMC 4k shape: 2000→256→64→32, batch 427)\n")
    print(
        f"Command: `python benchmarks/step_timing.py --repeats {args.repeats} --threads {args.threads}`; "
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


if __name__ == "__main__":
    main()
