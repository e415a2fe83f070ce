"""``dpsc.pp.partition``: assign cells to simulated sites (clients)."""

from __future__ import annotations

import anndata as ad
import numpy as np
import pandas as pd


def partition(
    adata: ad.AnnData,
    n_clients: int = 4,
    *,
    label_key: str | None = None,
    types_per_client: int | None = None,
    random_state: int = 0,
    key_added: str = "client",
) -> None:
    """Split the cells among ``n_clients`` sites; writes ``obs[key_added]`` (categorical).

    IID (``types_per_client=None``): a random permutation cut into near-equal parts. Non-IID
    (the FedSC paper's split): site ``c`` holds the cell types ``(c·t + j) mod T`` for
    ``j < t`` (``t = types_per_client``, ``T`` types in ``obs[label_key]``); the cells of a type
    held by several sites are divided evenly among them at random. Every cell goes to exactly one
    site; this needs ``n_clients · t ≥ T``.
    """
    if n_clients < 2:
        raise ValueError(f"n_clients must be at least 2, got {n_clients}.")
    rng = np.random.default_rng(random_state)
    client = np.empty(adata.n_obs, dtype=int)
    if types_per_client is None:
        for c, idx in enumerate(np.array_split(rng.permutation(adata.n_obs), n_clients)):
            client[idx] = c
    else:
        if label_key is None or label_key not in adata.obs:
            raise ValueError("A non-IID split needs label_key, a column of adata.obs with the cell types.")
        types = list(pd.unique(adata.obs[label_key].astype(str)))
        n_types = len(types)
        if not 1 <= types_per_client <= n_types or n_clients * types_per_client < n_types:
            raise ValueError(
                f"types_per_client={types_per_client} with {n_clients} clients cannot cover all "
                f"{n_types} cell types; need 1 ≤ types_per_client ≤ {n_types} and "
                f"n_clients·types_per_client ≥ {n_types}."
            )
        owners: dict[int, list[int]] = {t: [] for t in range(n_types)}
        for c in range(n_clients):
            for j in range(types_per_client):
                t = (c * types_per_client + j) % n_types
                if c not in owners[t]:
                    owners[t].append(c)
        labels = adata.obs[label_key].astype(str).to_numpy()
        for t, name in enumerate(types):
            idx = rng.permutation(np.flatnonzero(labels == name))
            for owner, part in zip(owners[t], np.array_split(idx, len(owners[t])), strict=True):
                client[part] = owner
    adata.obs[key_added] = pd.Categorical(client.astype(str), categories=[str(c) for c in range(n_clients)])
