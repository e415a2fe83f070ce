"""Datasets: small real count matrices shipped with dpsc, readers, a synthetic atlas."""

from ._embedded import gdsc_subset, pbmc4k, tms_liver
from ._gdsc import read_gdsc
from ._readers import read_h5, read_zarr
from ._simulate import AtlasModel, fit_atlas_model, simulate

__all__ = [
    "AtlasModel",
    "fit_atlas_model",
    "gdsc_subset",
    "pbmc4k",
    "read_gdsc",
    "read_h5",
    "read_zarr",
    "simulate",
    "tms_liver",
]
