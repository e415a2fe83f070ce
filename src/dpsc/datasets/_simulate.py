r"""A synthetic atlas: negative-binomial counts fitted once on a real data set (PBMC 4k by default).

The model (one per source data set, :func:`fit_atlas_model`): a cell of type :math:`t` takes the
library size :math:`L` of a source cell of type :math:`t` drawn uniformly (the empirical
library-size distribution of that type), and its count of gene :math:`g` is

.. math::
    x_{g} \sim \mathrm{NB}(\mu = L\,p_{tg},\ \theta_{tg}), \qquad
    P(x_g = 0) = \Bigl(\frac{\theta_{tg}}{\theta_{tg} + \mu}\Bigr)^{\theta_{tg}},

with :math:`p_{tg} = \sum_{c \in t} x_{cg} / \sum_{c \in t} L_c` the type's share of gene
:math:`g` and the inverse dispersion :math:`\theta_{tg}` from the moments of the type's counts,
:math:`\mathbb E[x^2 - x \mid L] = (L p)^2 (1 + 1/\theta)`, so
:math:`1/\theta = \sum_c (x_{cg}^2 - x_{cg}) / (p_{tg}^2 \sum_c L_c^2) - 1`, clipped to
:math:`[10^{-4}, 10^{2}]`. Type fractions are those of the source.

Sampling never holds a dense count matrix: cells are drawn in chunks; within a chunk a
uniform per (cell, gene) decides zero or not against :math:`P(x_g = 0)`, and only the nonzero
entries get a value, from the zero-truncated NB (rejection from the NB where
:math:`P(x > 0) \ge 1/2`, inverse CDF by the recurrence
:math:`P(k) = P(k-1)\,\frac{k - 1 + \theta}{k}\,\frac{\mu}{\mu + \theta}` elsewhere). Chunks
have their own random streams (spawned from ``random_state``), so the result does not depend on
``n_jobs``.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import anndata as ad
import numpy as np
import pandas as pd
import scipy.sparse as sp

_INV_THETA_RANGE = (1e-4, 1e2)


@dataclass(frozen=True)
class AtlasModel:
    r"""Parameters of the negative-binomial atlas model (see the module docstring).

    Attributes
    ----------
    cell_types
        Type names, ``(K,)``.
    type_fractions
        Share of each type among the source cells, ``(K,)``.
    gene_shares
        :math:`p_{tg}`, ``(K, G)``, rows sum to 1.
    theta
        Inverse dispersions :math:`\theta_{tg}`, ``(K, G)``.
    library_sizes
        Library size of every source cell, ``(n_source,)``.
    source_types
        Type index of every source cell, ``(n_source,)``.
    var_names
        Gene names, ``(G,)``.
    source
        Where the parameters were fitted.
    """

    cell_types: np.ndarray
    type_fractions: np.ndarray
    gene_shares: np.ndarray
    theta: np.ndarray
    library_sizes: np.ndarray
    source_types: np.ndarray
    var_names: np.ndarray
    source: str

    def zero_probability(self) -> np.ndarray:
        """:math:`P(x_g = 0)` for a cell with each source cell's library size and type, ``(n_source, G)``."""
        theta = self.theta[self.source_types]
        mu = self.library_sizes[:, None] * self.gene_shares[self.source_types]
        return np.exp(-theta * np.log1p(mu / theta))


def fit_atlas_model(adata: ad.AnnData, labels_key: str = "cell_type", layer: str | None = None) -> AtlasModel:
    """Fit the atlas model to the raw counts of ``adata`` with types in ``obs[labels_key]``.

    Parameters
    ----------
    adata
        Raw counts (cells × genes), sparse or dense.
    labels_key
        Column of ``obs`` with the cell types.
    layer
        Read counts from ``layers[layer]`` instead of ``X``.

    Returns
    -------
    AtlasModel
        Per-type gene shares and inverse dispersions (moment estimates, module docstring), type
        fractions and the source library sizes.
    """
    if labels_key not in adata.obs:
        raise KeyError(f"obs[{labels_key!r}] not found: pass labels_key= naming the cell-type column.")
    counts = sp.csr_matrix(adata.layers[layer] if layer else adata.X, dtype=np.float64)
    types = pd.Categorical(adata.obs[labels_key])
    codes = types.codes
    library = np.asarray(counts.sum(axis=1)).ravel()
    shares, inv_theta = [], []
    for t in range(len(types.categories)):
        rows = counts[codes == t]
        total = np.asarray(rows.sum(axis=0)).ravel()
        p = total / library[codes == t].sum()
        excess = np.asarray(rows.multiply(rows).sum(axis=0)).ravel() - total  # sum of x^2 - x
        denom = p**2 * np.sum(library[codes == t] ** 2)
        with np.errstate(divide="ignore", invalid="ignore"):
            inv = np.where(denom > 0, excess / denom - 1.0, _INV_THETA_RANGE[0])
        shares.append(p)
        inv_theta.append(np.clip(inv, *_INV_THETA_RANGE))
    return AtlasModel(
        cell_types=np.asarray(types.categories, dtype=str),
        type_fractions=np.bincount(codes, minlength=len(types.categories)) / len(codes),
        gene_shares=np.vstack(shares),
        theta=1.0 / np.vstack(inv_theta),
        library_sizes=library,
        source_types=codes.astype(np.int64),
        var_names=np.asarray(adata.var_names, dtype=str),
        source=str(adata.uns.get("dpsc_dataset", {}).get("name", "user data")),
    )


def _zero_truncated_nb(
    mu: np.ndarray, theta: np.ndarray, p0: np.ndarray, rng: np.random.Generator
) -> np.ndarray:
    r"""Draw :math:`x \sim \mathrm{NB}(\mu, \theta)` conditioned on :math:`x > 0`, one per entry."""
    out = np.zeros(mu.shape, dtype=np.float64)
    reject = p0 <= 0.5  # P(x > 0) >= 1/2: redraw the NB until positive (at most 2 rounds expected)
    todo = np.flatnonzero(reject)
    while todo.size:
        draw = rng.poisson(rng.gamma(theta[todo], mu[todo] / theta[todo]))
        out[todo] = draw
        todo = todo[draw == 0]
    idx = np.flatnonzero(~reject)  # mostly zero: inverse CDF from k = 1 up
    target = p0[idx] + rng.random(idx.size) * (1.0 - p0[idx])
    ratio = mu[idx] / (mu[idx] + theta[idx])
    pmf, cdf, th = p0[idx].copy(), p0[idx].copy(), theta[idx]
    k = 0
    while idx.size:
        k += 1
        pmf *= (k - 1 + th) / k * ratio
        cdf += pmf
        done = (cdf >= target) | (pmf < 1e-300)
        out[idx[done]] = k
        keep = ~done
        idx, target, ratio, pmf, cdf, th = (
            idx[keep],
            target[keep],
            ratio[keep],
            pmf[keep],
            cdf[keep],
            th[keep],
        )
    return out


def _simulate_chunk(model: AtlasModel, p0: np.ndarray, groups: np.ndarray, seed: np.random.SeedSequence):
    """CSR pieces (data, indices, nonzeros per row) of the cells whose source cells are ``groups``."""
    rng = np.random.default_rng(seed)
    nonzero = rng.random((groups.size, p0.shape[1]), dtype=np.float32) >= p0[groups]
    rows, cols = np.nonzero(nonzero)
    del nonzero
    src = groups[rows]
    types = model.source_types[src]
    mu = model.library_sizes[src] * model.gene_shares[types, cols]
    theta = model.theta[types, cols]
    values = _zero_truncated_nb(mu, theta, p0[src, cols].astype(np.float64), rng)
    return values.astype(np.float32), cols.astype(np.int32), np.bincount(rows, minlength=groups.size)


def _concatenate_and_free(parts: list[np.ndarray]) -> np.ndarray:
    """Concatenate ``parts`` and empty the list, so the pieces can be freed."""
    out = np.concatenate(parts)
    parts.clear()
    return out


def simulate(
    n_cells: int,
    *,
    model: AtlasModel | None = None,
    random_state: int = 0,
    chunk_size: int = 8192,
    n_jobs: int = 2,
) -> ad.AnnData:
    """Simulate ``n_cells`` cells of raw counts from an atlas model (by default fitted on PBMC 4k).

    The data are **synthetic**: every cell is a fresh draw from the negative-binomial model of
    the module docstring, fitted on the embedded :func:`dpsc.datasets.pbmc4k` (per-type gene
    shares and dispersions, empirical library sizes per type, type fractions), so a simulated
    cell looks like a PBMC cell of its type to a count model. They carry no gene-gene structure
    beyond the cell type and the library size. Use them for scale work (time, memory, privacy
    cost versus n), not as biology.

    Parameters
    ----------
    n_cells
        Number of cells.
    model
        From :func:`fit_atlas_model`; ``None`` fits one on the embedded PBMC 4k.
    random_state
        Seed of the simulation (public synthetic data; nothing private is drawn here).
    chunk_size
        Cells per chunk: memory holds about ``2 × chunk_size × n_genes × 4`` bytes per job
        beside the sparse result.
    n_jobs
        Threads drawing chunks; the result does not depend on it.

    Returns
    -------
    AnnData
        ``X``: sparse CSR float32 counts; ``obs["cell_type"]``: categorical types;
        ``uns["dpsc_dataset"]`` says it is synthetic and where the model was fitted.
    """
    if n_cells < 1:
        raise ValueError(f"n_cells must be a positive integer, got {n_cells}.")
    if model is None:
        from ._embedded import pbmc4k

        model = fit_atlas_model(pbmc4k())
    rng = np.random.default_rng(random_state)
    types = rng.choice(len(model.cell_types), size=n_cells, p=model.type_fractions)
    groups = np.empty(n_cells, dtype=np.int64)
    for t in range(len(model.cell_types)):
        members = np.flatnonzero(model.source_types == t)
        where = types == t
        groups[where] = members[rng.integers(0, members.size, where.sum())]
    p0 = model.zero_probability().astype(np.float32)
    starts = range(0, n_cells, chunk_size)
    seeds = np.random.SeedSequence(random_state).spawn(len(starts))
    with ThreadPoolExecutor(max_workers=max(1, n_jobs)) as pool:
        pieces = list(
            pool.map(
                lambda i_s: _simulate_chunk(model, p0, groups[i_s[1] : i_s[1] + chunk_size], seeds[i_s[0]]),
                enumerate(starts),
            )
        )
    values, columns, per_row = (list(part) for part in zip(*pieces, strict=True))
    del pieces
    indptr = np.zeros(n_cells + 1, dtype=np.int64)
    np.cumsum(np.concatenate(per_row), out=indptr[1:])
    data = _concatenate_and_free(values)  # one array's pieces freed before the next is built
    indices = _concatenate_and_free(columns)
    X = sp.csr_matrix((data, indices, indptr), shape=(n_cells, len(model.var_names)))
    obs = pd.DataFrame(
        {"cell_type": pd.Categorical.from_codes(types, categories=list(model.cell_types))},
        index=[f"sim_{i}" for i in range(n_cells)],
    )
    adata = ad.AnnData(X=X, obs=obs, var=pd.DataFrame(index=list(model.var_names)))
    adata.uns["dpsc_dataset"] = {
        "name": "simulated",
        "synthetic": "yes: negative-binomial draws from dpsc.datasets.fit_atlas_model",
        "fitted_on": model.source,
        "random_state": str(random_state),
    }
    return adata
