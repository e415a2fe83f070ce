"""``dpsc.pp.partition``: assign cells to simulated sites."""

from __future__ import annotations

import anndata as ad
import numpy as np
import pandas as pd

from .._api import renamed_arguments, result_target


@renamed_arguments("dpsc.pp.partition", n_clients="n_sites", types_per_client="types_per_site")
def partition(
    adata: ad.AnnData,
    n_sites: int = 4,
    *,
    label_key: str | None = None,
    types_per_site: int | None = None,
    random_state: int = 0,
    key_added: str = "site",
    copy: bool = False,
) -> ad.AnnData | None:
    """Split the cells among ``n_sites`` simulated sites; writes ``obs[key_added]`` (categorical).

    IID (``types_per_site=None``): a random permutation cut into near-equal parts. Non-IID
    (the FedSC paper's split): site ``c`` holds the cell types ``(c·t + j) mod T`` for
    ``j < t`` (``t = types_per_site``, ``T`` types in ``obs[label_key]``); the cells of a type
    held by several sites are divided evenly among them at random. Every cell goes to exactly one
    site; this needs ``n_sites · t ≥ T``. Reads no expression value (a simulation of sites for
    notebooks and benchmarks; a real federation's sites are its hospitals).

    Parameters
    ----------
    adata
        The cells.
    n_sites
        Number of sites (at least 2).
    label_key
        ``obs`` column of the cell types (non-IID split only).
    types_per_site
        Cell types per site (non-IID); ``None``: an IID split.
    random_state
        Seed of the split.
    key_added
        ``obs`` column of each cell's site (what ``tl.cluster_federated`` and ``tl.fit_federated``
        read as ``site_key``).
    copy
        Return an annotated copy instead of writing into ``adata``.

    Returns
    -------
    ``None``, or the new AnnData with ``copy=True``.
    """
    if n_sites < 2:
        raise ValueError(f"n_sites must be at least 2, got {n_sites}.")
    rng = np.random.default_rng(random_state)
    site = np.empty(adata.n_obs, dtype=int)
    if types_per_site is None:
        for c, idx in enumerate(np.array_split(rng.permutation(adata.n_obs), n_sites)):
            site[idx] = c
    else:
        if label_key is None or label_key not in adata.obs:
            raise ValueError("A non-IID split needs label_key, a column of adata.obs with the cell types.")
        types = list(pd.unique(adata.obs[label_key].astype(str)))
        n_types = len(types)
        if not 1 <= types_per_site <= n_types or n_sites * types_per_site < n_types:
            raise ValueError(
                f"types_per_site={types_per_site} with {n_sites} sites cannot cover all "
                f"{n_types} cell types; need 1 ≤ types_per_site ≤ {n_types} and "
                f"n_sites·types_per_site ≥ {n_types}."
            )
        owners: dict[int, list[int]] = {t: [] for t in range(n_types)}
        for c in range(n_sites):
            for j in range(types_per_site):
                t = (c * types_per_site + j) % n_types
                if c not in owners[t]:
                    owners[t].append(c)
        labels = adata.obs[label_key].astype(str).to_numpy()
        for t, name in enumerate(types):
            idx = rng.permutation(np.flatnonzero(labels == name))
            for owner, part in zip(owners[t], np.array_split(idx, len(owners[t])), strict=True):
                site[part] = owner
    target = result_target(adata, copy)
    target.obs[key_added] = pd.Categorical(site.astype(str), categories=[str(c) for c in range(n_sites)])
    return target if copy else None
