"""Write the tutorial notebooks, and run them to fill in their outputs.

``python tutorials/_build_notebooks.py`` writes every notebook's sources (erasing its outputs);
``--execute [NAME ...]`` writes and then runs the named notebooks (default: all) top to bottom in
``tutorials/`` with nbclient, as the committed outputs were made (full data unless
``DPSC_TUTORIAL_FAST=1``; set ``OMP_NUM_THREADS`` to time them), keeping readable outputs: one
stderr block per cell, the last state of each progress line, no Lightning log lines.
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import nbformat as nbf

HERE = Path(__file__).parent
SETUP = '''import os
import warnings

# Without ipywidgets, tqdm draws text progress bars and says so once; dpsc's own warnings stay on.
warnings.filterwarnings("ignore", message="IProgress not found")

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import scanpy as sc

import dpsc

# DPSC_TUTORIAL_FAST=1 (set in CI) shrinks data and training so the notebook runs in seconds;
# the committed outputs come from the full run.
FAST = os.environ.get("DPSC_TUTORIAL_FAST") == "1"'''


def md(text: str):
    return nbf.v4.new_markdown_cell(text.strip())


def code(text: str):
    return nbf.v4.new_code_cell(text.strip())


NOTEBOOKS: dict[str, list] = {}
#: Lightning's per-fit log lines (accelerator summary, model summary table) in a cell's stderr.
LIGHTNING_LOG = re.compile(
    r"^(GPU available|TPU available|HPU available|IPU available|LOCAL_RANK|`Trainer|You are using|Trainer |"
    r"Missing logger folder|  \| Name|----|\d+ +\S+ +\| |.*Total params|.*Trainable params|"
    r".*Non-trainable params|.*Total estimated|.*Modules in)"
)


def write(name: str, cells: list) -> None:
    NOTEBOOKS[name] = cells


def save_sources(name: str) -> None:
    nb = nbf.v4.new_notebook()
    nb.cells = NOTEBOOKS[name]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbf.write(nb, HERE / name)


def tidy_stderr(cell) -> None:
    """Merge a cell's stderr chunks, keep each progress line's last state, drop Lightning's log."""
    outputs = []
    for out in cell.get("outputs", []):
        if out.output_type == "stream" and out.name == "stderr" and outputs:
            last = outputs[-1]
            if last.output_type == "stream" and last.name == "stderr":
                last.text += out.text
                continue
        outputs.append(out)
    kept = []
    for out in outputs:
        if out.output_type == "stream" and out.name == "stderr":
            lines = [line.split("\r")[-1] for line in out.text.split("\n")]
            out.text = "\n".join(line for line in lines if not LIGHTNING_LOG.match(line))
            if not out.text.strip():
                continue
        kept.append(out)
    cell.outputs = kept


def execute(name: str, timeout: int = 1800) -> None:
    """Run a notebook top to bottom in this folder and save it with tidy outputs."""
    from nbclient import NotebookClient

    nb = nbf.read(HERE / name, as_version=4)
    NotebookClient(nb, timeout=timeout, kernel_name="python3", resources={"metadata": {"path": str(HERE)}}).execute()
    for cell in nb.cells:
        if cell.cell_type == "code":
            tidy_stderr(cell)
    nbf.write(nb, HERE / name)


write("01_quickstart.ipynb", [
    md("""
# Quick start: private clustering of PBMC 4k

dpsc clusters and embeds cells with **DP-DCAN** under a proven (ε, δ) differential-privacy
guarantee: Opacus privatizes the encoder and the centroids, and the decoder stays fixed at its
data-independent initialisation (the default `scope="encoder"`; the record says what is covered).
This notebook fits the model on the embedded PBMC 4k data (4271 cells × 2000 genes, raw counts),
looks at the private clusters beside the true cell types, reads what the ε covers, and exports
the model a hospital would share. Full run: about a minute on a laptop CPU.
"""),
    code(SETUP),
    code("""
adata = dpsc.datasets.pbmc4k()
if FAST:
    sc.pp.subsample(adata, n_obs=600, random_state=0)
    sc.pp.filter_genes(adata, min_counts=1)
adata
"""),
    md("""
## Fit

One call. `epsilon=8` is the budget of the *whole* fit: most of it goes to the private clustering
the model starts from (`tl.cluster`'s gene selection, principal components and k-means), the
rest to both training stages and to the last release that keeps the better of the two partitions
(`uns["dpsc"]["X_dpdcan"]["params"]["partition"]` says which); δ defaults to 1e-5. The number of clusters is a fixed
default (8), not estimated from the cells — estimating it would spend privacy budget.
"""),
    code("""
model = dpsc.tl.fit(adata, epsilon=8, max_epochs=6 if FAST else None, progress_bar=not FAST, return_model=True)
adata
"""),
    code("""
from sklearn.metrics import adjusted_rand_score, normalized_mutual_info_score

truth = adata.obs["cell_type"]
print(f"ARI {adjusted_rand_score(truth, adata.obs['dp_cluster']):.3f}, "
      f"NMI {normalized_mutual_info_score(truth, adata.obs['dp_cluster']):.3f}, "
      f"clusters used: {adata.obs['dp_cluster'].nunique()}")
"""),
    md("""
## UMAP of the private embedding

`obsm["X_dpdcan"]` is an ordinary representation for scanpy. Note that these coordinates are
computed *from the training cells themselves*: they are for the data holder's eyes, not a DP
release (the statement below says so).
"""),
    code("""
sc.pp.neighbors(adata, use_rep="X_dpdcan", random_state=0)
sc.tl.umap(adata, random_state=0)
fig, axes = plt.subplots(1, 2, figsize=(10, 4))
dpsc.pl.embedding(adata, color="dp_cluster", ax=axes[0], show=False)
dpsc.pl.embedding(adata, color="cell_type", ax=axes[1], show=False, title="true cell types")
fig.tight_layout()
if os.environ.get("DPSC_WRITE_DOCS_FIGURES") == "1":  # refreshes the README figure
    fig.savefig("../docs/_static/quickstart_umap.png", dpi=110, bbox_inches="tight")
plt.show()
"""),
    md("""
## What was spent, and what it covers

Every fit writes its record to `uns["dpsc"]["X_dpdcan"]["privacy"]` (and an entry to the AnnData's privacy ledger, `dpsc.privacy.spent(adata)`): the ε actually spent (Opacus
accountant), the noise multiplier σ, the Poisson sampling rate q, the number of noisy steps and
the clipping norm C — and a plain statement of the guarantee.
"""),
    code("""
record = adata.uns["dpsc"]["X_dpdcan"]["privacy"]
pd.Series({k: record[k] for k in ["epsilon", "target_epsilon", "delta", "noise_multiplier",
                                  "sample_rate", "steps", "max_grad_norm", "accountant", "scope"]})
"""),
    code("""
print(record["statement"])
"""),
    code("""
dpsc.pl.privacy(adata, show=False)
plt.show()
"""),
    md("""
## Share the model, not the cells

`export_shared` writes the encoder and the centroids, with the input loadings they read
through: all that is needed to embed and cluster new cells. Another site loads it with
`SharedEncoder` and clusters its own cells.
"""),
    code("""
import tempfile

with tempfile.TemporaryDirectory() as tmp:
    path = model.export_shared(tmp)
    print(sorted(p.name for p in path.iterdir()))
    shared = dpsc.model.SharedEncoder.load(path)
    other_site = dpsc.datasets.pbmc4k()[:200].copy()  # stands in for another hospital's cells
    shared.predict(other_site, key_added="dp_cluster")  # obs["dp_cluster"], as tl.fit writes it
    print(other_site.obs["dp_cluster"].value_counts(sort=False).to_dict())
"""),
])

write("02_privacy_utility.ipynb", [
    md("""
# The privacy–utility trade-off

How much clustering quality does privacy cost? This notebook (1) plots the committed benchmark
results (3 data sets, several ε, final models only) and (2) runs a small live sweep on a
subsample of PBMC 4k: ε, the scope of the noise (`encoder`, the default, against `full`) and the
update rule of the private parameters (SGD vs the sign optimizers). Full run: about 4 minutes on a laptop CPU.
"""),
    code(SETUP),
    md("""
## The committed benchmark

`benchmarks/results/dpdcan.jsonl` holds one row per fit (command in `benchmarks/results/dpdcan.md`).
"""),
    code("""
import json
from pathlib import Path

rows = Path("../benchmarks/results/dpdcan.jsonl").read_text().splitlines()
bench = pd.DataFrame([json.loads(r) for r in rows if r.strip()])
bench = bench[bench.config.str.startswith(("DCAN", "DP-DCAN", "DPE-DCAN"))]
bench = bench[~bench.config.str.contains(",")]  # current defaults only: a suffix marks a variant
bench["method"] = np.where(bench.config.str.startswith("DPE"), "full, genes in", "DP-DCAN (paper)")
bench.loc[bench.config.str.startswith("DCAN"), "method"] = "DP-DCAN (paper)"
fig, axes = plt.subplots(1, 2, figsize=(10, 3.5))
for ax, name in zip(axes, ["pbmc", "bladder"]):
    dpsc.pl.privacy_utility(bench[bench.dataset == name], x="target_epsilon", y="ari", hue="method",
                            ax=ax, show=False)
    ax.set_title(name)
plt.show()
"""),
    md("""
## A live sweep

A smaller problem so that it runs in minutes: 1500 cells, 20 epochs per fit. Each row is the
*final* model of one fit; nothing is selected by looking at the labels.
"""),
    code("""
from sklearn.metrics import adjusted_rand_score

cells = dpsc.datasets.pbmc4k()
sc.pp.subsample(cells, n_obs=300 if FAST else 1500, random_state=0)
sc.pp.filter_genes(cells, min_counts=1)
epochs = 3 if FAST else 20
grid = [(None, "encoder", "sgd")]
grid += [(eps, "encoder", "sgd") for eps in ((8,) if FAST else (1, 2, 4, 8))]
grid += [(eps, "full", "sgd") for eps in ((8,) if FAST else (2, 8))]
grid += [(eps, "encoder", opt) for eps in ((8,) if FAST else (2, 8)) for opt in ("dpsignsgd", "dpsignadam")]
results = []
for eps, scope, opt in grid:
    a = cells.copy()
    dpsc.tl.fit(a, epsilon=eps, scope=scope, optimizer=opt, max_epochs=epochs, progress_bar=False)
    results.append({"epsilon": eps, "config": f"{scope}, {opt}",
                    "ari": adjusted_rand_score(a.obs["cell_type"], a.obs["dp_cluster"]),
                    "spent": a.uns["dpsc"]["X_dpdcan"]["privacy"]["epsilon"]})
results = pd.DataFrame(results)
results
"""),
    code("""
sweep = results.copy()
# the non-private reference belongs to every group
ref = sweep[sweep.epsilon.isna()]
sweep = pd.concat([sweep[sweep.epsilon.notna()]] + [ref.assign(config=c) for c in sweep.config.unique()
                                                     if c != "encoder, sgd"])
dpsc.pl.privacy_utility(sweep, hue="config", show=False)
plt.title("PBMC subsample, 20 epochs")
plt.show()
"""),
    md("""
Reading the plot: ARI is low at small ε and climbs towards the non-private line. With a single
seed per point, differences of a few hundredths are noise. Both scopes train the same small model
here: 16 DP principal components released inside the ε, a 16 → 64 → 16 encoder; `encoder` keeps
the decoder fixed, `full` trains it with noise too. The committed benchmark above plots the
gene-reading models of the DP-DCAN paper (`scope="paper"`, heuristic, and "full, genes in").
Which update rule wins changes with n: with fewer cells each noisy step carries less signal
(`benchmarks/results/dpdcan.md` and `sign_dpdcan.md` on all 4271 cells).
"""),
])

write("03_audit.ipynb", [
    md("""
# Auditing a model with membership inference

An ε is a promise; an audit is an experiment that tries to break it. `dpsc.tl.audit` trains a
target model and a shadow model on disjoint cells (2:1:2:1 split), learns from the shadow model
what members look like *through the shared encoder*, and attacks the target. It reports the
attack's AUC, balanced accuracy, TPR at low FPR, and an empirical lower bound on ε that must
never exceed the claimed ε. Full run: about 3 minutes on 2 CPU cores.
"""),
    code(SETUP),
    code("""
adata = dpsc.datasets.pbmc4k()
sc.pp.subsample(adata, n_obs=600 if FAST else 2400, random_state=0)
epochs = 3 if FAST else 40
tables = {}
for eps in (None, 8.0):
    a = adata.copy()
    tables[eps] = dpsc.tl.audit(a, epsilon=eps, attack="both", features="encoder+decoder",
                                max_epochs=epochs, progress_bar=False)
    tables[eps].insert(0, "model", "non-private" if eps is None else f"ε = {eps:g}")
    adata.uns.setdefault("audits", {})[str(eps)] = a.uns["dpsc"]["audit"]
table = pd.concat(tables.values())
table.round({c: 3 for c in table.columns if c != "delta"})  # δ = 1e-5 would round to 0
"""),
    md("""
`features="encoder+decoder"` adds two attacks that also read the decoder's reconstruction loss.
Under the default `scope="encoder"` the decoder stays at its initialisation (it never reads a
cell), so those rows test a public map; under `scope="paper"`, whose decoder trains without noise
and is never shared, they would measure what *releasing* it leaks. The `shadow` and `threshold`
rows are what a receiver of the shared model can do.
"""),
    code("""
fig, axes = plt.subplots(1, 2, figsize=(9, 4))
for ax, key in zip(axes, ["None", "8.0"]):
    view = adata.copy()
    view.uns["dpsc"] = {"audit": adata.uns["audits"][key]}
    dpsc.pl.audit(view, ax=ax, show=False)
fig.tight_layout()
plt.show()
"""),
    md("""
The dotted line is the limit TPR ≤ e^ε·FPR + δ implied by the claim: a DP model's ROC curve
must stay below it (up to sampling error). An empirical ε of 0 means the attack could not prove
any leak with 95 % confidence — it is a lower bound, not a measurement of the true ε.
"""),
])

write("04_federated.ipynb", [
    md("""
# Federated clustering with Flower across simulated sites

Four hospitals each hold the cells of a few cell types and may not pool them. FedSC trains a
self-supervised encoder at every site; only model weights travel to the server, which averages
them, and each site pulls the average back with a divergence-aware EMA. Before training, the
sites send their per-gene sums once so that every site z-scores its genes with the pooled
statistics (`scale_genes`, on by default without DP). The run uses Flower's simulation engine
(one SuperNode per site) with the default 250 rounds × 1 local epoch. No DP here: the weights
and sums the sites send are not DP releases (the record says so). Full run: about 8 minutes on
2 CPU cores (FedSC twice, then the private clustering federated and central).
"""),
    code(SETUP),
    code("""
adata = dpsc.datasets.pbmc4k()
if FAST:
    sc.pp.subsample(adata, n_obs=400, random_state=0)
    sc.pp.filter_genes(adata, min_counts=1)
dpsc.pp.partition(adata, n_sites=4, label_key="cell_type", types_per_site=2)
pd.crosstab(adata.obs["cell_type"], adata.obs["site"])
"""),
    code("""
schedule = {"rounds": 2, "local_epochs": 1} if FAST else {}  # full run: the defaults, 250 × 1
results = {}
for method in ["fedsc", "fedbyol"]:
    a = adata.copy()
    dpsc.tl.fit_federated(a, epsilon=None, method=method, **schedule)  # as published: no DP
    record = a.uns["dpsc"]["X_fedsc"]
    results[method] = a
    print(f"{method}: {record['seconds_per_round']:.1f} s per round")
"""),
    code("""
from sklearn.metrics import adjusted_rand_score, normalized_mutual_info_score

pd.DataFrame({m: {"ARI": adjusted_rand_score(a.obs["cell_type"], a.obs["fed_cluster"]),
                  "NMI": normalized_mutual_info_score(a.obs["cell_type"], a.obs["fed_cluster"])}
              for m, a in results.items()}).T.round(3)
"""),
    code("""
fig, axes = plt.subplots(1, 2, figsize=(9, 3.5))
for ax, (m, a) in zip(axes, results.items()):
    dpsc.pl.federated(a, ax=ax, show=False)
    ax.set_title(m)
fig.tight_layout()
plt.show()
"""),
    code("""
a = results["fedsc"]
sc.pp.neighbors(a, use_rep="X_fedsc", random_state=0)
sc.tl.umap(a, random_state=0)
fig, axes = plt.subplots(1, 3, figsize=(14, 4))
for ax, key in zip(axes, ["fed_cluster", "cell_type", "site"]):
    dpsc.pl.embedding(a, color=key, ax=ax, show=False, title=key)
fig.tight_layout()
plt.show()
"""),
    md("""
## A private clustering across the same sites

FedSC above has no privacy. The private clustering of `dpsc.tl.cluster` federates exactly: its
gene statistics, PCA and k-means are sums over cells, hence sums over sites. With
`mode="secure"` (the default) each site adds a share of the noise and Flower's SecAgg+ gives the
server only the sum over sites, which then carries the noise of the central mechanism: every
site gets the central ε = 8 for its cells, and each site labels its own cells with the released
centroids. Each site checks the plan against its own settings and books its spend before it
sends anything.
"""),
    code("""
federated = adata.copy()
dpsc.tl.cluster_federated(federated, n_clusters=8, epsilon=8)   # SecAgg+ with distributed noise
central = adata.copy()
dpsc.tl.cluster(central, n_clusters=8, epsilon=8)               # the same release, cells pooled
pd.DataFrame({
    "federated (secure)": {"ARI": adjusted_rand_score(federated.obs["cell_type"], federated.obs["dp_kmeans"]),
                           "ε spent": dpsc.privacy.spent(federated).epsilon},
    "central": {"ARI": adjusted_rand_score(central.obs["cell_type"], central.obs["dp_kmeans"]),
                "ε spent": dpsc.privacy.spent(central).epsilon},
}).T.round(3)
"""),
    code("""
print(dpsc.privacy.get_record(federated, "dp_kmeans")["statement"])
"""),
    md("""
The two ARIs differ only by their independent secret noise: with the same noise (a test-only
`noise_seed`) the federated run reproduces the central loadings and centroids to 10⁻⁶. In a real
deployment each hospital runs `dpsc federate site --data its_cells.h5ad --superlink HOST:PORT
--epsilon 8 --budget 16` and the coordinator `dpsc federate server --sites 4`; see the usage
page.
"""),
])

write("05_drug_response.ipynb", [
    md("""
# Private drug-response regression (GDSC)

A consortium holds expression profiles and drug responses of cancer cell lines; a few lines are
public. `dpsc.tl.private_regression` releases only noisy sufficient statistics of the private
lines (robust private linear regression, Honkela et al. 2018) and combines them with the exact
public ones. Data: the embedded GDSC subset (90 cell lines × 1350 genes, ln IC50 of 10 drugs).
Full run: under a minute. The functional-mechanism comparison needs the baselines extra:
`pip install -e ".[tutorials,baselines]"`.
"""),
    code(SETUP),
    code("""
adata = dpsc.datasets.gdsc_subset()
drug = "Paclitaxel"
rng = np.random.default_rng(0)
labelled = np.flatnonzero(adata.obs[drug].notna())
perm = rng.permutation(labelled)
public, test = perm[:10], perm[10:25]
adata.obs["public"] = False
adata.obs.iloc[public, adata.obs.columns.get_loc("public")] = True
is_test = np.zeros(adata.n_obs, bool)
is_test[test] = True
train = adata[~is_test].copy()
print(f"{train.obs.public.sum()} public, {(~train.obs.public & train.obs[drug].notna()).sum()} "
      f"private, {len(test)} held-out cell lines")
"""),
    md("""
Genes are chosen on the **public** lines only (the 10 most variable); the centring constants
come from the public lines too. Nothing but the noisy statistics touches the private lines.
"""),
    code("""
from scipy.stats import spearmanr

rows = []
for method in ["robust", "output_perturbation", "functional_mechanism", "non_private"]:
    for eps in ([1.0, 2.0, 8.0] if method != "non_private" else [np.inf]):
        scores = []
        for seed in range(3 if FAST else 20):
            m = dpsc.tl.private_regression(train, drug, epsilon=eps if np.isfinite(eps) else 1.0,
                                           public_mask="public", method=method, random_state=seed,
                                           return_model=True)
            genes = train.uns["dpsc"][f"{drug}_dp_pred"]["genes"]
            pred = m.predict(adata[test, genes].X)
            scores.append(spearmanr(adata.obs[drug].iloc[test], pred).statistic)
        rows.append({"method": method, "epsilon": eps, "spearman": np.nanmean(scores)})
table = pd.DataFrame(rows)
table.round(3)
"""),
    md("""
The record of one robust fit at ε = 2: what was spent, how the budget was split, the
projection bounds (chosen on synthetic data), the Laplace scales, and the statement.
"""),
    code("""
dpsc.tl.private_regression(train, drug, epsilon=2.0, public_mask="public", method="robust")
print(train.uns["dpsc"][f"{drug}_dp_pred"]["privacy"]["statement"])
"""),
    code("""
record = {k: v for k, v in train.uns["dpsc"][f"{drug}_dp_pred"]["privacy"].items() if k != "statement"}
record
"""),
    md("""
With ~60 private cell lines, noise dominates and the held-out Spearman correlation of 15 lines
varies a lot between noise draws (20 draws are averaged above, over one split). The benchmark
(`benchmarks/results/regression.md`) repeats this over 50 splits and all 10 drugs.
"""),
])

write("06_annotation.ipynb", [
    md("""
# Private cell-type annotation with the functional mechanism

A hospital holds a labelled reference (cells with expert annotations) it may not share. You hold
unlabelled query cells. `dpsc.tl.annotate` trains a classifier on the reference with a privacy
guarantee for every reference cell and labels your cells with it.

Two private learners:

- **pCDBN** (`method="pcdbn"`, Phan, Wu & Dou 2017): the *objective* is perturbed once. The RBM
  energy is approximated by a Chebyshev polynomial, whose data-dependent coefficients (moment
  tensors) get Laplace noise; the softmax layer uses a second-order Taylor expansion of
  cross-entropy. Training is post-processing: **the privacy cost does not grow with epochs**.
- **DP-SGD** (`method="dpsgd"`, Opacus): noise on every clipped gradient step; the privacy cost grows
  with every epoch.

Full run: about a minute on 2 CPU cores.
"""),
    code(SETUP),
    code("""
adata = dpsc.datasets.pbmc4k()
if FAST:
    sc.pp.subsample(adata, n_obs=800, random_state=0)
rng = np.random.default_rng(0)
is_reference = rng.random(adata.n_obs) < 0.7
reference = adata[is_reference].copy()   # the hospital's private, labelled cells
query = adata[~is_reference].copy()      # your cells; their labels are used only to score
print(reference.n_obs, "reference cells,", query.n_obs, "query cells")
"""),
    md("""
## Annotate at ε = 1

The features are a PCA fitted on the **query** cells (yours), so the reference is only touched by
the private learner. Each call writes `query.obs["dp_label"]`, a confidence column and a privacy
record: the classifier's in `ref.uns["dpsc"]["dp_label"]["privacy"]` (and the reference's ledger), and in `query.uns["dpsc"]["dp_label"]` a copy of it under `"reference"`.
"""),
    code("""
from sklearn.metrics import accuracy_score, f1_score

epochs = 20 if FAST else 200
rows, records = [], {}
for method, eps, kwargs in [("pcdbn", 1.0, {"epochs": epochs}), ("dpsgd", 1.0, {}), ("mlp", None, {})]:
    dpsc.tl.annotate(query, reference, "cell_type", epsilon=eps, method=method, **kwargs)
    truth, pred = query.obs["cell_type"].astype(str), query.obs["dp_label"].astype(str)
    records[method] = query.uns["dpsc"]["dp_label"]["reference"]
    rows.append({"method": method, "ε spent": records[method]["epsilon"],
                 "accuracy": accuracy_score(truth, pred), "macro-F1": f1_score(truth, pred, average="macro")})
    query.obs[f"label_{method}"] = query.obs["dp_label"]
pd.DataFrame(rows).round(3)
"""),
    code("""
record = records["pcdbn"]  # what the pCDBN fit above wrote (the reference's record, copied to query.uns["dpsc"]["dp_label"]["reference"])
print(record["statement"], end="\\n\\n")
layers = record["layers"]
print("ε per layer:", {name: round(layer["epsilon"], 3) for name, layer in layers.items()})
print("Laplace scales:", {name: round(layer["laplace_scale"], 3) for name, layer in layers.items()})
print("Chebyshev degree", layers["rbm_0"]["degree"], "on [−R, R], R =", layers["rbm_0"]["radius"],
      "max error", round(layers["rbm_0"]["approximation_max_error"], 4))
"""),
    md("""
## Where the labels land

A UMAP of the query cells (computed on your own cells) coloured by the true type and by the labels
of each learner.
"""),
    code("""
view = query.copy()
sc.pp.normalize_total(view, target_sum=1e4)
sc.pp.log1p(view)
sc.pp.pca(view, n_comps=20)
sc.pp.neighbors(view, random_state=0)
sc.tl.umap(view, random_state=0)
sc.pl.umap(view, color=["cell_type", "label_pcdbn", "label_dpsgd"], ncols=3, wspace=0.5)
"""),
    md("""
## The headline property: epochs are free for pCDBN, not for DP-SGD

pCDBN at ε = 0.5 for 1 to 200 epochs: the spent ε stays at 0.5. DP-SGD with a fixed noise
multiplier (the one that reaches ε = 0.5 after 10 epochs) spends more with every epoch; it stops
where the next epoch would cross the budget.
"""),
    code("""
from dpsc.privacy import calibrate_noise_multiplier

budget, batch = 0.5, 128
steps = -(-reference.n_obs // batch)  # one epoch of Poisson batches
sigma = calibrate_noise_multiplier(budget, 1e-5, sample_rate=1 / steps, steps=10 * steps, accountant="prv")
curve = []
for epochs_asked in ((1, 5, 20) if FAST else (1, 10, 50, 200)):
    dpsc.tl.annotate(query, reference, "cell_type", epsilon=budget, method="pcdbn", epochs=epochs_asked)
    curve.append({"method": "pCDBN", "epochs": epochs_asked, "ε spent": query.uns["dpsc"]["dp_label"]["reference"]["epsilon"],
                  "accuracy": accuracy_score(query.obs["cell_type"].astype(str), query.obs["dp_label"].astype(str))})
dpsc.tl.annotate(query, reference, "cell_type", epsilon=None, method="dpsgd", noise_multiplier=sigma,
                 max_epsilon=budget, epochs=50, batch_size=batch)
history = query.uns["dpsc"]["dp_label"]["reference"]["epsilon_history"]
fig, ax = plt.subplots(figsize=(5, 3.5))
curve = pd.DataFrame(curve)
ax.plot(curve["epochs"], curve["ε spent"], "o-", label="pCDBN (objective perturbation)")
ax.plot(np.arange(1, len(history) + 1), history, "s-", label=f"DP-SGD (σ = {sigma:.2f})")
ax.axhline(budget, color="grey", ls=":", label="budget")
ax.set_xscale("log"); ax.set_xlabel("epochs"); ax.set_ylabel("ε spent"); ax.legend()
plt.show()
curve.round(3)
"""),
    md("""
## Reading the results

Both learners keep their promise, but at these data sizes DP-SGD is clearly more accurate: the
functional mechanism adds noise to every coefficient of the objective at once, and with a few
thousand cells the noise on the softmax layer's statistics dominates (see
`benchmarks/results/fm.md`, PBMC and mouse bladder, ε from 0.1 to 8). pCDBN's advantage is
structural: you may train as long as you like, tune the epochs on public data, or retrain
without paying again — the released coefficients are all the model ever sees.
"""),
])


write("07_markers.ipynb", [
    md("""
# What is each cluster? Private marker genes

After clustering, a scanpy workflow asks which genes mark each cluster. `dpsc.tl.rank_genes_groups`
answers from private releases of per-cluster sums (each cell's log expression measured from the
cells' released mean, its squares, its detected genes and the cluster sizes, after the mean and the
bounds of each cell's part) and writes scanpy's own result structure, so scanpy's tables
and plots read it unchanged. This notebook clusters the pancreas endocrinogenesis counts
(Bastidas-Ponce et al. 2019; 3,696 cells × 2,000 genes, in `shared/data` beside the repository)
with `tl.cluster`, ranks each cluster's markers privately, and names the clusters from a public
list of known marker genes, beside scanpy's non-private markers of the same clusters. The
clustering and the markers share one budget: ε = 6 + 2. (The embedded PBMC 4k has anonymous gene
names, so its clusters cannot be named this way.) Full run: under a minute on a laptop CPU.
"""),
    code(SETUP),
    code("""
import anndata as ad

data = os.environ.get("DPSC_DATA", "../../shared/data")
adata = ad.read_h5ad(f"{data}/pancreas_endocrinogenesis_counts.h5ad")  # raw counts, obs["cell_type"]
if FAST:
    sc.pp.subsample(adata, n_obs=1500, random_state=0)
adata
"""),
    md("""
## Cluster, then rank markers, within one budget
"""),
    code("""
dpsc.tl.cluster(adata, n_clusters=8, epsilon=6)
dpsc.tl.rank_genes_groups(adata, "dp_kmeans", epsilon=2, n_genes=None)  # every gene, ranked
spent = dpsc.privacy.spent(adata)
print(f"spent on these cells: epsilon {spent.epsilon:.2f} at delta {spent.delta:.0e} ({spent.guarantee})")
largest = str(adata.obs["dp_kmeans"].value_counts().idxmax())  # this machine's view of its own cells
sc.get.rank_genes_groups_df(adata, group=largest).head()
"""),
    md("""
## Name the clusters from a public marker list

Each cluster gets the cell type whose known markers rank highest among its private markers. The
list is public knowledge (no cell is read to make it); the ranks are the private release. A cluster
whose released size is within its noise (`groups_below_noise` in the release's parameters) is not
named: its markers are noise.
"""),
    code("""
known = {
    "beta": ["Ins1", "Ins2"], "alpha": ["Gcg"], "delta": ["Sst"], "epsilon": ["Ghrl"],
    "Ngn3+ progenitor": ["Neurog3"], "pre-endocrine": ["Fev", "Chga"], "ductal": ["Sox9", "Spp1", "Krt19"],
}

def name_clusters(result):
    names = {}
    for cluster in result["names"].dtype.names:
        ranked = list(result["names"][cluster])
        best = {t: min((ranked.index(g) for g in genes if g in ranked), default=len(ranked))
                for t, genes in known.items()}
        names[cluster] = min(best, key=best.get)
    return names

private_names = name_clusters(adata.uns["rank_genes_groups"])
for cluster in adata.uns["dpsc"]["rank_genes_groups"]["params"]["groups_below_noise"]:
    private_names[cluster] = "(below noise)"
reference = adata.copy()
sc.pp.normalize_total(reference, target_sum=1e4)
sc.pp.log1p(reference)
sizes = adata.obs["dp_kmeans"].value_counts()
testable = [c for c in sizes.index if sizes[c] >= 2]  # scanpy's t-test needs 2 cells in a cluster
sc.tl.rank_genes_groups(reference, "dp_kmeans", groups=testable, method="t-test", n_genes=adata.n_vars)
scanpy_names = name_clusters(reference.uns["rank_genes_groups"])
pd.DataFrame({
    "cells": sizes.sort_index(),
    "private top 5": {c: ", ".join(list(adata.uns["rank_genes_groups"]["names"][c][:5])) for c in private_names},
    "named (private)": private_names,
    "named (scanpy, not private)": scanpy_names,
})
"""),
    md("""
## scanpy's plots, unchanged

The dot plot colours by each cluster's mean expression and sizes by the fraction expressing,
computed by scanpy from the cells on this machine: a view for the data holder, not a release (the
record says the released marker table is what the ε covers).
"""),
    code("""
adata.obs["named"] = adata.obs["dp_kmeans"].map(private_names).astype("category")
shown = adata[adata.obs["dp_kmeans"].isin(testable)].copy()  # scanpy's dot plot needs cells in each
shown.obs["dp_kmeans"] = shown.obs["dp_kmeans"].cat.remove_unused_categories()
sc.pl.rank_genes_groups_dotplot(shown, groups=testable, n_genes=3, show=False)
plt.show()
print(dpsc.privacy.get_record(adata, "rank_genes_groups")["statement"])
"""),
    md("""
## Reading the result

The noise on a cluster's mean expression falls with its number of cells, so large clusters get
their markers first: their top genes are the known markers that scanpy also ranks first, while a
small cluster at ε = 2 can show top genes whose scores are no larger than the noise alone gives
over 2,000 genes (about 4) and fractions expressing that disagree with their fold changes: there,
read the markers as uncertain, or spend more of the budget on them. `benchmarks/results/markers.md`
gives the overlap with scanpy's top genes per data set and ε.
"""),
])

if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--execute", nargs="*", metavar="NAME", help="run these notebooks (default: all)")
    args = parser.parse_args()
    chosen = args.execute or list(NOTEBOOKS)
    unknown = sorted(set(chosen) - set(NOTEBOOKS))
    if unknown:
        parser.error(f"unknown notebooks {unknown}; choose from {list(NOTEBOOKS)}")
    for name in chosen:
        save_sources(name)
        if args.execute is not None:
            execute(name)
            print(f"{name}: executed")
