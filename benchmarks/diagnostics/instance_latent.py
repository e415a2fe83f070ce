r"""How good is the private instance-stage latent? Averaged iterates, instance epochs, view pairs.

Three levers on the latent that the DP k-means start and the cluster stage work from, all free
of extra privacy cost: averaging the encoder's iterates, the number of instance epochs (at the
same ε, σ is recalibrated for the fit's total steps), and the number of masked view pairs per
cell (augmentation multiplicity, ``--view-pairs``, below).

DP-SGD's guarantee covers the whole sequence of noisy iterates, so any average of them is
post-processing and costs no privacy (De et al. 2022 use an exponential moving average of the
weights for DP image classifiers). An average inherits exactly the fit's guarantee, including
the caveat that the fit's statement makes for ``scope="encoder"`` (the encoder's gradients pass
through the decoder, which trains without noise). This diagnostic runs the private instance stage of a default
DP-DCAN fit (σ of the full fit's steps, as in ``dp_kmeans_start.py --latent default``; with
``--instance-epochs E`` the full fit has E instance epochs instead of 50) once per seed and,
during it, keeps bias-corrected exponential moving averages of the encoder weights (as Adam
corrects its moments, Kingma & Ba 2015, Alg. 1),

    m_t = d m_{t-1} + (1 − d) θ_t,  m_0 = 0,   θ̄_t = m_t / (1 − d^t),

for several decays d (d = 0.99 averages over about the last 100 steps, 10 epochs at q = 0.1).
Each latent (last iterate and every average) is scored by non-private k-means against the
labels (ARI): the ceiling that the DP k-means start and the cluster stage work from. Labels are
used for scoring only.

Augmentation multiplicity (De et al. 2022): with ``--view-pairs K`` every cell's
instance loss is the mean over K independent pairs of masked views,
:math:`L_i = \rho L^{\mathrm{ZINB}}_i + (1-\rho) \frac1K \sum_k L^{\mathrm{ins}}_i(v^{(2k-1)}_i,
v^{(2k)}_i)`, so the cell's gradient averages its own K draws of the masks before clipping. It is
still one cell's loss, so the sensitivity and the privacy cost are unchanged. As in
:meth:`dpsc.module.DCANModule.instance_stage_loss`, the clean view and all 2K masked views go
through the encoder as one tensor (one forward pass per step, which the ghost clipping needs).

Usage (from the repo root)::

    python benchmarks/diagnostics/instance_latent.py --data ../shared/data --seeds 0 1 2 --epsilon 8 \
        --out benchmarks/results/instance_latent.jsonl
    python benchmarks/diagnostics/instance_latent.py --data ../shared/data --seeds 0 1 2 --epsilon 8 \
        --instance-epochs 100 --out benchmarks/results/instance_latent.jsonl
    python benchmarks/diagnostics/instance_latent.py --data ../shared/data --seeds 0 1 2 3 --epsilon 4 \
        --view-pairs 4 --out benchmarks/results/instance_latent.jsonl
    python benchmarks/diagnostics/instance_latent.py --report benchmarks/results/instance_latent.jsonl
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
from contextlib import contextmanager
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parents[1]))  # benchmarks/
sys.path.insert(0, str(Path(__file__).parent))  # diagnostics/
from dp_kmeans_start import instance_only_sketch
from dpdcan_benchmark import load

DECAYS = (0.9, 0.98, 0.99, 0.995)
FIRST_HOST = "first dev machine"  # rows written before the script recorded its host


def cpu_model() -> str:
    """The CPU's model name (Linux), else the platform's machine type."""
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.exists():
        for line in cpuinfo.read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.machine()


@contextmanager
def view_pairs(n_pairs: int):
    """Within the block, the instance-stage loss averages ``n_pairs`` masked view pairs per cell."""
    import torch

    from dpsc.module import DCANModule, _dcan
    from dpsc.module._losses import instance_loss_per_cell

    def multiplied(self, x, *, rho, mask_rate, generator=None):
        x = _dcan.clean_input(x, self.likelihood)
        rep = self.represent(x)
        masked = _dcan.mask_views(rep, 2 * n_pairs, mask_rate, generator)
        z_all = self.encode(torch.cat([rep.unsqueeze(1), masked], dim=1))
        recon = self.reconstruction_per_cell(x, rep, z_all[:, 0])
        pairs = [instance_loss_per_cell(z_all[:, 1 + 2 * k : 3 + 2 * k]) for k in range(n_pairs)]
        inst = torch.stack(pairs).mean(0)
        return rho * recon + (1.0 - rho) * inst, {"reconstruction": recon.detach(), "instance": inst.detach()}

    original = DCANModule.instance_stage_loss
    if n_pairs > 1:
        DCANModule.instance_stage_loss = multiplied
    try:
        yield
    finally:
        DCANModule.instance_stage_loss = original


def averaged_latents(
    dataset: str, data: Path, epsilon: float, seed: int, instance_epochs: int
) -> tuple[dict, np.ndarray, float]:
    """Latents of the last iterate and of each EMA of the encoder after a private instance stage.

    The fit runs ``instance_epochs`` instance epochs and no cluster stage, under the σ of a full
    fit with that many instance epochs (:func:`dp_kmeans_start.instance_only_sketch`). Returns
    the latents, the labels and σ.
    """
    import torch

    import dpsc
    from dpsc.train import _plan

    adata = load(dataset, data)
    k = adata.obs["label"].nunique()
    sketch, counts = instance_only_sketch(adata.n_obs, k, instance_epochs)

    averages: dict[float, list[torch.Tensor]] = {}
    step = {"t": 0}
    original = _plan.DCANTrainingPlan.training_step

    def tracked_step(plan, batch, batch_idx):
        original(plan, batch, batch_idx)
        params = [p.detach() for p in plan.module.encoder.parameters()]
        with torch.no_grad():
            for d in DECAYS:
                moments = averages.setdefault(d, [torch.zeros_like(p) for p in params])
                for m, p in zip(moments, params, strict=True):
                    m.mul_(d).add_(p, alpha=1 - d)
        step["t"] += 1

    _plan.DCANTrainingPlan.training_step = tracked_step
    try:
        model = dpsc.tl.fit(
            adata,
            epsilon=epsilon,
            n_clusters=k,
            instance_epochs=instance_epochs,
            cluster_epochs=0,
            kmeans_kwargs={"n_sketch_steps": sketch},
            random_state=seed,
            noise_seed=seed,  # repeatable: the guarantee does not hold against this seed
            progress_bar=False,
            return_model=True,
        )
    finally:
        _plan.DCANTrainingPlan.training_step = original
    assert model.train_params_["planned_steps"] == counts["total"]
    latents = {"last iterate": model.get_latent_representation()}
    encoder = model.module.encoder  # overwritten by each average in turn; the model is discarded
    for d, moments in averages.items():
        with torch.no_grad():
            for p, m in zip(encoder.parameters(), moments, strict=True):
                p.copy_(m / (1 - d ** step["t"]))
        latents[f"EMA {d:g}"] = model.get_latent_representation()
    return latents, adata.obs["label"].astype(str).to_numpy(), model.privacy_["noise_multiplier"]


def summarize(values) -> tuple[str, str]:
    """``"mean ± sd"`` (ddof 0) and the comma-separated values, each to 3 decimals."""
    values = np.asarray(values, dtype=float)
    return f"{values.mean():.3f} ± {values.std():.3f}", ", ".join(f"{v:.3f}" for v in values)


def emit(row: dict, out: str | None) -> None:
    """Print a result row as JSON and append it to the JSON lines file ``out`` (if given)."""
    print(json.dumps(row), flush=True)
    if out:
        with open(out, "a") as fh:
            fh.write(json.dumps(row) + "\n")


def common_arguments(parser: argparse.ArgumentParser) -> None:
    """Options shared by the PBMC diagnostics: data, seeds, threads, output and report."""
    parser.add_argument("--data", default="../shared/data")
    parser.add_argument("--dataset", default="pbmc")
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", help="JSON lines file the rows are appended to (default: stdout only)")
    parser.add_argument("--report", type=Path, help="print the markdown table of a results file and exit")


def report(path: Path) -> str:
    """Markdown table of k-means ARI per (ε, instance epochs, weights): mean ± sd (ddof 0), per seed."""
    import pandas as pd

    df = pd.DataFrame([json.loads(line) for line in path.read_text().splitlines() if line.strip()])
    df["view_pairs"] = df.get("view_pairs", 1)
    df["view_pairs"] = df["view_pairs"].fillna(1).astype(int)
    df["host"] = df.get("host", FIRST_HOST)
    df["host"] = df["host"].fillna(FIRST_HOST)
    out = [
        "| ε | instance epochs | view pairs | σ | weights | ran on | k-means ARI | per seed |",
        "|---|---|---|---|---|---|---|---|",
    ]
    keys = ["epsilon", "instance_epochs", "view_pairs", "noise_multiplier", "weights", "host"]
    for (eps, epochs, pairs, sigma, weights, host), g in df.groupby(keys, sort=False):
        ari, seeds = summarize(g.sort_values("seed").kmeans_ari)
        out.append(f"| {eps:g} | {epochs} | {pairs} | {sigma:.3f} | {weights} | {host} | {ari} | {seeds} |")
    return "\n".join(out)


def main() -> None:
    import torch
    from sklearn.cluster import KMeans
    from sklearn.metrics import adjusted_rand_score

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    common_arguments(parser)
    parser.add_argument("--epsilon", type=float, default=8.0)
    parser.add_argument("--instance-epochs", type=int, default=50, help="as DPDCAN.train's default")
    parser.add_argument("--view-pairs", type=int, default=1, help="masked view pairs per cell (default 1)")
    args = parser.parse_args()
    if args.report:
        print(report(args.report))
        return
    torch.set_num_threads(args.threads)
    if args.view_pairs < 1:
        parser.error("--view-pairs must be at least 1")
    for seed in args.seeds:
        with view_pairs(args.view_pairs):
            latents, truth, sigma = averaged_latents(
                args.dataset, Path(args.data), args.epsilon, seed, args.instance_epochs
            )
        k = len(np.unique(truth))
        for name, z in latents.items():
            pred = KMeans(k, n_init=10, random_state=0).fit_predict(z)
            row = {
                "dataset": args.dataset,
                "epsilon": args.epsilon,
                "instance_epochs": args.instance_epochs,
                "view_pairs": args.view_pairs,
                "noise_multiplier": sigma,
                "seed": seed,
                "weights": name,
                "kmeans_ari": float(adjusted_rand_score(truth, pred)),
                "host": f"{cpu_model()}, torch {torch.__version__}",
            }
            emit(row, args.out)


if __name__ == "__main__":
    main()
