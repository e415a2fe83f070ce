r"""The proven private clustering as one plan: DP gene selection, DP PCA and DP k-means, all sums.

Every step reads the cells only through a release of a sum over cells (:mod:`._release`):

1. when the matrix has more than :data:`PIPELINE_GENES` genes, the gene statistics of
   :mod:`._hvg` (one release), and the :data:`PIPELINE_GENES` genes with the largest noisy second
   moments are kept;
2. the second-moment matrix of :mod:`._pca` on the kept genes (one release), whose top eigenvectors
   are the loadings: of all kept genes, mean component kept, when the release's noise is small
   against the cells' signal (:func:`reads_all_genes`); else past the mean component, in a block of
   :data:`GENE_BLOCK` genes;
3. DP k-means (:mod:`._kmeans`) on each cell's projection scaled to unit norm (cosine): one sketch
   release and :data:`KMEANS_PLAN` Lloyd releases.

:func:`plan_clustering` splits the asked (ε, δ) over the releases (:func:`~._accounting.split_budget`,
shares :data:`SHARES`) and calibrates each σ once. :func:`run_clustering` is the post-processing
between the releases: it never reads a cell. It asks ``release_sum(request)`` for each noisy sum,
where a :class:`Request` says which sum (and carries what was released before: the kept genes, the
loadings, the k-means assignment). :func:`contribution` computes that sum over a set of cells. On
one machine ``release_sum`` adds the noise to :func:`contribution` over all cells; in a
federation each site computes :func:`contribution` over its own cells and secure aggregation adds
them with the sites' noise shares, so the federated clustering runs this very code.

The design rule (genes kept, block, components, shares, k-means plan) reads only the number of
genes, the number of clusters and the asked ε, and the choice between all genes and the block reads
only the released second-moment matrix: no cell and no label.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from . import _hvg, _kmeans, _pca
from ._release import GaussianSum

PIPELINE_GENES = 2000  # genes kept by the DP gene selection (when the matrix has more)
GENE_BLOCK = _pca.DEFAULT_GENE_BLOCK  # genes kept (by noisy second moment) for the eigenvectors
N_COMPS = 16  # principal components the cells are projected on
#: τ of :func:`reads_all_genes`: all genes when the noise's spectral norm is at most this share of
#: the released trace (≈ n). Chosen with the PBMC 4k and Paul 2015 labels: between Paul at ε = 16
#: (ratio 0.0155, all genes ahead) and PBMC at ε = 8 (0.0163, the block ahead or level); checked on
#: bladder, Bastidas-Ponce 2019 and bladder with all genes (``benchmarks/results/cluster.md``).
ALL_GENES_NOISE_SHARE = 0.016
#: ε shares of the releases: gene selection (when it runs), PCA, k-means (composed to the total).
SHARES = {"genes": 0.2, "pca": 0.48, "kmeans": 0.32}
#: DP k-means plan: one sketch release (2^10 buckets), two Lloyd releases with 4k centroids reduced
#: to k, the count column weighted 0.3·R; points on the unit sphere (R = 1). Chosen with PBMC 4k
#: labels together with the cosine metric; the mouse bladder files confirm it except bladder
#: top-2000 at ε = 4 (``benchmarks/results/dp_pipeline.md``).
KMEANS_PLAN = {
    "n_sketch_steps": 1,
    "n_lloyd_rounds": 2,
    "steps_per_round": 1,
    "n_bits": 10,
    "oversampling": 4,
    "count_scale": 0.3,
}
CLIP_NORM = 1.0


@dataclass(frozen=True)
class ClusterPlan:
    """A whole private clustering, fixed before any cell is read (public: sent to every site)."""

    epsilon: float | None
    delta: float
    n_vars: int
    n_clusters: int
    select_genes: bool
    n_comps: int
    gene_block: int | None
    sigmas: dict[str, float]
    random_state: int = 0
    kmeans: dict[str, Any] = field(default_factory=lambda: dict(KMEANS_PLAN))

    @property
    def n_genes(self) -> int:
        """Genes the PCA reads: the selected ones, or all."""
        return PIPELINE_GENES if self.select_genes else self.n_vars

    @property
    def kmeans_steps(self) -> int:
        """Releases of the k-means step."""
        plan = self.kmeans
        return _kmeans.kmeans_release_steps(
            plan["n_sketch_steps"], plan["n_lloyd_rounds"], plan["steps_per_round"]
        )

    @property
    def n_releases(self) -> int:
        """Every release of the plan, in order."""
        return int(self.select_genes) + 1 + self.kmeans_steps

    def history(self) -> list[tuple[float, float, int]]:
        """Return the Opacus history of the whole clustering (every release reads all cells: q = 1)."""
        history = [(self.sigmas["genes"], 1.0, 1)] if self.select_genes else []
        return [*history, (self.sigmas["pca"], 1.0, 1), (self.sigmas["kmeans"], 1.0, self.kmeans_steps)]

    def spent(self, accountant: str = "rdp") -> float | None:
        """ε of the whole plan at δ (``None`` without privacy)."""
        from ._accounting import history_epsilon

        return None if self.epsilon is None else history_epsilon(self.history(), self.delta, accountant)

    def to_config(self) -> dict[str, Any]:
        """Return the plan as flat scalars (a Flower ConfigRecord)."""
        return {
            "epsilon": -1.0 if self.epsilon is None else float(self.epsilon),
            "delta": float(self.delta),
            "n-vars": int(self.n_vars),
            "n-clusters": int(self.n_clusters),
            "select-genes": bool(self.select_genes),
            "n-comps": int(self.n_comps),
            "gene-block": -1 if self.gene_block is None else int(self.gene_block),
            "random-state": int(self.random_state),
            **{f"sigma-{k}": float(v) for k, v in self.sigmas.items()},
        }

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> ClusterPlan:
        """Inverse of :meth:`to_config`."""
        epsilon = float(config["epsilon"])
        block = int(config["gene-block"])
        return cls(
            epsilon=None if epsilon < 0 else epsilon,
            delta=float(config["delta"]),
            n_vars=int(config["n-vars"]),
            n_clusters=int(config["n-clusters"]),
            select_genes=bool(config["select-genes"]),
            n_comps=int(config["n-comps"]),
            gene_block=None if block < 0 else block,
            sigmas={k: float(config[f"sigma-{k}"]) for k in ("genes", "pca", "kmeans")},
            random_state=int(config["random-state"]),
        )


def plan_clustering(
    epsilon: float | None,
    delta: float,
    *,
    n_vars: int,
    n_clusters: int,
    random_state: int = 0,
    accountant: str = "rdp",
) -> ClusterPlan:
    """Split (ε, δ) over the releases by :data:`SHARES` and calibrate each σ once (reads no cell)."""
    select = n_vars > PIPELINE_GENES
    n_genes = PIPELINE_GENES if select else n_vars
    n_comps = min(N_COMPS, n_genes - 2)
    if n_comps < 1:
        raise ValueError(f"A clustering needs at least 3 genes, got {n_vars}.")
    steps = _kmeans.kmeans_release_steps(
        KMEANS_PLAN["n_sketch_steps"], KMEANS_PLAN["n_lloyd_rounds"], KMEANS_PLAN["steps_per_round"]
    )
    sigmas = {"genes": 0.0, "pca": 0.0, "kmeans": 0.0}
    if epsilon is not None:
        from ._accounting import split_budget

        parts = {"pca": (SHARES["pca"], 1.0, 1), "kmeans": (SHARES["kmeans"], 1.0, steps)}
        if select:
            parts["genes"] = (SHARES["genes"], 1.0, 1)
        split = split_budget(float(epsilon), delta, parts, accountant)
        sigmas.update({name: sigma for name, (_, sigma) in split.items()})
    block = GENE_BLOCK if n_genes > GENE_BLOCK else None
    return ClusterPlan(epsilon, delta, n_vars, n_clusters, select, n_comps, block, sigmas, random_state)


@dataclass(frozen=True)
class Request:
    """Which sum a release asks for, with what was released before it (all public).

    ``kind`` is ``"genes"``, ``"pca"`` or ``"kmeans"``; ``index`` counts the plan's releases;
    ``genes`` (indices of the genes the PCA reads), ``loadings`` (those genes × components) and
    ``assignment`` (the k-means rows) are set for the steps that need them.
    """

    kind: str
    index: int
    sigma: float
    genes: np.ndarray | None = None
    loadings: np.ndarray | None = None
    assignment: _kmeans.Assignment | None = None

    def release(self, n_vars: int, count_scale: float = KMEANS_PLAN["count_scale"]) -> GaussianSum:
        """Return the :class:`GaussianSum` this request's sum is released with."""
        if self.kind == "genes":
            return _hvg.gene_statistics_release(n_vars, self.sigma)
        if self.kind == "pca":
            return _pca.second_moment_release(len(self.genes), self.sigma)
        if self.kind == "kmeans":
            d = self.loadings.shape[1]
            return _kmeans.table_release(self.assignment.n_rows, d, CLIP_NORM, count_scale, self.sigma)
        raise ValueError(f"Unknown release {self.kind!r}; the clustering has 'genes', 'pca' and 'kmeans'.")


def contribution(
    request: Request, matrix: Any, count_scale: float = KMEANS_PLAN["count_scale"]
) -> np.ndarray:
    """Return the exact sum over the cells of ``matrix`` that ``request`` asks for (read in row blocks)."""
    if request.kind == "genes":
        return _hvg.gene_sums(matrix, True, _hvg.DEFAULT_SQUARE_CLIP)
    if request.kind == "pca":
        return _pca.upper(_pca.second_moment(matrix, True, columns=request.genes))
    if request.kind == "kmeans":
        points = cell_points(matrix, request.genes, request.loadings)
        return _kmeans.kmeans_table(points, request.assignment, CLIP_NORM, count_scale)
    raise ValueError(f"Unknown release {request.kind!r}; the clustering has 'genes', 'pca' and 'kmeans'.")


def cell_points(matrix: Any, genes: np.ndarray, loadings: np.ndarray) -> np.ndarray:
    """Each cell's projection on the released loadings, scaled to unit norm (a map of each cell alone)."""
    return _kmeans.kmeans_points(_pca.project(matrix, loadings, True, columns=genes), "cosine")


@dataclass
class ClusterResult:
    """What a private clustering released (and post-processed): genes, loadings, centroids."""

    genes: np.ndarray  # indices of the genes the PCA read
    loadings: np.ndarray  # len(genes) × n_comps, zero rows outside the block
    block: np.ndarray  # indices (into genes) of the block the eigenvectors came from
    eigenvalues: np.ndarray
    centroids: np.ndarray  # n_clusters × n_comps
    gene_means: np.ndarray | None = None  # noisy statistics of the gene selection (all genes)
    gene_variances: np.ndarray | None = None
    releases: int = 0
    clusters_in_use: int | None = None  # centroids above the noise of their released counts

    def labels(self, matrix: Any) -> np.ndarray:
        """Each cell's nearest released centroid (post-processing; computed from each cell)."""
        return _kmeans.nearest_centroid(cell_points(matrix, self.genes, self.loadings), self.centroids)

    def projections(self, matrix: Any) -> np.ndarray:
        """Each cell's projection on the loadings (float32)."""
        return _pca.project(matrix, self.loadings, True, columns=self.genes)


ReleaseSum = Callable[[Request], np.ndarray]


def run_clustering(plan: ClusterPlan, release_sum: ReleaseSum) -> ClusterResult:
    """Run the plan: ask ``release_sum`` for each noisy sum, post-process between them (no cell read)."""
    index = 0
    genes = np.arange(plan.n_vars)
    means = variances = None
    if plan.select_genes:
        request = Request("genes", index, plan.sigmas["genes"])
        released = release_sum(request)
        spec = request.release(plan.n_vars)
        means, variances, _, order = _hvg.rank_genes(
            released, spec, _hvg.DEFAULT_SQUARE_CLIP, 3.0, "second_moment"
        )
        genes = np.sort(order[:PIPELINE_GENES])
        index += 1
    request = Request("pca", index, plan.sigmas["pca"], genes=genes)
    S = _pca.from_upper(release_sum(request), len(genes))
    all_genes = reads_all_genes(S, plan.sigmas["pca"])
    loadings, block, eigenvalues = _pca.loadings(
        S, plan.n_comps, None if all_genes else plan.gene_block, not all_genes
    )
    index += 1

    def release_table(assignment: _kmeans.Assignment) -> tuple:
        nonlocal index
        table_request = Request("kmeans", index, plan.sigmas["kmeans"], genes, loadings, assignment)
        noisy = release_sum(table_request)
        index += 1
        return _kmeans.split_table(
            noisy, assignment.n_rows, plan.n_comps, CLIP_NORM, plan.kmeans["count_scale"]
        )

    centroids, in_use = _kmeans.dp_kmeans_centroids(
        release_table,
        plan.n_clusters,
        plan.n_comps,
        noise_multiplier=plan.sigmas["kmeans"],
        clip_norm=CLIP_NORM,
        random_state=plan.random_state,
        return_in_use=True,
        **plan.kmeans,
    )
    if index != plan.n_releases:
        raise RuntimeError(
            f"The clustering made {index} releases, its plan {plan.n_releases}; nothing is released."
        )
    return ClusterResult(
        genes, loadings, block, eigenvalues, centroids, means, variances, index, clusters_in_use=in_use
    )


def reads_all_genes(S_noisy: np.ndarray, noise_multiplier: float) -> bool:
    r"""Whether the loadings come from all kept genes (mean component kept) or from the block.

    The release adds to :math:`S = \sum_i z_i z_i^\top` (G × G, sensitivity 1) a symmetric Gaussian
    matrix with entry sd σ, whose spectral norm is about :math:`2\sigma\sqrt{G}` (the semicircle
    edge; Bai & Yin 1988), while the cells' signal eigenvalues grow with n, read here from the
    released trace :math:`\operatorname{tr}\tilde S \approx n` (unit-norm cells). When

    .. math:: 2\sigma\sqrt{G} \le \tau\,\operatorname{tr}\tilde S
       \qquad (\tau = \text{ALL\_GENES\_NOISE\_SHARE})

    the eigenvectors of all G genes are accurate enough and the mean component is kept (the design
    whose noise-free limit is scanpy's); otherwise the :data:`GENE_BLOCK` genes with the largest
    noisy second moments cut the noise's norm by :math:`\sqrt{G / 500}` and the mean component is
    dropped. Post-processing of the released matrix (no privacy cost, the same on every site of a
    federation); without noise (σ = 0) always all genes.
    """
    trace = max(float(np.trace(S_noisy)), 0.0)
    return 2.0 * noise_multiplier * np.sqrt(S_noisy.shape[0]) <= ALL_GENES_NOISE_SHARE * trace


def central_release_sum(matrix: Any, noise, prefix: str = "tl.cluster") -> ReleaseSum:
    """``release_sum`` over cells held in one place: the exact sum, plus the release's noise."""
    n_vars = matrix.shape[1]

    def release(request: Request) -> np.ndarray:
        spec = request.release(n_vars)
        return spec.release(
            contribution(request, matrix), noise.stream(f"{prefix}.{request.kind}", request.index)
        )

    return release
