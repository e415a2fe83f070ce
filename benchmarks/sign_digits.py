"""Classification check of DP-SignSGD (Ghosh & Das, Table 3) on scikit-learn's digits.

An MLP 64→128→10 on ``load_digits`` (1797 8×8 images; 70/30 split by seed), Poisson sampling
(q = 64/n), C = 1, δ = 1e-5, 30 epochs, σ calibrated by Opacus for the planned steps.
Optimizers: DP-SGD (lr 0.5), DP-SignSGD (lr 3e-3), DP-Adam (lr 1e-2), DP-SignAdam (lr 3e-3).
The learning rates were fixed before the run (not tuned on the test split).

Usage::

    python benchmarks/sign_digits.py --out benchmarks/results/sign_digits.json
    python benchmarks/sign_digits.py --report benchmarks/results/sign_digits.json
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch
from opacus import GradSampleModule
from opacus.accountants import RDPAccountant
from opacus.accountants.utils import get_noise_multiplier
from opacus.optimizers import DPOptimizer
from opacus.utils.uniform_sampler import UniformWithReplacementSampler
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split

from dpsc.optim import DPSignAdam, DPSignSGD

LRS = {"dp-sgd": 0.5, "dp-signsgd": 3e-3, "dp-adam": 1e-2, "dp-signadam": 3e-3}


def run_one(name: str, epsilon: float, seed: int, epochs: int = 30) -> dict:
    X, y = load_digits(return_X_y=True)
    X = X / 16.0
    Xtr, Xte, ytr, yte = train_test_split(X, y, test_size=0.3, random_state=seed, stratify=y)
    Xtr, Xte = torch.tensor(Xtr, dtype=torch.float32), torch.tensor(Xte, dtype=torch.float32)
    ytr, yte = torch.tensor(ytr), torch.tensor(yte)
    torch.manual_seed(seed)
    net = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10))
    model = GradSampleModule(net)
    n = len(Xtr)
    q = 64 / n
    steps_per_epoch = round(1 / q)
    steps = epochs * steps_per_epoch
    sigma = get_noise_multiplier(target_epsilon=epsilon, target_delta=1e-5, sample_rate=q, steps=steps)
    kw = {
        "noise_multiplier": sigma,
        "max_grad_norm": 1.0,
        "expected_batch_size": 64,
        "generator": torch.Generator().manual_seed(seed + 1),
    }
    params = list(model.parameters())
    lr = LRS[name]
    opt = {
        "dp-sgd": lambda: DPOptimizer(torch.optim.SGD(params, lr=lr), **kw),
        "dp-adam": lambda: DPOptimizer(torch.optim.Adam(params, lr=lr), **kw),
        "dp-signsgd": lambda: DPSignSGD(params, lr=lr, **kw),
        "dp-signadam": lambda: DPSignAdam(params, lr=lr, **kw),
    }[name]()
    acc = RDPAccountant()
    opt.attach_step_hook(acc.get_optimizer_hook_fn(sample_rate=q))
    sampler = UniformWithReplacementSampler(
        num_samples=n, sample_rate=q, steps=steps, generator=torch.Generator().manual_seed(seed + 2)
    )
    start = time.perf_counter()
    for batch in sampler:
        idx = torch.as_tensor(batch, dtype=torch.long)
        opt.zero_grad(set_to_none=True)
        if idx.numel():
            loss = torch.nn.functional.cross_entropy(model(Xtr[idx]), ytr[idx])
            loss.backward()
        else:  # an empty Poisson batch still takes a noisy step
            for p in params:
                p.grad_sample = torch.zeros(0, *p.shape)
        opt.step()
    with torch.no_grad():
        accuracy = float((model(Xte).argmax(1) == yte).float().mean())
    return {
        "optimizer": name,
        "epsilon": epsilon,
        "seed": seed,
        "accuracy": accuracy,
        "spent_epsilon": acc.get_epsilon(1e-5),
        "sigma": sigma,
        "steps": steps,
        "seconds": time.perf_counter() - start,
    }


def report(path: Path) -> str:
    import pandas as pd

    payload = json.loads(path.read_text())
    df = pd.DataFrame(payload["rows"])
    table = df.groupby(["optimizer", "epsilon"]).accuracy.agg(["mean", "std"]).reset_index()
    eps = sorted(df.epsilon.unique())
    out = [
        "# DP-SignSGD classification check (scikit-learn digits)",
        "",
        f"Command: `{payload['command']}`. Test accuracy, mean ± sd over seeds "
        f"{sorted(int(s) for s in df.seed.unique())}; "
        "MLP 64→128→10, 30 epochs, q = 64/n, C = 1, δ = 1e-5.",
        "",
        "| optimizer | " + " | ".join(f"ε = {e:g}" for e in eps) + " |",
        "|---" * (len(eps) + 1) + "|",
    ]
    for name in LRS:
        cells = []
        for e in eps:
            r = table[(table.optimizer == name) & (table.epsilon == e)]
            cells.append(f"{r['mean'].iloc[0]:.3f} ± {r['std'].iloc[0]:.3f}")
        out.append(f"| {name} (lr {LRS[name]:g}) | " + " | ".join(cells) + " |")
    out += ["", f"Max spent ε / target: {(df.spent_epsilon / df.epsilon).max():.4f}."]
    return "\n".join(out)


def main() -> None:
    import sys

    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/sign_digits.json"))
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--epsilons", type=float, nargs="+", default=[0.5, 1.0, 2.0])
    parser.add_argument("--report", type=Path)
    args = parser.parse_args()
    if args.report:
        print(report(args.report))
        return
    torch.set_num_threads(1)
    rows = [run_one(name, e, s) for s in args.seeds for e in args.epsilons for name in LRS]
    args.out.write_text(json.dumps({"command": "python " + " ".join(sys.argv), "rows": rows}))


if __name__ == "__main__":
    main()
