"""What the secure noise source costs: its samplers, and the proven PCA and k-means that draw from it.

The releases over all cells (gene statistics, PCA, k-means, frequencies) add integer noise drawn
from the AES-256-CTR keystream by the discrete Gaussian sampler of Canonne, Kamath & Steinke
(2020, Alg. 3; :meth:`dpsc.privacy._random.SecureRandom.discrete_gaussian`); sampled releases add
the keystream's continuous Gaussian (four Box–Muller draws summed, :meth:`SecureRandom.normal`).
The generator they replaced was numpy's, seeded with 63 bits of operating-system entropy, drawing
continuous Gaussians. This script times both, alternating in one process (medians over
``--repeats``; each repeat runs the secure version first, then the numpy one):

1. the samplers alone: ``n`` draws of the discrete Gaussian at the lattice σ of a 2000-gene PCA
   release at ε = 8 on PBMC 4k, against numpy's PCG64 ``Generator.normal`` and MT19937
   ``RandomState.normal``;
2. whole calls on the embedded PBMC 4k (4,271 cells × 2,000 genes) at ε = 8: ``tl.cluster`` (cell
   sum, PCA, k-means in one plan) and ``pp.pca`` followed by ``tl.kmeans``, with the secure
   samplers, and with the two samplers replaced by numpy PCG64 draws (the discrete Gaussian by a
   rounded ``Generator.normal`` of the same σ, the continuous one by ``Generator.normal``); the
   rest of each call (the keystream for Poisson masks, the releases' encoding) is the same.

The numpy variant is a timing reference only: it is not a private mechanism dpsc offers.

It prints the two markdown tables of ``benchmarks/results/noise_cost.md``. Usage (from the repo
root, nothing else running)::

    OMP_NUM_THREADS=1 python benchmarks/diagnostics/noise_cost.py --repeats 7 --threads 1
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import time
from collections.abc import Callable, Iterator

import numpy as np


@contextlib.contextmanager
def numpy_samplers(seed: int) -> Iterator[None]:
    """Replace the secure samplers by numpy PCG64 draws of the same scale (timing reference only)."""
    from dpsc.privacy import SecureRandom

    generator = np.random.default_rng(seed)
    secure = SecureRandom.discrete_gaussian, SecureRandom.normal

    def discrete(self, sigma: float, size: int) -> np.ndarray:
        return np.rint(generator.normal(0.0, sigma, int(size))).astype(np.int64)

    def normal(self, std: float, size: int | tuple[int, ...]) -> np.ndarray:
        return generator.normal(0.0, std, size)

    SecureRandom.discrete_gaussian, SecureRandom.normal = discrete, normal
    try:
        yield
    finally:
        SecureRandom.discrete_gaussian, SecureRandom.normal = secure


def seconds(call: Callable[[], object]) -> float:
    start = time.perf_counter()
    call()
    return time.perf_counter() - start


def pca_release() -> tuple[int, float]:
    """Values and σ (lattice units) of the PCA release of a ``tl.cluster`` plan on PBMC 4k at ε = 8."""
    import dpsc
    from dpsc.methods._clustering import plan_clustering
    from dpsc.methods._pca import second_moment_release

    adata = dpsc.datasets.pbmc4k()
    plan = plan_clustering(8.0, 1e-5, n_vars=adata.n_vars, n_clusters=8, n_obs=adata.n_obs)
    release = second_moment_release(plan.n_genes, plan.sigmas["pca"])
    return release.size, release.lattice_std


def sampler_rows(repeats: int) -> list[str]:
    """Markdown rows: seconds for the PCA release's number of draws, secure vs numpy."""
    from dpsc.privacy._random import SecureRandom, secure_key

    n, sigma = pca_release()
    pcg, mt = np.random.default_rng(), np.random.RandomState()
    runs = {"secure": [], "pcg": [], "mt": []}
    for _ in range(repeats):
        runs["secure"].append(seconds(lambda: SecureRandom(secure_key()).discrete_gaussian(sigma, n)))
        runs["pcg"].append(seconds(lambda: pcg.normal(0.0, sigma, n)))
        runs["mt"].append(seconds(lambda: mt.normal(0.0, sigma, n)))
    secure = statistics.median(runs["secure"])
    rows = [f"| discrete Gaussian, AES-256-CTR (σ = {sigma:.0f} lattice units) | {n:,} | {secure:.3f} | 1 |"]
    for name, key in (
        ("numpy PCG64 `Generator.normal`", "pcg"),
        ("numpy MT19937 `RandomState.normal`", "mt"),
    ):
        median = statistics.median(runs[key])
        rows.append(f"| {name} | {n:,} | {median:.3f} | {secure / median:.1f} |")
    return rows


def call_rows(repeats: int) -> list[str]:
    """Markdown rows: seconds per call with the secure samplers and with numpy's, and their ratio."""
    import dpsc

    base = dpsc.datasets.pbmc4k()

    def cluster() -> None:
        dpsc.tl.cluster(base.copy(), 8, epsilon=8.0)

    def pca_kmeans() -> None:
        adata = base.copy()
        dpsc.pp.pca(adata, epsilon=4.0)
        dpsc.tl.kmeans(adata, 8, epsilon=4.0)

    rows = []
    for name, call in (
        ("`tl.cluster(adata, 8, epsilon=8)`", cluster),
        ("`pp.pca` + `tl.kmeans` (ε 4 + 4)", pca_kmeans),
    ):
        call()  # first call pays the imports and caches
        secure, reference = [], []
        for repeat in range(repeats):
            secure.append(seconds(call))
            with numpy_samplers(repeat):
                reference.append(seconds(call))
        ratios = ", ".join(f"{s / r:.2f}" for s, r in zip(secure, reference, strict=True))
        rows.append(
            f"| {name} | {statistics.median(secure):.2f} | {statistics.median(reference):.2f} | "
            f"{statistics.median(s / r for s, r in zip(secure, reference, strict=True)):.2f} ({ratios}) |"
        )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    import torch

    torch.set_num_threads(args.threads)
    lines = [
        "| sampler | draws | median s | secure / this |",
        "|---|---|---|---|",
        *sampler_rows(args.repeats),
        "",
        "| call on PBMC 4k | secure samplers, median s | numpy samplers, median s | ratio (per repeat) |",
        "|---|---|---|---|",
        *call_rows(args.repeats),
    ]
    print("\n".join(lines))


if __name__ == "__main__":
    main()
