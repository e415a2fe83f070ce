"""The data sets shipped with dpsc: PBMC 4k (the default), TMS liver (named genes, donors), GDSC."""

from __future__ import annotations

from importlib import resources

import anndata as ad

_PBMC4K_FILE = "pbmc4k_top2000.h5ad"


def _read_embedded(file_name: str, provenance: dict[str, str]) -> ad.AnnData:
    """Read a fresh copy of ``data/<file_name>`` shipped with dpsc and record its provenance."""
    path = resources.files("dpsc.datasets").joinpath("data", file_name)
    with resources.as_file(path) as file:
        adata = ad.read_h5ad(file)
    adata.uns["dpsc_dataset"] = provenance
    return adata


def pbmc4k() -> ad.AnnData:
    """Return 4271 peripheral blood mononuclear cells × 2000 genes of raw UMI counts.

    This is the 10x Genomics PBMC 4k data set (Zheng et al. 2017, Nat Commun 8:14049)
    restricted to the 2000 genes selected by the scDCC authors (Tian et al. 2021), with the
    eight cell-type labels used by scDeepCluster/scDCC. The upstream file carries neither gene
    symbols nor type names, so genes are called ``gene_0000`` … ``gene_1999`` and types
    ``type_1`` … ``type_8`` (upstream label values; 1292, 702, 606, 459, 450, 332, 295, 135
    cells).

    Note that the gene selection was made by the upstream authors *on these cells*: when this
    data set stands in for private data, that selection is outside any dpsc guarantee.

    Returns
    -------
    AnnData
        ``X``: sparse CSR int32 counts; ``obs["cell_type"]``: categorical labels. A fresh copy
        is read on every call, so callers may modify it freely.
    """
    return _read_embedded(
        _PBMC4K_FILE,
        {"name": "pbmc4k_top2000", "source": "ttgump/scDCC@142e4e0 data/Small_Datasets/10X_PBMC_top2000.h5"},
    )


_GDSC_FILE = "gdsc_subset.h5ad"


def gdsc_subset() -> ad.AnnData:
    """Return 90 cancer cell lines × 1350 genes with GDSC2 ln IC50 of 10 drugs (embedded, 0.3 MB).

    Built with :func:`dpsc.datasets.read_gdsc` from the bhklab/CBWWorkshop2024 (@640a507, MIT)
    subsets of GDSC (Iorio et al. 2016, Cell 166:740; Garnett et al. 2012): RNA-seq FPKM of the
    cell lines that also have drug response, ``X = log2(1 + FPKM)`` (float32), one ``obs``
    column per drug (Bortezomib, Entinostat, Erlotinib, Gemcitabine, Irinotecan, Lapatinib,
    Olaparib, Paclitaxel, Pyridostatin, Tamoxifen) holding ``LN_IC50``; NaN where a pair was
    not screened (83–90 cell lines per drug).
    """
    return _read_embedded(
        _GDSC_FILE,
        {
            "name": "gdsc_subset",
            "source": "bhklab/CBWWorkshop2024@640a507 data/GDSC_rnaseq.rda + GDSC_drug_response.rda",
            "target": "LN_IC50",
        },
    )


_TMS_LIVER_FILE = "tms_liver_ligand_receptor.h5ad"


def tms_liver() -> ad.AnnData:
    """Return 1779 mouse liver cells × 1819 named genes of raw read counts, from 9 mice.

    Tabula Muris Senis (Tabula Muris Consortium 2020, Nature 583:590; data CC BY 4.0), liver,
    FACS-sorted cells sequenced with Smart-seq2, as sampled by the scDiffCom package
    (CyrilLagger/scDiffCom, MIT; an earlier version of ``data/seurat_sample_tms_liver.rda``):
    ligand and receptor genes only, with real gene symbols. Two cell types (hepatocyte 1162,
    endothelial cell of hepatic sinusoid 617) from nine mice (79–345 cells each) of two age
    groups. A data set to name clusters from known marker genes and to try the donor unit
    (``donor_key="donor"``) on.

    Returns
    -------
    AnnData
        ``X``: sparse CSR float32 read counts (integers); ``obs["cell_type"]``,
        ``obs["donor"]`` (the mouse) and ``obs["condition"]`` (``YOUNG`` / ``OLD``), all
        categorical. A fresh copy is read on every call.
    """
    return _read_embedded(
        _TMS_LIVER_FILE,
        {
            "name": "tms_liver",
            "source": "CyrilLagger/scDiffCom blob ae0c01b8 data/seurat_sample_tms_liver.rda",
        },
    )
