import matplotlib

matplotlib.use("Agg")

import re

import anndata as ad
import pytest
import scanpy as sc

import dpsc
from dpsc.cli import main


def test_a_budget_stored_in_the_input_file_is_spent_there(small_adata, tmp_path, capsys):
    """Three `dpsc cluster --epsilon 8` runs on a file with budget 8: one runs, and the file says so."""
    src = tmp_path / "budgeted.h5ad"
    budgeted = small_adata.copy()
    dpsc.privacy.set_budget(budgeted, epsilon=8.0)
    budgeted.write_h5ad(src)
    args = ["cluster", str(src), "--n-clusters", "3", "--epsilon", "8"]
    assert main(args) == 2  # the file's own ledger could not be booked: refused before any work
    assert "--output" in capsys.readouterr().err
    assert dpsc.privacy.spent(ad.read_h5ad(src)).epsilon == 0.0
    assert main([*args, "--output", str(src)]) == 0
    assert 7.9 < dpsc.privacy.spent(ad.read_h5ad(src)).epsilon <= 8.0 * (1 + 1e-9)
    assert main([*args, "--output", str(src)]) == 2
    assert "Privacy budget exceeded" in capsys.readouterr().err
    assert main([*args, "--output", str(tmp_path / "elsewhere.h5ad")]) == 2


#: One `dpsc cluster` process whose read of its input waits (up to 5 s) for the other's read.
OVERLAPPING_RUN = """
import sys, time
from pathlib import Path
import dpsc.cli as cli
me, other, *args = sys.argv[1:]
load = cli._load
def slow_load(path):
    result = load(path)
    Path(me).touch()
    deadline = time.monotonic() + 5
    while not Path(other).exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    return result
cli._load = slow_load
sys.exit(cli.main(args))
"""


def test_two_overlapping_runs_on_a_budgeted_input_written_back_spend_it_once(small_adata, tmp_path):
    """Two `dpsc cluster IN --output IN --epsilon 8` processes at once on a budget-8 file: one runs, one
    is refused. Without the lock on the input both read the unspent ledger and both spend; with it
    the second reads what the first wrote."""
    import subprocess
    import sys

    src = tmp_path / "budgeted.h5ad"
    budgeted = small_adata.copy()
    dpsc.privacy.set_budget(budgeted, epsilon=8.0)
    budgeted.write_h5ad(src)
    args = ["cluster", str(src), "--n-clusters", "3", "--epsilon", "8", "--output", str(src)]
    marks = [str(tmp_path / "a.read"), str(tmp_path / "b.read")]
    runs = [
        subprocess.Popen([sys.executable, "-c", OVERLAPPING_RUN, me, other, *args], stderr=subprocess.PIPE)
        for me, other in (marks, marks[::-1])
    ]
    codes = sorted(run.wait(timeout=300) for run in runs)
    assert codes == [0, 2], [run.stderr.read() for run in runs]
    back = ad.read_h5ad(src)
    assert 7.9 < dpsc.privacy.spent(back).epsilon <= 8.0 * (1 + 1e-9)
    assert len(back.uns["dpsc"]["ledger"]) == 1


@pytest.mark.slow
def test_cli_fit_prints_statement_and_scores(small_adata, tmp_path, capsys):
    src, out = tmp_path / "in.h5ad", tmp_path / "out.h5ad"
    small_adata.write_h5ad(src)
    rc = main(
        [
            "fit",
            str(src),
            "--epsilon",
            "4",
            "--n-clusters",
            "3",
            "--max-epochs",
            "3",
            "--no-progress",
            "--output",
            str(out),
            "--export",
            str(tmp_path / "share"),
            "--verbose",
        ]
    )
    assert rc == 0
    text = capsys.readouterr().out
    assert "Privacy spent: epsilon =" in text and "What this covers:" in text
    assert "guarantee = proven" in text and "HEURISTIC" not in text
    assert "ARI =" in text and "Wall time" in text
    back = ad.read_h5ad(out)
    assert "X_dpdcan" in back.obsm and back.uns["dpsc"]["X_dpdcan"]["privacy"]["epsilon"] <= 4
    assert (tmp_path / "share" / "shared_encoder.pt").exists()


def test_cli_cluster_prints_a_plain_summary_first(small_adata, tmp_path, capsys):
    src, out = tmp_path / "in.h5ad", tmp_path / "out.h5ad"
    small_adata.write_h5ad(src)
    assert main(["cluster", str(src), "--n-clusters", "3", "--markers", "--output", str(out)]) == 0
    text = " ".join(capsys.readouterr().out.split())
    # at most the asked 8 (the common scale of the releases' noise is found to 0.1 %)
    assert re.search(r"Privacy: epsilon (7\.99|8\.00) at delta 1e-05, proven, per cell\. Covered:", text)
    assert " of 3 in use" in text and re.search(r"cluster \d+:", text) and "--verbose" in text
    assert "What this covers" not in text  # the full statement only with --verbose
    back = ad.read_h5ad(out)
    assert "dp_cluster" in back.obs and "dp_cluster_markers" in back.uns
    assert main(["cluster", str(src), "--n-clusters", "3", "--verbose", "--non-private"]) == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "Privacy: none" in text and "What this covers" in text


def test_cli_errors_are_one_paragraph_with_exit_code_2(small_adata, tmp_path, capsys):
    src = tmp_path / "in.h5ad"
    small_adata.write_h5ad(src)
    args = ["--max-epochs", "2", "--no-progress", "--n-clusters", "3"]
    assert main(["fit", str(src), "--label-key", "nope", *args]) == 2
    err = capsys.readouterr().err
    assert "--label-key 'nope' is not a column of obs" in err and "Traceback" not in err
    assert main(["fit", str(tmp_path / "missing.h5ad"), *args]) == 2
    assert "No such file" in capsys.readouterr().err
    lognorm = small_adata.copy()
    lognorm.X = lognorm.X.log1p()
    lognorm.uns["log1p"] = {"base": None}  # scanpy's record of sc.pp.log1p: public metadata
    lognorm.write_h5ad(tmp_path / "log.h5ad")
    assert main(["fit", str(tmp_path / "log.h5ad"), *args]) == 2
    assert "--likelihood gaussian" in capsys.readouterr().err
    with pytest.raises(ValueError):
        main(["--debug", "fit", str(tmp_path / "log.h5ad"), *args])
    with pytest.raises(SystemExit) as version:
        main(["--version"])
    assert version.value.code == 0 and "dpsc" in capsys.readouterr().out
    with_empty_gene = small_adata.copy()
    X = with_empty_gene.X.tolil()
    X[:, 0] = 0
    with_empty_gene.X = X.tocsr()
    with_empty_gene.write_h5ad(tmp_path / "empty_gene.h5ad")
    # under DP no refusal depends on the cells: a gene no cell expresses is kept and the fit runs
    assert main(["fit", str(tmp_path / "empty_gene.h5ad"), *args]) == 0


@pytest.mark.slow
def test_cli_filter_genes_drops_empty_genes_and_says_what_it_covers(small_adata, tmp_path, capsys):
    adata = small_adata.copy()
    X = adata.X.tolil()
    X[:, :2] = 0
    adata.X = X.tocsr()
    adata.write_h5ad(tmp_path / "in.h5ad")
    out = tmp_path / "out.h5ad"
    args = ["--max-epochs", "2", "--no-progress", "--n-clusters", "3", "--filter-genes", "-o", str(out)]
    assert main(["fit", str(tmp_path / "in.h5ad"), *args]) == 0
    text = capsys.readouterr().out
    assert "dropped 2 gene(s)" in text and "not covered by the ε" in text
    assert "Clusters:" in text and " of 3 used" in text
    assert ad.read_h5ad(out).n_vars == adata.n_vars - 2


def _dpsc(*args: str):
    """Run the installed ``dpsc`` command (the console script beside this Python) in a new process."""
    import shutil
    import subprocess
    import sys
    from pathlib import Path

    script = Path(sys.executable).with_name("dpsc")
    command = [str(script)] if script.exists() else [shutil.which("dpsc") or "dpsc"]
    return subprocess.run([*command, *args], capture_output=True, text=True, timeout=120)


def test_the_installed_command_answers_bad_input_fast_and_without_a_traceback(tmp_path):
    import time

    start = time.perf_counter()
    missing = _dpsc("fit", str(tmp_path / "missing.h5ad"))
    assert time.perf_counter() - start < 30  # answered before any model library loads
    assert missing.returncode == 2 and missing.stdout == ""
    assert missing.stderr.startswith("dpsc: error: No such file:") and "Traceback" not in missing.stderr
    assert "--debug" in missing.stderr
    # --debug shows the traceback, before or after the subcommand
    for args in (
        ("--debug", "fit", str(tmp_path / "missing.h5ad")),
        ("fit", str(tmp_path / "missing.h5ad"), "--debug"),
    ):
        debug = _dpsc(*args)
        assert debug.returncode == 1 and "Traceback" in debug.stderr and "FileNotFoundError" in debug.stderr
    # an unknown option is answered with the usage of the subcommand it was given to
    unknown = _dpsc("fit", str(tmp_path / "missing.h5ad"), "--epsilonn", "8")
    assert unknown.returncode == 2 and "usage: dpsc fit" in unknown.stderr
    assert "unrecognized arguments: --epsilonn 8" in unknown.stderr
    # errors name the command line's flags, not the Python API's arguments
    negative = _dpsc("fit", "--epsilon", "-1")
    assert (
        negative.returncode == 2
        and "--non-private" in negative.stderr
        and "epsilon=None" not in negative.stderr
    )
    layer = _dpsc("fit", "--layer", "counts", "--no-progress")
    said = " ".join(layer.stderr.split())
    assert (
        layer.returncode == 2 and "Unknown layer 'counts'" in said and "Leave out --layer for adata.X" in said
    )
    assert "layer=None" not in said and "Traceback" not in said
    site = _dpsc("federate", "site", "--superlink", "127.0.0.1:1")
    assert site.returncode == 2 and "--settings site.toml" in site.stderr and "Traceback" not in site.stderr
    import subprocess
    import sys

    without_flower = subprocess.run(  # as on a machine without the federated extra
        [
            sys.executable,
            "-c",
            "import sys; sys.modules['flwr'] = None; from dpsc.cli import main; "
            f"sys.exit(main(['federate', 'server', '--sites', '2', '--out', {str(tmp_path / 'fed')!r}]))",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert without_flower.returncode == 2
    assert "pip install 'dpsc[federated]'" in " ".join(without_flower.stderr.split())
    version = _dpsc("--version")
    assert version.returncode == 0 and version.stdout.startswith("dpsc ")


def test_import_and_help_do_not_load_torch():
    import subprocess
    import sys

    code = "import sys, dpsc.cli; print('torch' in sys.modules, 'scvi' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False", "False"]


@pytest.mark.slow
def test_plots_return_axes_and_save(small_adata, tmp_path, fast_train):
    dpsc.tl.fit(small_adata, epsilon=8.0, n_clusters=3, **fast_train)
    sc.pp.neighbors(small_adata, use_rep="X_dpdcan")
    sc.tl.umap(small_adata)
    ax = dpsc.pl.embedding(small_adata, color="dp_cluster", show=False)
    assert "ε" in ax.get_title()
    ax = dpsc.pl.privacy(small_adata, show=False, save=tmp_path / "eps.png")
    assert (tmp_path / "eps.png").exists()
    ys = ax.lines[0].get_ydata()
    assert ys[-1] == pytest.approx(dpsc.privacy.get_record(small_adata, "X_dpdcan")["epsilon"])
    dpsc.tl.fit(small_adata, epsilon=2.0, n_clusters=3, key_added="X_second", cluster_key="c2", **fast_train)
    ax = dpsc.pl.ledger(small_adata, show=False, save=tmp_path / "ledger.png")
    assert (tmp_path / "ledger.png").exists() and len(ax.patches) == 2
    total = ax.lines[0].get_ydata()[-1]
    assert total == pytest.approx(dpsc.privacy.spent(small_adata)[0])
    with pytest.raises(KeyError, match="X_tsne"):
        dpsc.pl.embedding(small_adata, basis="tsne", show=False)


def test_privacy_plot_needs_a_private_fit(small_adata):
    with pytest.raises(KeyError, match=r"dpsc\.tl\.fit"):
        dpsc.pl.privacy(small_adata, show=False)


def test_privacy_utility_plot(tmp_path):
    import numpy as np
    import pandas as pd

    df = pd.DataFrame(
        {
            "epsilon": [1, 1, 8, 8, None, None],
            "ari": [0.1, 0.2, 0.5, 0.6, 0.7, 0.7],
            "config": ["dp", "dp", "dp", "dp", "dp", "dp"],
        }
    )
    ax = dpsc.pl.privacy_utility(df, show=False)
    line = ax.lines[0]
    assert list(line.get_xdata()) == [1.0, 8.0]
    assert np.allclose(line.get_ydata(), [0.15, 0.55])
    assert any(np.allclose(h.get_ydata(), 0.7) for h in ax.lines[1:])
    ax.figure.canvas.draw()
    assert [label.get_text() for label in ax.get_xticklabels()] == ["1", "8"]  # the asked ε, plainly
    assert not any(label.get_text() for label in ax.get_xticklabels(minor=True))
    dpsc.pl.privacy_utility(df, save=tmp_path / "pu.png", show=False)
    assert (tmp_path / "pu.png").exists()
    with pytest.raises(KeyError, match="lacks column"):
        dpsc.pl.privacy_utility(df, y="nmi")


def test_a_site_that_refuses_says_so_in_its_own_log_with_its_name_and_exits_2(
    small_adata, tmp_path, capsys, monkeypatch
):
    """``dpsc federate site``: a refusal goes to stdout (the site's log) naming the site; --ledger kept."""
    from pathlib import Path

    import dpsc.federated

    data = tmp_path / "site_a.h5ad"
    small_adata.write_h5ad(data)
    seen = {}

    def refuse(settings_file, **kwargs):
        seen["settings"] = Path(settings_file).read_text()
        raise ValueError("This site refused the run: its budget is spent.")

    monkeypatch.setattr(dpsc.federated, "run_site", refuse)
    argv = ["federate", "site", "--data", str(data), "--superlink", "127.0.0.1:9", "--ledger", "trial2.json"]
    monkeypatch.chdir(tmp_path)
    assert main(argv) == 2
    out, err = capsys.readouterr()
    assert "Site " in out and "site_a.h5ad" in out and "budget is spent" in out
    assert "budget is spent" in err
    assert f'ledger = "{tmp_path / "trial2.json"}"' in seen["settings"]


def test_the_command_line_clusters_a_zarr_store_out_of_core_and_writes_the_results(
    small_adata, tmp_path, capsys
):
    pytest.importorskip("zarr")
    store, out = tmp_path / "cells.zarr", tmp_path / "results.h5ad"
    small_adata.write_zarr(store)
    assert main(["cluster", str(store), "--n-clusters", "3", "--noise-seed", "2", "-o", str(out)]) == 0
    assert "holds the results" in capsys.readouterr().out
    memory = small_adata.copy()
    dpsc.tl.cluster(memory, 3, noise_seed=2)
    back = ad.read_h5ad(out)
    assert back.X is None and (back.obs["dp_cluster"] == memory.obs["dp_cluster"]).all()
    assert dpsc.privacy.spent(back).epsilon == pytest.approx(dpsc.privacy.spent(memory).epsilon)


def test_a_folder_not_an_anndata_store_or_as_output_is_refused_first(small_adata, tmp_path, capsys):
    pytest.importorskip("zarr")
    import zarr

    plain = tmp_path / "plain"
    plain.mkdir()

    def said() -> str:  # the message as one line (the command wraps it to the terminal)
        return " ".join(capsys.readouterr().err.split())

    assert main(["cluster", str(plain)]) == 2
    assert "not a zarr store" in said()
    zarr.open_group(str(tmp_path / "bare.zarr"), mode="w").create_group("obs")
    assert main(["cluster", str(tmp_path / "bare.zarr")]) == 2
    assert "without the AnnData layout (no X, var)" in said()
    small_adata.write_h5ad(tmp_path / "cells.h5ad")
    assert main(["cluster", str(tmp_path / "cells.h5ad"), "-o", str(plain)]) == 2
    assert "folder; write the results to an .h5ad file" in said()
    assert dpsc.privacy.spent(ad.read_h5ad(tmp_path / "cells.h5ad")).epsilon == 0


def test_federate_server_refuses_the_flags_of_another_task_before_it_starts(tmp_path, capsys):
    """``dpsc federate server --task``: one task's flags given to the other stop the run, by name."""
    from dpsc.cli import main

    common = ["federate", "server", "--sites", "2", "--out", str(tmp_path / "fed"), "--timeout", "5"]
    assert main([*common, "--task", "fedsc", "--markers", "--n-vars", "50"]) == 2
    assert (
        "--markers belong to --task pipeline; the 'fedsc' task does not take them" in capsys.readouterr().err
    )
    assert main([*common, "--rounds", "5"]) == 2
    assert (
        "--rounds belong to --task fedsc; the 'pipeline' task does not take them" in capsys.readouterr().err
    )
    assert main([*common, "--task", "fedsc"]) == 2
    assert "give the number of genes every site holds" in " ".join(capsys.readouterr().err.split())
    assert not (tmp_path / "fed").exists()  # nothing started, nothing written
