"""One API shape: every ``pp``/``tl`` function follows scanpy's return rule and names what it writes.

Each function runs on an AnnData that already holds a user's own scanpy results (a PCA, a gene
selection, a marker table, a clustering) with ``key_added`` set to a name containing ``"mine"``:

- in place it returns ``None`` and every new ``obs``/``obsm``/``var``/``varm``/``uns`` key contains
  that name (``uns["dpsc"]``, the records and the ledger, aside);
- the user's results are left exactly as they were;
- with ``copy=True`` it returns a new AnnData and leaves the original's data alone (only its
  privacy ledger gains the entry: the original cells were read).
"""

from __future__ import annotations

import re
import warnings
from collections.abc import Callable

import anndata as ad
import numpy as np
import pandas as pd
import pytest

import dpsc

SLOTS = ("obs", "obsm", "var", "varm", "uns")
USER_KEYS = {
    "obsm": ["X_pca"],
    "varm": ["PCs"],
    "var": ["highly_variable", "means", "variances"],
    "uns": ["pca", "rank_genes_groups"],
    "obs": ["leiden"],
}


def _with_user_results(adata: ad.AnnData) -> ad.AnnData:
    """The AnnData a scanpy user brings: their own PCA, gene selection, markers and clustering."""
    rng = np.random.default_rng(1)
    adata = adata.copy()
    adata.obsm["X_pca"] = rng.normal(size=(adata.n_obs, 5))
    adata.varm["PCs"] = rng.normal(size=(adata.n_vars, 5))
    adata.var["highly_variable"] = rng.random(adata.n_vars) < 0.5
    adata.var["means"] = rng.random(adata.n_vars)
    adata.var["variances"] = rng.random(adata.n_vars)
    adata.uns["pca"] = {"variance_ratio": rng.random(5)}
    adata.uns["rank_genes_groups"] = {"params": {"groupby": "leiden", "method": "wilcoxon"}}
    adata.obs["leiden"] = pd.Categorical(rng.integers(0, 3, adata.n_obs).astype(str))
    adata.obs["response"] = rng.normal(size=adata.n_obs)
    return adata


# scvi-tools' registration of the AnnData a model trained on (``setup_anndata``): the ecosystem's own
# keys, which let ``model.get_latent_representation(adata)`` recognise it.
SCVI_REGISTRY = {"_scvi_uuid", "_scvi_manager_uuid"}


def _keys(adata: ad.AnnData) -> set[tuple[str, str]]:
    skip = {"dpsc", *SCVI_REGISTRY}
    return {(slot, key) for slot in SLOTS for key in getattr(adata, slot).keys() if key not in skip}


def _value(adata: ad.AnnData, slot: str, key: str):
    value = getattr(adata, slot)[key]
    return value.to_numpy() if isinstance(value, pd.Series) else value


def _same(a, b) -> bool:
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    return np.array_equal(np.asarray(a), np.asarray(b))


def _assert_untouched(before: ad.AnnData, after: ad.AnnData, keys) -> None:
    for slot, key in keys:
        assert (slot, key) in _keys(after), f"{slot}[{key!r}] was removed"
        assert _same(_value(before, slot, key), _value(after, slot, key)), f"{slot}[{key!r}] was changed"


def _reference(adata: ad.AnnData) -> ad.AnnData:
    ref = adata.copy()
    ref.obs["cell_type"] = pd.Categorical(ref.obs["cell_type"].astype(str))
    return ref


QUICK = {"instance_epochs": 2, "cluster_epochs": 1, "progress_bar": False, "accelerator": "cpu"}
# name -> (call(adata, key, ref, **copy), the name every output must contain)
CALLS: dict[str, Callable] = {
    "pp.highly_variable_genes": lambda a, r, **kw: dpsc.pp.highly_variable_genes(
        a, 50, key_added="mine", **kw
    ),
    "pp.pca": lambda a, r, **kw: dpsc.pp.pca(a, 5, key_added="mine", **kw),
    "pp.partition": lambda a, r, **kw: dpsc.pp.partition(a, 3, key_added="mine", **kw),
    "tl.cluster": lambda a, r, **kw: dpsc.tl.cluster(a, 3, markers=True, key_added="mine", **kw),
    "tl.kmeans": lambda a, r, **kw: dpsc.tl.kmeans(a, 3, key_added="mine", **kw),
    "tl.fit": lambda a, r, **kw: dpsc.tl.fit(
        a, n_clusters=3, key_added="X_mine", cluster_key="mine_cluster", **QUICK, **kw
    ),
    "tl.rank_genes_groups": lambda a, r, **kw: dpsc.tl.rank_genes_groups(a, "leiden", key_added="mine", **kw),
    "tl.annotate": lambda a, r, **kw: dpsc.tl.annotate(
        a, r, "cell_type", epsilon=2.0, epochs=2, key_added="mine", **kw
    ),
    "tl.private_regression": lambda a, r, **kw: dpsc.tl.private_regression(
        a,
        "response",
        epsilon=2.0,
        genes=list(a.var_names[:2]),
        y_center=0.0,
        y_scale=1.0,
        key_added="mine",
        **kw,
    ),
}
SLOW_CALLS: dict[str, Callable] = {
    "tl.cluster_federated": lambda a, r, **kw: dpsc.tl.cluster_federated(
        a, "leiden", 3, mode="plain", key_added="mine", **kw
    ),
}


def _check_convention(call: Callable, small_adata: ad.AnnData) -> None:
    reference = _reference(small_adata[:150])
    user = _with_user_results(small_adata[150:])
    user_keys = [(slot, key) for slot, keys in USER_KEYS.items() for key in keys]
    before = user.copy()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # small-data and few-cluster notes
        assert call(user, reference) is None
    new = _keys(user) - _keys(before)
    assert new, "the function wrote nothing"
    assert all("mine" in key for _, key in new), f"outputs not named from key_added: {sorted(new)}"
    _assert_untouched(before, user, user_keys)
    if call is not CALLS["pp.partition"]:  # the one function that reads no cell keeps no record
        assert any("mine" in key for key in user.uns["dpsc"]), "the record goes to uns['dpsc'][key_added]"

    original = _with_user_results(small_adata[150:])
    kept = original.copy()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        out = call(original, _reference(small_adata[:150]), copy=True)
    assert isinstance(out, ad.AnnData) and out is not original
    assert _keys(original) == _keys(kept)  # the original's data alone: only its ledger may grow
    _assert_untouched(kept, original, _keys(kept))
    assert all("mine" in key for _, key in _keys(out) - _keys(kept))
    _assert_untouched(kept, out, user_keys)


@pytest.mark.parametrize("name", list(CALLS))
def test_every_tool_returns_by_scanpys_rule_and_names_its_outputs_from_key_added(name, small_adata):
    _check_convention(CALLS[name], small_adata)


@pytest.mark.slow
@pytest.mark.optional_extra
@pytest.mark.parametrize("name", list(SLOW_CALLS))
def test_federated_tools_follow_the_same_rule(name, small_adata):
    pytest.importorskip("flwr")
    _check_convention(SLOW_CALLS[name], small_adata)


def test_a_clustering_never_overwrites_a_scanpy_pca(small_adata):
    """The bug the rule fixes: ``tl.cluster`` used to write obsm["X_pca"] and varm["PCs"]."""
    adata = _with_user_results(small_adata)
    pcs = adata.varm["PCs"].copy()
    dpsc.tl.cluster(adata, 3, epsilon=8, noise_seed=0)
    assert np.array_equal(adata.varm["PCs"], pcs) and "pca" in adata.uns
    assert adata.obsm["X_dp_cluster"].shape == (adata.n_obs, 16)
    assert adata.varm["dp_cluster_loadings"].shape == (adata.n_vars, 16)
    assert adata.var["dp_cluster_gene"].all()  # 200 genes: the plan reads them all


def test_the_clustering_tools_share_one_cluster_column_and_a_later_one_says_it_replaces_it(
    small_adata, tiny_fit
):
    """tl.cluster, tl.kmeans, tl.cluster_federated, tl.fit and tl.fit_federated default to
    obs["dp_cluster"]; a fit after a clustering warns, and the embedding's title names the fit's ε."""
    import inspect

    tools = ("cluster", "kmeans", "cluster_federated", "fit", "fit_federated")
    defaults = set()
    for name in tools:
        parameters = inspect.signature(getattr(dpsc.tl, name)).parameters
        column = parameters["cluster_key"] if "cluster_key" in parameters else parameters["key_added"]
        defaults.add(column.default)
    assert defaults == {"dp_cluster"}
    adata = small_adata.copy()
    dpsc.tl.cluster(adata, 3, epsilon=4, noise_seed=0)
    with pytest.warns(UserWarning, match="held the clusters of the earlier result 'dp_cluster'"):
        dpsc.tl.fit(adata, epsilon=8, noise_seed=0, **tiny_fit)
    assert adata.uns["dpsc"]["dp_cluster"]["labels_replaced_by"] == "X_dpdcan"
    record = dpsc.pl._embedding.private_record(adata, "dp_cluster")
    assert record["tool"] == dpsc.privacy.get_record(adata, "X_dpdcan")["tool"] != "tl.cluster"
    assert record["epsilon"] == pytest.approx(dpsc.privacy.get_record(adata, "X_dpdcan")["epsilon"])


def test_old_argument_names_fail_fast_with_the_new_name_and_leave_the_data_alone(small_adata):
    """Names dpsc 0.2 took were renamed since: a call with one names the fix and reads nothing."""
    with pytest.raises(TypeError, match=r"n_clients= was renamed n_sites= after dpsc 0\.2; pass n_sites=3"):
        dpsc.pp.partition(small_adata, n_clients=3)
    with pytest.raises(TypeError, match=r"types_per_client= was renamed types_per_site="):
        dpsc.pp.partition(small_adata, n_sites=3, types_per_client=2)
    assert "site" not in small_adata.obs
    legacy = small_adata.copy()
    legacy.obs["client"] = pd.Categorical(np.arange(legacy.n_obs) % 2)
    with pytest.raises(TypeError, match=r"client_key= was renamed site_key=.*pass site_key='client'"):
        dpsc.tl.fit_federated(legacy, client_key="client", epsilon=None, method="fedprox")
    with pytest.raises(TypeError, match=r"client_key= was renamed site_key="):
        dpsc.tl.cluster_federated(legacy, n_clusters=3, client_key="client")
    with pytest.raises(ValueError, match=r"pass site_key='client'"):
        dpsc.tl.cluster_federated(legacy, n_clusters=3)
    assert "dpsc" not in legacy.uns and dpsc.privacy.ledger_frame(legacy).empty
    model_data = small_adata.copy()
    dpsc.model.DPDCAN.setup_anndata(model_data)
    with pytest.raises(TypeError, match=r"private_optimizer= was renamed optimizer=.*pass optimizer='adam'"):
        dpsc.model.DPDCAN(model_data, n_clusters=3).train(epsilon=8, private_optimizer="adam")
    assert dpsc.privacy.ledger_frame(model_data).empty


def test_annotate_takes_the_cells_to_label_first_and_refuses_the_old_order(small_adata):
    """``annotate(adata, adata_ref, key)`` as ``sc.tl.ingest``; 0.2's reference-first order and
    names fail before any cell is read, and the reference's ledger stays empty."""
    ref = _reference(small_adata[:150])
    query = small_adata[150:].copy()
    del query.obs["cell_type"]  # only the reference is labelled: the old order is recognisable
    kwargs = {"epsilon": 2.0, "epochs": 1, "noise_seed": 3}
    with pytest.raises(ValueError, match=r"cells to label first and the labelled reference second"):
        dpsc.tl.annotate(ref, query, "cell_type", **kwargs)
    with pytest.raises(TypeError, match=r"adata_query= was renamed adata="):
        dpsc.tl.annotate(None, ref, "cell_type", adata_query=query, **kwargs)
    with pytest.raises(TypeError, match=r"n_components= was renamed n_comps=.*pass n_comps=4"):
        dpsc.tl.annotate(query, ref, "cell_type", n_components=4, **kwargs)
    assert dpsc.privacy.ledger_frame(ref).empty and "dp_label" not in query.obs
    dpsc.tl.annotate(query, ref, "cell_type", n_comps=4, **kwargs)
    assert "dp_label" in ref.uns["dpsc"] and "dp_label" not in ref.obs and "dp_label" in query.obs
    assert query.uns["dpsc"]["dp_label"]["features"].startswith("log-normalised, PCA (4 components)")


OLD_NAMES = {
    "seed": "random_state",
    "n_clients": "n_sites",
    "client_key": "site_key",
    "n_components": "n_comps",
}


def test_one_name_per_concept_across_the_public_api():
    """Every public function and class names a seed ``random_state``, sites ``n_sites``/``site_key`` and
    components ``n_comps``; no signature keeps an old name (0.2's names fail fast by the decorator)."""
    import importlib
    import inspect

    found = []
    for package in (
        "tl",
        "pp",
        "pl",
        "privacy",
        "federated",
        "fm",
        "linear",
        "model",
        "audit",
        "datasets",
        "optim",
    ):
        module = importlib.import_module(f"dpsc.{package}")
        for name in module.__all__:
            obj = getattr(module, name)
            target = obj.__init__ if inspect.isclass(obj) else obj
            if not callable(target):
                continue
            try:
                parameters = inspect.signature(target).parameters
            except (TypeError, ValueError):
                continue
            for old in OLD_NAMES:
                if old in parameters:
                    found.append(f"dpsc.{package}.{name}({old}=)")
    assert found == []


def test_old_seed_name_fails_fast_with_the_new_name():
    y = np.linspace(-1.0, 1.0, 30)
    with pytest.raises(TypeError, match=r"seed= was renamed random_state=.*pass random_state=3"):
        dpsc.linear.null_pc_sd(y, n_permutations=20, seed=3)
    assert dpsc.linear.null_pc_sd(y, n_permutations=20, random_state=3) > 0


def test_epsilon_is_a_keyword_everywhere_and_the_second_argument_of_fit_is_n_clusters(small_adata):
    """scanpy's shape ``(adata, <method arguments>, *, epsilon=…)``: ε is keyword-only in every tool,
    and ``tl.fit``'s second positional argument is ``n_clusters`` as in ``tl.cluster``; 0.2's
    ``tl.fit(adata, 8.0)`` (ε as a float) fails before anything is read or booked."""
    import inspect

    positional = [
        f"dpsc.{package}.{name}"
        for package in ("pp", "tl")
        for name in getattr(dpsc, package).__all__
        if callable(getattr(getattr(dpsc, package), name))
        and "epsilon" in inspect.signature(getattr(getattr(dpsc, package), name)).parameters
        and inspect.signature(getattr(getattr(dpsc, package), name)).parameters["epsilon"].kind
        is not inspect.Parameter.KEYWORD_ONLY
    ]
    assert positional == []
    for tool in (dpsc.tl.fit, dpsc.tl.cluster):
        assert list(inspect.signature(tool).parameters)[:2] == ["adata", "n_clusters"]
    with pytest.raises(TypeError, match=r"n_clusters must be a whole number.*epsilon="):
        dpsc.tl.fit(small_adata, 8.0)
    assert "dp_cluster" not in small_adata.obs and dpsc.privacy.ledger_frame(small_adata).empty


def test_the_federated_and_privacy_apis_export_what_the_docs_document():
    """``__all__`` of ``dpsc.federated`` and ``dpsc.privacy`` is the documented API, no more, and the
    packages answer no other name: FedSC's losses and training steps are dpsc's own, in their module."""
    from pathlib import Path

    api = (Path(__file__).parents[1] / "docs" / "api.md").read_text()
    for package in ("federated", "privacy"):
        exported = set(getattr(dpsc, package).__all__)
        documented = set(re.findall(rf"dpsc\.{package}\.(\w+)", api))
        assert exported == documented, (exported - documented, documented - exported)
    assert {"byol_loss", "nt_xent", "local_train"}.isdisjoint(dpsc.federated.__all__)
    for package in (dpsc.federated, dpsc.privacy):  # no lazy map of private names
        assert set(package._WHERE) == set(package.__all__)
    assert not hasattr(dpsc.federated, "byol_loss") and not hasattr(dpsc.privacy, "spent_epsilon")
    from dpsc.federated._ssl import byol_loss

    assert callable(byol_loss)
