"""Load and use a model exported with :meth:`DPDCAN.export_shared` (encoder + centroids)."""

from __future__ import annotations

import json
from pathlib import Path

import anndata as ad
import numpy as np
import pandas as pd
import torch

from .. import _blocks
from .._validation import get_matrix
from ..module import DCANModule, clean_input


class SharedEncoder:
    """The privatised part of a DP-DCAN model, as received by another site.

    Holds the encoder, the centroids and the privacy record; has no decoder. Anything computed
    with it on the receiving site's own cells is post-processing of the DP release.

    Parameters
    ----------
    module
        A DCAN module whose encoder and centroids are loaded (its decoder stays untrained).
    var_names
        Genes, in the order the encoder expects.
    privacy
        The privacy record of the fit that produced the weights.
    """

    def __init__(
        self,
        module: DCANModule,
        var_names: list[str],
        privacy: dict,
        partition_centroids: np.ndarray | None = None,
    ):
        self.module = module.eval()
        self.var_names = var_names
        self.privacy = privacy
        self.partition_centroids = partition_centroids

    @classmethod
    def load(cls, dir_path: str | Path) -> SharedEncoder:
        """Read a directory written by :meth:`DPDCAN.export_shared`."""
        path = Path(dir_path)
        meta_file = path / "shared_encoder.json"
        if not meta_file.exists():
            raise FileNotFoundError(f"{path} holds no shared model (missing {meta_file.name}).")
        meta = json.loads(meta_file.read_text())
        module = DCANModule(
            n_input=len(meta["var_names"]),
            n_clusters=meta["n_clusters"],
            n_latent=meta["n_latent"],
            n_hidden=tuple(meta["n_hidden"]),
            likelihood=meta["likelihood"],
            latent_scale=meta["latent_scale"],
            input_pcs=meta.get("input_pcs"),
            residual=meta.get("residual", False),
        )
        state = torch.load(path / "shared_encoder.pt", map_location="cpu", weights_only=True)
        missing = module.load_state_dict(state, strict=False)
        if missing.unexpected_keys:
            raise ValueError(f"Unexpected weights in shared model: {missing.unexpected_keys}")
        start = meta.get("partition_centroids")
        return cls(module, meta["var_names"], meta["privacy"], None if start is None else np.asarray(start))

    def _gene_columns(self, adata: ad.AnnData) -> np.ndarray:
        """Positions in ``adata.var_names`` of the genes the encoder reads, in its order."""
        missing = [g for g in self.var_names if g not in adata.var_names]
        if missing:
            raise ValueError(
                f"{len(missing)} gene(s) the encoder needs are missing from adata.var_names "
                f"(first: {missing[:3]}). Subset/reorder to the shared model's var_names."
            )
        return adata.var_names.get_indexer(self.var_names)

    @torch.no_grad()
    def get_latent_representation(self, adata: ad.AnnData, layer: str | None = None) -> np.ndarray:
        """Latent codes of the cells in ``adata``, encoded one row block at a time (no dense copy)."""
        columns = self._gene_columns(adata)
        module = self.module

        def encode(block: np.ndarray) -> np.ndarray:
            x = clean_input(torch.as_tensor(block), module.likelihood)
            return module.encode(module.represent(x)).numpy()

        return _blocks.map_rows(get_matrix(adata, layer), encode, module.n_latent, columns=columns)

    @torch.no_grad()
    def predict(
        self, adata: ad.AnnData, layer: str | None = None, key_added: str | None = None
    ) -> np.ndarray | None:
        """Cluster labels from the shared centroids, as ``dpsc.tl.fit`` writes them.

        With ``key_added``, writes ``adata.obs[key_added]`` (categorical, categories ``"0"`` …
        ``str(n_clusters - 1)``) and returns ``None``; otherwise returns the labels as strings.
        When the fit kept the partition of the clustering it started from, each cell's nearest of
        those released centroids to its input point. Everything computed here is post-processing of
        the released encoder and centroids.
        """
        if self.partition_centroids is not None:
            from ._dpdcan import start_labels

            module, start = self.module, self.partition_centroids

            def nearest(block: np.ndarray) -> np.ndarray:
                return start_labels(module, torch.as_tensor(block), start)[:, None].astype(np.float32)

            matrix = get_matrix(adata, layer)
            labels = _blocks.map_rows(matrix, nearest, 1, columns=self._gene_columns(adata))[:, 0]
            labels = labels.astype(np.int64).astype(str)
        else:
            z = torch.as_tensor(self.get_latent_representation(adata, layer))
            labels = self.module.soft_assignment(z).argmax(1).numpy().astype(str)
        if key_added is None:
            return labels
        categories = [str(i) for i in range(self.module.n_clusters)]
        adata.obs[key_added] = pd.Categorical(labels, categories=categories)
        return None
