"""How good is the DP k-means start alone? Plain vs oversampled (default) options on one private latent.

For each seed: a private DP-DCAN instance stage (``cluster_epochs=0``, so the model is trained
with the default 50 instance epochs at the given ε), then its latent codes are fixed and
:func:`dpsc.methods.dp_kmeans_centroids` is run ``--reps`` times per option set with fresh
Poisson samples and noise. σ for each option set is the one a full default fit
(50 + 40 epochs) would use with that option set's number of releases. The start is scored by
ARI (nearest centroid vs labels), agreement (ARI vs non-private k-means on the same latent, a
label-free measure) and the number of centroids that are nearest to at least one cell.

``--latent plain-start`` (the default, the first committed table) starts from the instance stage
of a fit with the plain k-means start's 60 releases and no cluster stage; ``--latent default``
from the instance stage of a full default fit (σ of its 1140 steps on PBMC). ``--cache DIR``
keeps the latents, so further option sets can be scored without training again.

Usage (from the repo root)::

    python benchmarks/diagnostics/dp_kmeans_start.py --data ../shared/data --seeds 0 1 --reps 4 \
        --out benchmarks/results/dp_kmeans_start.md
    python benchmarks/diagnostics/dp_kmeans_start.py --data ../shared/data --seeds 0 1 2 --reps 4 \
        --latent default --cache /tmp/latents
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parents[1]))  # benchmarks/
sys.path.insert(0, str(Path(__file__).parent))  # diagnostics/
from dpdcan_benchmark import OVERSAMPLED_KMEANS, PLAIN_KMEANS_START, load, train_defaults, train_options

OPTION_SETS = {
    "plain (20 + 4 × 10 releases)": PLAIN_KMEANS_START,
    "oversampled (40 + 4 × 40 releases)": OVERSAMPLED_KMEANS,
}


def default_step_counts(sample_rate: float, instance_epochs: int | None = None) -> dict[str, int]:
    """Steps a default :meth:`dpsc.model.DPDCAN.train` fit plans at rate q (the model's own count).

    ``instance_epochs`` replaces the default number of instance epochs when given.
    """
    from dpsc.model import planned_step_counts

    d = train_defaults()
    if instance_epochs is not None:
        d["instance_epochs"] = instance_epochs
    names = ("instance_epochs", "cluster_epochs", "n_sketch_steps", "n_lloyd_rounds", "steps_per_round")
    return planned_step_counts(
        sample_rate, **{name: d[name] for name in names}, target_frequency=d["target_frequency"]
    )


def instance_only_sketch(
    n_obs: int, n_clusters: int, instance_epochs: int | None = None
) -> tuple[int, dict[str, int]]:
    """Sketch release count that makes a fit without cluster stage plan a full default fit's steps.

    A fit with ``cluster_epochs=0`` and this ``n_sketch_steps`` runs the instance stage of a
    full default fit (with ``instance_epochs`` instance epochs, if given) under the same σ: the
    left-out cluster-stage and frequency steps go to the sketch. Returns the count and the full
    fit's :func:`default_step_counts`.
    """
    from dpsc._validation import check_fit_args

    batch_size = check_fit_args(n_obs=n_obs, n_clusters=n_clusters, scope="encoder", batch_size=None)
    counts = default_step_counts(batch_size / n_obs, instance_epochs)
    return train_defaults()["n_sketch_steps"] + counts["cluster"] + counts["frequency"], counts


def private_latent(dataset: str, data: Path, epsilon: float, seed: int, latent: str):
    """Latent codes after a private instance stage only, the labels, q and the latent radius.

    ``latent="plain-start"``: the instance stage of a fit with the plain start's 60 k-means releases and
    no cluster stage (σ calibrated for 560 steps). ``latent="default"``: the instance stage of
    a full default fit (σ for 500 + 200 + 400 + 40 steps): the sketch release count is raised
    so that the fit plans exactly the steps of the full default fit, and with the same seed
    the instance stage is the one that fit runs.
    """
    import dpsc

    adata = load(dataset, data)
    k = adata.obs["label"].nunique()
    if latent == "plain-start":
        options = PLAIN_KMEANS_START
    else:  # the left-out cluster-stage and frequency steps go to the sketch: σ is the full fit's
        sketch, counts = instance_only_sketch(adata.n_obs, k)
        options = {"n_sketch_steps": sketch}
    model = dpsc.tl.fit(
        adata,
        epsilon=epsilon,
        n_clusters=k,
        cluster_epochs=0,
        random_state=seed,
        noise_seed=seed,  # repeatable: the guarantee does not hold against this seed
        progress_bar=False,
        return_model=True,
        **train_options(options),
    )
    if latent == "default":
        assert model.train_params_["planned_steps"] == counts["total"]
    return (
        model.get_latent_representation(),
        adata.obs["label"].astype(str).to_numpy(),
        model.privacy_["sample_rate"],
        float(model.module.latent_scale),
    )


def score_starts(
    z,
    truth,
    q: float,
    radius: float,
    epsilon: float,
    seed: int,
    reps: int,
    count_frequency: bool,
    option_sets: dict[str, dict],
) -> list[dict]:
    import torch
    from sklearn.cluster import KMeans
    from sklearn.metrics import adjusted_rand_score

    from dpsc.methods import dp_kmeans_centroids, kmeans_release_steps
    from dpsc.privacy import calibrate_noise_multiplier

    k = len(np.unique(truth))
    reference = KMeans(k, n_init=10, random_state=0).fit_predict(z)
    latent = torch.as_tensor(z, dtype=torch.float64)
    # the full default fit: its epochs (+ its frequency releases when the latent is its own)
    counts = default_step_counts(q)
    training_steps = counts["instance"] + counts["cluster"] + (counts["frequency"] if count_frequency else 0)
    n_lloyd_rounds = train_defaults()["n_lloyd_rounds"]
    rows = []
    for name, opts in option_sets.items():
        releases = kmeans_release_steps(opts["n_sketch_steps"], n_lloyd_rounds, opts["steps_per_round"])
        sigma = calibrate_noise_multiplier(epsilon, 1e-5, q, training_steps + releases)
        for rep in range(reps):
            rng = np.random.default_rng(1000 * seed + rep)
            centroids = dp_kmeans_centroids(
                lambda rng=rng: latent[torch.as_tensor(rng.random(len(latent)) < q)],
                k,
                noise_multiplier=sigma,
                clip_norm=radius,
                record_step=lambda: None,
                generator=torch.Generator().manual_seed(1000 * seed + rep),
                n_sketch_steps=opts["n_sketch_steps"],
                steps_per_round=opts["steps_per_round"],
                sphere_radius=radius,
                random_state=rep,
                **opts["kmeans_kwargs"],
            )
            labels = torch.cdist(latent.float(), torch.as_tensor(centroids)).argmin(1).numpy()
            rows.append(
                {
                    "seed": seed,
                    "options": name,
                    "sigma": sigma,
                    "ari": adjusted_rand_score(truth, labels),
                    "agreement": adjusted_rand_score(reference, labels),
                    "populated": len(np.unique(labels)),
                    "nonprivate_kmeans_ari": adjusted_rand_score(truth, reference),
                }
            )
    return rows


def main() -> None:
    import pandas as pd
    import torch

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", default="../shared/data")
    parser.add_argument("--dataset", default="pbmc")
    parser.add_argument("--epsilon", type=float, default=8.0)
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1])
    parser.add_argument("--reps", type=int, default=4)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument(
        "--latent",
        choices=["plain-start", "default"],
        default="plain-start",
        help="instance stage to start from (see private_latent); 'plain-start' made the first table",
    )
    parser.add_argument("--options", nargs="+", help="option sets to run (default: all)")
    parser.add_argument("--cache", help="folder keeping the private latents between runs")
    parser.add_argument("--out")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    option_sets = {name: OPTION_SETS[name] for name in args.options or OPTION_SETS}
    rows = []
    for seed in args.seeds:
        cached = Path(args.cache or ".") / f"{args.dataset}_{args.latent}_eps{args.epsilon:g}_seed{seed}.npz"
        if args.cache and cached.exists():
            saved = np.load(cached, allow_pickle=False)
            z, truth, q, radius = saved["z"], saved["truth"], float(saved["q"]), float(saved["radius"])
        else:
            z, truth, q, radius = private_latent(
                args.dataset, Path(args.data), args.epsilon, seed, args.latent
            )
            if args.cache:
                cached.parent.mkdir(parents=True, exist_ok=True)
                np.savez(cached, z=z, truth=np.asarray(truth, dtype=str), q=q, radius=radius)
        count_frequency = args.latent == "default"
        rows += score_starts(z, truth, q, radius, args.epsilon, seed, args.reps, count_frequency, option_sets)
    df = pd.DataFrame(rows)
    table = df.groupby(["seed", "options"], sort=False).agg(
        sigma=("sigma", "first"),
        nonprivate_kmeans_ari=("nonprivate_kmeans_ari", "first"),
        ari=("ari", "mean"),
        ari_sd=("ari", "std"),
        agreement=("agreement", "mean"),
        populated=("populated", "mean"),
    )
    text = "\n".join(
        [
            f"# DP k-means start alone ({args.dataset}, ε = {args.epsilon:g})",
            "",
            f"Command: `python benchmarks/diagnostics/dp_kmeans_start.py --data {args.data} "
            f"--dataset {args.dataset} "
            f"--epsilon {args.epsilon:g} --seeds {' '.join(map(str, args.seeds))} --reps {args.reps} "
            f"--latent {args.latent}`",
            "",
            "Mean over reps (fresh Poisson samples and noise on the same private latent). ARI: nearest",
            "centroid vs labels; agreement: ARI vs non-private k-means on the same latent (label-free);",
            "populated: centroids nearest to at least one cell (of k).",
            "",
            table.round(3).to_markdown(),
            "",
        ]
    )
    print(text)
    if args.out:
        Path(args.out).write_text(text)


if __name__ == "__main__":
    main()
