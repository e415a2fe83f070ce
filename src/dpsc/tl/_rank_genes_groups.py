"""``dpsc.tl.rank_genes_groups``: marker genes of each group from private releases, in scanpy's format.

The mechanism (per-cell rows, their bounds, the per-group table and scanpy's t-test on it) is
:mod:`dpsc.methods.markers`; this module checks the arguments, books the release and writes
``uns[key_added]`` in the structure :func:`scanpy.tl.rank_genes_groups` writes, so that
:func:`scanpy.get.rank_genes_groups_df`, :func:`scanpy.pl.rank_genes_groups` and
:func:`scanpy.pl.rank_genes_groups_dotplot` read it unchanged.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import anndata as ad
import numpy as np
import pandas as pd

from dpsc._docs import doc_params

from .._api import DEFAULT_EPSILON, result_target, store_result
from .._blocks import is_dask
from .._outputs import write_marker_result
from .._validation import check_cells, check_privacy_args, check_public_counts, get_matrix, resolve_delta
from ..methods import markers as mechanism
from ..privacy import (
    NoiseSource,
    PlannedRelease,
    PrivacyRecord,
    PrivacyUnit,
    ReleasePlan,
    not_covered_for,
    unit_and_weights,
    with_storage_note,
    with_unit,
)
from ._reference import optional_reference

CENTER, NORMS, TABLE = "tl.rank_genes_groups.center", "tl.rank_genes_groups.norms", "tl.rank_genes_groups"
FOCUS_NORMS, FOCUS_TABLE = "tl.rank_genes_groups.focus_norms", "tl.rank_genes_groups.focus"
#: The plan's releases by part, in order (:data:`~dpsc.methods.markers.FOCUSED_SHARES` names the parts).
PARTS = {
    "center": CENTER,
    "norms": NORMS,
    "table": TABLE,
    "focus_norms": FOCUS_NORMS,
    "focus_table": FOCUS_TABLE,
}

#: The focused genes U with a reference's types: ``"types"`` (each reference type's best genes) or
#: ``"union"`` (those and each group's best in the first, private table).
REFERENCE_FOCUS = "types"


def markers_plan(epsilon: float | None, delta: float, public_center: bool = False) -> ReleasePlan:
    """Return the releases sharing (ε, δ), calibrated: centre, norms, table, then the focused two.

    Shares :data:`~dpsc.methods.markers.FOCUSED_SHARES`. Without ε there is no norm histogram
    and no focused table: the frame states the worst-case bounds
    (:func:`~dpsc.methods.markers.release_frame`), so the plan holds only the centre and the
    table, and the statistics are exact. ``public_center``: the centre comes from a public
    reference (:mod:`dpsc.methods.public_markers`), so there is no centre release and its share
    goes to the others (the shares are relative).
    """
    parts = [part for part in PARTS if not (public_center and part == "center")]
    if epsilon is None:
        exact = [part for part in ("center", "table") if part in parts]
        return ReleasePlan.of(*(PlannedRelease(PARTS[part]) for part in exact)).calibrate(None, delta)
    shares = mechanism.FOCUSED_SHARES
    return ReleasePlan.of(*(PlannedRelease(PARTS[part], share=shares[part]) for part in parts)).calibrate(
        epsilon, delta
    )


def markers_sigmas(plan: ReleasePlan) -> dict[str, float]:
    """Return the plan's σ by part (:data:`PARTS`); 0 for a part a plan without ε does not make."""
    return {part: plan.sigma(name) if name in plan else 0.0 for part, name in PARTS.items()}


def markers_record(
    plan: ReleasePlan,
    n_obs: int,
    groupby: str,
    noise: NoiseSource,
    reference: dict | None = None,
    unit: PrivacyUnit | None = None,
) -> PrivacyRecord:
    """Record of the Gaussian releases (centre, norm histograms, group table, focused two); none without ε.

    ``reference``: what the record states of a public reference that gave the centre (and the
    focused genes, with its types); its statement says it is assumed public.
    """
    tool, covered = (
        "tl.rank_genes_groups",
        f"the marker table in uns (every gene's statistics in every group of obs[{groupby!r}])",
    )
    if plan.epsilon is None:
        return plan.record(tool, unit=f"one of the {n_obs} cells", mechanism="", covered=covered)
    sigmas = {part: sigma for part, sigma in markers_sigmas(plan).items() if PARTS[part] in plan}
    unit = PrivacyUnit() if unit is None else unit
    record = plan.record(
        tool,
        unit=f"{unit.relation(n_obs)} (with each cell's value of obs[{groupby!r}])",
        mechanism=_mechanism_words(reference) + unit.weighting,
        covered=f"{covered}, the released centre, bounds and focused genes, and anything computed from them",
        not_covered=f"{not_covered_for(unit.name)}; the groups themselves (obs[{groupby!r}] is read as "
        "part of each cell: when it comes from a private clustering, that clustering's ε covers it); plots "
        "such as sc.pl.rank_genes_groups_dotplot, which read the cells again on this machine"
        + _reference_words(reference),
        noise=noise,
        mechanisms=[f"{name}: sigma={sigma:.4g}" for name, sigma in sigmas.items()],
        sensitivity=mechanism.SENSITIVITY,
        scope="marker genes",
        details={"noise_multipliers": sigmas, **({} if reference is None else {"reference": reference})},
    )
    return with_unit(record, unit)


def _reference_words(reference: dict | None) -> str:
    """Return what the guarantee does not cover of a public reference (nothing without one)."""
    if reference is None:
        return ""
    return (
        f"; the public reference {reference['name']!r} (sha256 {reference['fingerprint'][:16]}…, "
        f"{reference['n_obs']} cells): it is assumed public and must not contain these cells, and no "
        "epsilon is spent on it"
    )


def _mechanism_words(reference: dict | None) -> str:
    """Return the record's mechanism: the releases, and what a public reference gave instead."""
    if reference is None:
        center = (
            "five discrete Gaussian releases composed by the Opacus RDP accountant: the cells' mean "
            "log1p(CP10k) expression (the centre the cells are measured from), "
        )
    else:
        center = (
            "four discrete Gaussian releases composed by the Opacus RDP accountant, the cells measured "
            f"from the public reference {reference['name']!r}'s mean log1p(CP10k) expression (no ε): "
        )
    focus = f"the union of each group's {mechanism.FOCUS_GENES} best genes in that table"
    if reference is not None and reference.get("reference_key"):
        focus = (
            f"the union of each reference type's {mechanism.FOCUS_GENES} best genes in the public "
            "reference (scanpy's t-test; no ε)"
        )
    return (
        f"{center}histograms of the cells' norms from it (which set the bounds of the sums), then "
        "per-group sums of each cell's expression from the centre (each gene weighted by a function of "
        "the centre), its squares and its detected genes, and the group sizes (each cell adds to its own "
        f"group only; every part bounded); then the same two over {focus} (histograms of the shorter "
        "norms there, and the focused table)"
    )


def frame_releases(
    matrix, sigmas: dict[str, float], releases, private: bool, weights: np.ndarray | None = None
) -> tuple:
    """Return the two releases of the first table's frame over these cells (``mechanism.release_frame``).

    Without ε (``private`` false) the centre's sums are exact and no histogram is released.
    ``weights``: each cell's weight in every sum (the donor unit's 1/m_d, row by row).
    """

    def release_center() -> np.ndarray:
        exact = mechanism.center_sum(matrix, weights)
        if not private:
            return exact
        release = mechanism.center_release(matrix.shape[1], sigmas["center"])
        return release.release(exact, releases.stream(CENTER))

    def release_norms(frame: mechanism.MarkerFrame) -> np.ndarray:
        exact = mechanism.norm_histograms(matrix, frame.center, weights=weights)
        return mechanism.norm_release(sigmas["norms"]).release(exact, releases.stream(NORMS))

    return release_center, release_norms if private else None


def focused_markers(
    matrix,
    codes: np.ndarray,
    n_groups: int,
    first: mechanism.MarkerResult,
    frame,
    sigmas,
    releases,
    genes: np.ndarray | None = None,
    weights: np.ndarray | None = None,
) -> tuple[mechanism.MarkerResult, np.ndarray, mechanism.MarkerTable]:
    """Release the focused table over U (:func:`~dpsc.methods.markers.focus_genes`) and join the rankings.

    U and its centre and weights are post-processing of the first table and centre (or U is
    ``genes``, public: a reference's); then one release of the histograms of the cells' norms over
    U (their bounds) and one of the table over U. Returns the joined ranking, U and the focused
    table's layout. ``weights``: each cell's weight in the sums (the donor unit).
    """
    own = mechanism.focus_genes(first)
    if genes is None:
        genes = own
    elif REFERENCE_FOCUS == "union":  # the reference types' genes and the first table's best
        genes = np.union1d(np.asarray(genes), own)
    else:
        genes = np.asarray(genes)
    center = np.asarray(frame.center)[genes]
    histograms = mechanism.norm_histograms(matrix, center, genes, weights)
    norms_release = mechanism.norm_release(sigmas["focus_norms"])
    released_norms = norms_release.release(histograms, releases.stream(FOCUS_NORMS))
    table = mechanism.MarkerTable(
        n_groups, len(genes), mechanism.focused_frame(released_norms, frame, genes), columns=genes
    )
    release = mechanism.marker_release(table, sigmas["focus_table"])
    exact = mechanism.group_table(matrix, codes, table, weights)
    released = release.release(exact, releases.stream(FOCUS_TABLE))
    focused = mechanism.rank_markers(mechanism.group_statistics(released, table, release))
    return mechanism.focused_result(first, focused, genes), genes, table


def _group_codes(adata: ad.AnnData, groupby: str, groups: Sequence[str] | None) -> tuple[np.ndarray, list]:
    """Each cell's code among the groups (−1: in none) and the group names; reads metadata only."""
    if groupby not in adata.obs:
        raise KeyError(f"groupby={groupby!r} is not a column of adata.obs; run dpsc.tl.cluster first.")
    column = adata.obs[groupby]
    if not isinstance(column.dtype, pd.CategoricalDtype):
        raise ValueError(
            f"adata.obs[{groupby!r}] is not categorical: the groups must be known without reading the cells. "
            f"Make it categorical (adata.obs[{groupby!r}] = adata.obs[{groupby!r}].astype('category')) or "
            "name the groups with groups=[...]."
        )
    names = [str(g) for g in groups] if groups is not None else _released_groups(adata, groupby, column)
    if len(names) < 2 or len(set(names)) != len(names):
        raise ValueError(f"rank_genes_groups needs at least 2 distinct groups, got {names}.")
    lookup = {name: k for k, name in enumerate(names)}
    codes = np.array([lookup.get(str(v), -1) if pd.notna(v) else -1 for v in column], dtype=np.int64)
    return codes, names


def _released_groups(adata: ad.AnnData, groupby: str, column: pd.Series) -> list[str]:
    """Return the groups of ``obs[groupby]``: all of a dpsc clustering's (its record), else the categories.

    A dpsc clustering's ``obs`` column leaves out clusters no cell is nearest
    (:func:`dpsc._outputs.cluster_labels`); which those are is read from the cells, so the groups
    of the release come from its record, a public count.
    """
    for key, result in adata.uns.get("dpsc", {}).items():
        params = result.get("params", {}) if isinstance(result, dict) else {}
        if groupby in (key, params.get("cluster_key")) and "n_clusters" in params:
            return [str(i) for i in range(int(params["n_clusters"]))]
    return [str(c) for c in column.cat.categories]


@doc_params
def rank_genes_groups(
    adata: ad.AnnData,
    groupby: str = "dp_cluster",
    *,
    groups: Sequence[str] | None = None,
    n_genes: int | None = 100,
    pts: bool = True,
    epsilon: float | None = DEFAULT_EPSILON,
    delta: float | None = None,
    layer: str | None = None,
    reference: ad.AnnData | str | os.PathLike | None = None,
    reference_key: str | None = None,
    donor_key: str | None = None,
    noise_seed: int | None = None,
    key_added: str = "rank_genes_groups",
    copy: bool = False,
) -> ad.AnnData | None:
    """Rank marker genes of each group from differentially private releases, as scanpy does.

    A Gaussian release of a groups × (3G + 1) table: per group, the sums of each cell's
    log1p(CP10k) expression measured from the cells' mean, of its squares and of its detected
    genes, and the group's size (:mod:`dpsc.methods.markers` states the bounds; each cell adds to
    its own group only, so one cell moves the table by at most Δ whatever the groups are). The
    mean (it also sets each gene's weight) and the bounds of the two expression parts (histograms
    of the cells' norms from the mean) are released first: the noise of every mean and variance is
    proportional to those bounds, and a cell is shorter measured from the mean than from 0. Then
    the bounds and the table again over the union of each group's best genes in that table
    (:data:`~dpsc.methods.markers.FOCUS_GENES` per group): restricted to them the cells are much
    shorter, so the genes that can reach a group's top ranks get statistics with less noise, and
    they rank first. Shares of ε: :data:`~dpsc.methods.markers.FOCUSED_SHARES`.
    Then scanpy's t-test of each
    group against the rest on the noisy statistics (post-processing), with the known noise of the
    two means added to the standard error so that differences within the noise do not rank high;
    log fold changes and the fraction of cells expressing each gene as scanpy computes them.
    Proven (ε, δ)-DP for the marker table with respect to adding or removing one cell; the ε
    joins the AnnData's ledger. To name clusters within one budget, split it:
    ``eps_cluster, eps_markers = dpsc.privacy.split_budget(...)`` or simply
    ``tl.cluster(adata, k, epsilon=6)`` then ``tl.rank_genes_groups(adata, epsilon=2)``.

    Parameters
    ----------
    adata
        Cells × genes, raw counts.
    groupby
        Categorical ``obs`` column of the groups (default: :func:`dpsc.tl.cluster`'s clusters).
        Its categories are the groups (public metadata); a cell in none of them adds nothing.
    groups
        Rank only these groups (against the rest of the cells in them); ``None``: every category.
    n_genes
        Genes kept per group in the result (``None``: every gene).
    pts
        Also write the fraction of cells expressing each gene (``pts``, ``pts_rest``).
    epsilon, delta
        The release's (ε, δ); ``epsilon=None``: exact statistics, no privacy (a reference run).
        ``delta=None``: 10⁻⁵, or 1/(10 n) above 10⁴ cells.
    layer
        Layer with the counts; ``None`` for ``X``.
    reference
        A public reference of the same tissue (an AnnData of raw counts or an ``.h5ad`` path; another
        donor, study or condition, never these cells): the cells are measured from its mean
        expression instead of a released one (:mod:`dpsc.methods.public_markers`), so no ε goes to
        the centre. Stated in the record; no ε is spent on it.
    reference_key
        ``obs`` column of the reference's cell types: the focused table reads each type's best
        genes in the reference (scanpy's t-test, public) instead of those of the first, noisy table.
    donor_key
        {doc_donor_key}
    noise_seed
        {doc_noise_seed}
    key_added
        ``uns`` key of the scanpy-format result; the record goes to ``uns["dpsc"][key_added]``.
    copy
        {doc_copy}

    Returns
    -------
    ``None``, or the new AnnData with ``copy=True``. Writes ``uns[key_added]`` with scanpy's
    fields (``params``, ``names``, ``scores``, ``pvals``, ``pvals_adj``, ``logfoldchanges``,
    ``pts``, ``pts_rest``), and ``uns["dpsc"][key_added]`` with the record and the noisy group
    sizes (a group whose noisy size is below twice its noise has markers that are mostly noise:
    ``groups_below_noise`` lists them) and, with ε, how many genes the focused table read
    (``focus_genes``; each group's ranking lists them first).
    """
    delta = resolve_delta(delta, adata.n_obs)
    matrix = get_matrix(adata, layer)
    check_privacy_args(epsilon, delta, adata.n_obs)
    check_public_counts(adata, layer, True, "dpsc.tl.rank_genes_groups")
    check_cells(adata, get_matrix(adata, layer), "dpsc.tl.rank_genes_groups")
    codes, names = _group_codes(adata, groupby, groups)
    if n_genes is not None and (isinstance(n_genes, bool) or int(n_genes) < 1):
        raise ValueError(f"n_genes must be a positive integer or None, got {n_genes!r}.")
    kept = adata.n_vars if n_genes is None else min(int(n_genes), adata.n_vars)
    unit, weights = unit_and_weights(adata, donor_key, "dpsc.tl.rank_genes_groups")
    public = public_marker_parts(reference, reference_key, adata)
    plan = markers_plan(epsilon, delta, public_center=public is not None)
    sigmas = markers_sigmas(plan)
    noise = NoiseSource(noise_seed)
    summary = None if public is None else public.summary
    record = markers_record(plan, adata.n_obs, groupby, noise, summary, unit)
    record = with_storage_note(record, is_dask(matrix))
    with plan.spend(adata, record, key_added, noise) as releases:
        frame = marker_frame(matrix, sigmas, releases, epsilon is not None, public, weights)
        table = mechanism.MarkerTable(len(names), adata.n_vars, frame)
        release = mechanism.marker_release(table, sigmas["table"])
        exact = mechanism.group_table(matrix, codes, table, weights)
        released = exact if epsilon is None else release.release(exact, releases.stream(TABLE))
        result = mechanism.rank_markers(mechanism.group_statistics(released, table, release))
        focus = {}
        if epsilon is not None:
            chosen = None if public is None else public.focus_genes
            result, genes, focused = focused_markers(
                matrix, codes, len(names), result, frame, sigmas, releases, chosen, weights
            )
            focus = {"focus_genes": len(genes), "focus_expression_bound": focused.bounds["sum"]}
        target = result_target(adata, copy)
        written = write_marker_result(
            target,
            result,
            names,
            groupby,
            n_genes=kept,
            pts=pts,
            layer=layer,
            key=key_added,
            count_noise=release.noise_std * table.scale("count"),
            bounds=table.bounds,
        )
        params = {
            "groupby": groupby,
            "groups": names,
            "layer": layer,
            "donor_key": donor_key,
            **written,
            **focus,
        }
        return store_result(adata, target, key_added, record, params, copy=copy, booking=releases.booking)


@dataclass(frozen=True)
class PublicMarkerParts:
    """What a public reference gives a marker release: its centre, and with its types the genes U."""

    center: np.ndarray
    focus_genes: np.ndarray | None
    summary: dict[str, Any]


def public_marker_parts(
    reference: ad.AnnData | str | os.PathLike | None, reference_key: str | None, adata: ad.AnnData
) -> PublicMarkerParts | None:
    """Read and check the public reference; return its centre and focused genes (reads no private cell)."""
    public = optional_reference(reference, reference_key, adata, "dpsc.tl.rank_genes_groups")
    if public is None:
        return None
    center = public.private_marker_center(adata.n_vars)
    genes = None if public.labels is None else public.focus_genes(mechanism.FOCUS_GENES)
    return PublicMarkerParts(center, genes, public.summary())


def marker_frame(
    matrix,
    sigmas: dict[str, float],
    releases,
    private: bool,
    public: PublicMarkerParts | None,
    weights: np.ndarray | None = None,
) -> mechanism.MarkerFrame:
    """Release the first table's frame: the centre (or the reference's) and the bounds from it."""
    if public is None:
        first = frame_releases(matrix, sigmas, releases, private, weights)
        return mechanism.release_frame(matrix.shape[1], sigmas["center"], *first)
    release_norms = frame_releases(matrix, sigmas, releases, private, weights)[1] if private else None
    return mechanism.frame_from_center(public.center, release_norms)


__all__ = ["rank_genes_groups"]
