"""Load and use a model exported with :meth:`DPDCAN.export_shared` (encoder + centroids)."""

from __future__ import annotations

import json
from pathlib import Path

import anndata as ad
import numpy as np
import scipy.sparse as sp
import torch

from .._validation import _row_blocks, check_matrix, get_matrix
from ..module import DCANModule

ENCODE_ROWS = 4096  # cells encoded at once: a dense block of 4096 x genes floats


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

    def __init__(self, module: DCANModule, var_names: list[str], privacy: dict):
        self.module = module.eval()
        self.var_names = var_names
        self.privacy = privacy

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
        )
        state = torch.load(path / "shared_encoder.pt", map_location="cpu", weights_only=True)
        missing = module.load_state_dict(state, strict=False)
        if missing.unexpected_keys:
            raise ValueError(f"Unexpected weights in shared model: {missing.unexpected_keys}")
        return cls(module, meta["var_names"], meta["privacy"])

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
        matrix = get_matrix(adata, layer)
        z = np.empty((adata.n_obs, self.module.n_latent), dtype=np.float32)
        start = 0
        for block in _row_blocks(matrix, chunk=ENCODE_ROWS):
            block = block[:, columns]
            check_matrix(block, self.module.likelihood, training=False)
            dense = block.toarray() if sp.issparse(block) else np.asarray(block)
            x = torch.as_tensor(dense, dtype=torch.float32)
            z[start : start + len(dense)] = self.module.encode(self.module.represent(x)).numpy()
            start += len(dense)
        return z

    @torch.no_grad()
    def predict(self, adata: ad.AnnData, layer: str | None = None) -> np.ndarray:
        """Cluster labels from the shared centroids."""
        z = torch.as_tensor(self.get_latent_representation(adata, layer))
        return self.module.soft_assignment(z).argmax(1).numpy()
