"""A site runs only the ClientApp of its own installation: a server's bundle is compared, never run."""

from __future__ import annotations

import io
import json
import subprocess
import sys
import threading
import zipfile
from pathlib import Path

import anndata as ad
import numpy as np
import pytest
import scipy.sparse as sp

from dpsc.federated._own_app import (
    CODE_FILE,
    BundleRefusal,
    app_files,
    bundle_fingerprint,
    check_bundle,
    code_fingerprint,
)


def fab(files: dict[str, bytes]) -> bytes:
    """A bundle as ``flwr build`` lays it out (``pyproject.toml`` first, a manifest at the end)."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as bundle:
        for name, content in files.items():
            bundle.writestr(name, content)
        bundle.writestr(".info/CONTENT", "derived")
    return buffer.getvalue()


def test_the_sites_own_bundle_is_accepted_as_flower_builds_it(tmp_path):
    pytest.importorskip("flwr")
    from flwr.cli.build import build_fab_from_disk

    from dpsc.federated._own_app import write_app_project

    own = app_files("pipeline")
    built = build_fab_from_disk(write_app_project(tmp_path / "app", "pipeline"))
    assert check_bundle(built, own) == bundle_fingerprint(own)


@pytest.mark.parametrize(
    "change",
    ["module", "extra file", "version", "components", "defaults", "code"],
)
def test_any_other_bundle_is_refused_before_it_is_read_as_code(change):
    own = app_files("pipeline")
    theirs = dict(own)
    if change == "module":
        theirs["dpsc_app.py"] = own["dpsc_app.py"] + b"import os; os.system('cat /data')\n"
    elif change == "extra file":
        theirs["sitecustomize.py"] = b"print('hello')\n"
    elif change == "version":
        theirs["pyproject.toml"] = own["pyproject.toml"].replace(b'version = "', b'version = "9')
    elif change == "components":
        theirs["pyproject.toml"] = own["pyproject.toml"].replace(b"dpsc_app:client_app", b"evil:client_app")
    elif change == "code":  # the same version, another installed dpsc code
        theirs[CODE_FILE] = json.dumps({"dpsc_sha256": "0" * 64}).encode()
    else:
        theirs["pyproject.toml"] = own["pyproject.toml"].replace(b"n-clusters = 8", b"n-clusters = 9")
    with pytest.raises(BundleRefusal, match="not this site's own dpsc app") as refused:
        check_bundle(fab(theirs), own)
    if change == "version":
        assert "must install the same dpsc version" in str(refused.value)
    if change == "code":
        assert "installed dpsc code is not this site's (code fingerprint 0000000000000000" in str(
            refused.value
        )


def test_a_site_serves_one_task_and_refuses_the_bundle_of_another():
    """A site that serves the clustering refuses FedSC's own, unmodified bundle, and the other way round."""
    from dpsc.federated import TASKS

    bundles = {task: app_files(task) for task in TASKS}
    assert set(bundles) == {"pipeline", "fedsc"}
    for task, own in bundles.items():
        assert check_bundle(fab(own), own) == bundle_fingerprint(own)
        assert f"import {TASKS[task].app_module} as apps" in own["dpsc_app.py"].decode()
        for other in set(bundles) - {task}:
            with pytest.raises(BundleRefusal, match="not this site's own dpsc app"):
                check_bundle(fab(bundles[other]), own)


def test_the_fingerprint_covers_every_file_of_the_installed_dpsc(tmp_path):
    """Two installations that differ in one byte of one module print different fingerprints."""
    import shutil

    import dpsc

    installed = Path(dpsc.__file__).resolve().parent
    copies = [tmp_path / name / "dpsc" for name in ("same", "edited")]
    for copy in copies:
        shutil.copytree(installed, copy, ignore=shutil.ignore_patterns("__pycache__"))
    edited = copies[1] / "privacy" / "_ledger.py"
    edited.write_bytes(edited.read_bytes() + b"\n")
    assert code_fingerprint(copies[0]) == code_fingerprint()
    assert code_fingerprint(copies[1]) != code_fingerprint()
    assert json.loads(app_files("pipeline")[CODE_FILE]) == {"dpsc_sha256": code_fingerprint()}


def test_a_bundle_that_is_no_zip_or_too_large_is_refused():
    own = app_files("pipeline")
    with pytest.raises(BundleRefusal, match="not a readable"):
        check_bundle(b"not a zip", own)
    with pytest.raises(BundleRefusal, match="larger"):
        check_bundle(b"\0" * (2 << 20), own)


def test_key_order_and_layout_of_the_pyproject_do_not_count():
    own = app_files("pipeline")
    import tomllib

    config = tomllib.loads(own["pyproject.toml"].decode())
    pytest.importorskip("tomli_w")
    import tomli_w

    rewritten = dict(own, **{"pyproject.toml": tomli_w.dumps(config).encode()})
    assert bundle_fingerprint(rewritten) == bundle_fingerprint(own)


HOSTILE_APP = """import json, tomllib
from pathlib import Path

import anndata as ad
import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Message, RecordDict
from flwr.clientapp import ClientApp
from flwr.serverapp import Grid, ServerApp

client_app = ClientApp()
server_app = ServerApp()


@client_app.train()
def steal(msg, context):
    Path(context.node_config["settings"] + ".stolen").write_text("the server's code ran at the site")
    settings = tomllib.loads(Path(context.node_config["settings"]).read_text())
    counts = ad.read_h5ad(settings["data"]).X
    counts = counts.toarray() if hasattr(counts, "toarray") else np.asarray(counts)
    return Message(RecordDict({"counts": ArrayRecord([counts])}), reply_to=msg)


@server_app.main()
def main(grid: Grid, context) -> None:
    import time

    deadline = time.monotonic() + 60
    while not grid.get_node_ids() and time.monotonic() < deadline:
        time.sleep(0.5)
    asks = [
        Message(RecordDict({"c": ConfigRecord({"x": 1})}), dst_node_id=node, message_type="train")
        for node in grid.get_node_ids()
    ]
    out = {"counts": [], "errors": []}
    for reply in grid.send_and_receive(asks, timeout=60):
        if reply.has_content():
            out["counts"].append(reply.content["counts"].to_numpy_ndarrays()[0].tolist())
        else:
            out["errors"].append(reply.error.reason)
    Path(context.run_config["out"]).write_text(json.dumps(out))
"""


@pytest.mark.optional_extra
@pytest.mark.parametrize("task", ["pipeline", "fedsc"])
def test_a_hostile_bundle_is_refused_and_nothing_leaves_the_site(tmp_path, task):
    """A real ``dpsc federate site --task`` on loopback; the server submits a ClientApp reading the counts."""
    pytest.importorskip("flwr")
    from dpsc.federated._deploy import free_port, submit_app

    rng = np.random.default_rng(0)
    data = tmp_path / "site.h5ad"
    ad.AnnData(sp.csr_matrix(rng.poisson(1.0, size=(40, 20)).astype(np.float32))).write_h5ad(data)
    project = tmp_path / "hostile"
    project.mkdir()
    (project / "dpsc_app.py").write_text(HOSTILE_APP)
    pyproject = app_files(task, {"out": str(tmp_path / "stolen.json")})["pyproject.toml"]
    (project / "pyproject.toml").write_bytes(pyproject)  # dpsc's own name and components, another module
    port = free_port()
    site_log = tmp_path / "site.log"
    site = subprocess.Popen(
        [
            *(sys.executable, "-m", "dpsc.cli", "federate", "site", "--task", task, "--data", str(data)),
            *("--epsilon", "1"),
            *("--budget", "1", "--superlink", f"127.0.0.1:{port}", "--timeout", "120"),
        ],
        stdout=open(site_log, "w"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    server = threading.Thread(
        target=submit_app,
        args=(project, {"out": str(tmp_path / "stolen.json")}, tmp_path / "server"),
        kwargs={"host": "127.0.0.1", "port": port, "timeout": 120},
    )
    server.start()
    try:
        assert site.wait(timeout=150) == 2
    finally:
        if site.poll() is None:
            site.kill()
        server.join(timeout=150)
    text = " ".join(site_log.read_text().split())
    assert "This site refused the run: The server sent an app bundle that is not this site's own" in text
    assert not Path(str(data.with_suffix(".dpsc-site.toml")) + ".stolen").exists()  # none of it ran
    stolen = json.loads((tmp_path / "stolen.json").read_text())
    assert stolen["counts"] == [] and len(stolen["errors"]) == 1
    assert "not this site's own dpsc app" in stolen["errors"][0]
    ledger = Path(str(data) + ".dpsc-ledger.json")
    assert not ledger.exists() or json.loads(ledger.read_text())["entries"] == {}


@pytest.mark.slow
@pytest.mark.optional_extra
def test_the_loopback_recipe_of_the_docs_runs_as_written(tmp_path):
    """The federation on one machine of docs/howto/federated.md, run as written (free port, new folder)."""
    pytest.importorskip("flwr")
    import os
    import re

    from dpsc.federated._deploy import free_port

    text = (Path(__file__).parents[1] / "docs" / "howto" / "federated.md").read_text()
    block = re.search(r"\*\*On one machine first\.\*\*.*?```bash\n(.*?)```", text, re.S).group(1)
    readme = (Path(__file__).parents[1] / "README.md").read_text()
    assert f"```bash\n{block}```" in readme  # the README's loopback recipe is this one
    block = block.replace("8000", str(free_port()))
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    done = subprocess.run(["bash", "-c", block], cwd=tmp_path, env=env, timeout=500, capture_output=True)
    assert done.returncode == 0, done.stderr[-2000:]
    server = (tmp_path / "server.log").read_text()
    fingerprint = re.search(r"fingerprint (\w+)", server).group(1)
    for name in ("site_a", "site_b"):
        log = (tmp_path / f"{name}.log").read_text()
        assert f"fingerprint {fingerprint}" in log and "Release 1 of" in log and "left." in log
        out = ad.read_h5ad(tmp_path / f"{name}.dpsc.h5ad")
        assert out.obs["dp_cluster"].notna().all()
    assert "8 released centroids" in server or "released centroids hold cells" in server


@pytest.mark.optional_extra
def test_stopping_the_runner_ends_a_call_that_is_already_retrying():
    """When the site stops (its server is gone), a call to its SuperNode that is in its retry loop gives
    up at its next failure instead of retrying forever, so the site's process ends within seconds."""
    pytest.importorskip("flwr")
    import time

    import httpx

    from dpsc.federated._own_app import OwnAppRunner

    runner = OwnAppRunner("127.0.0.1:9", b"0" * 32, "pipeline", lambda reason: None)
    runner._client(token="a task")  # the client of one task: its calls retry RETRIES times
    invoker = runner._invokers[-1]
    invoker.wait_function = lambda seconds: time.sleep(0.05)  # fast backoff for the test
    tries = []

    def unreachable():
        tries.append(time.monotonic())
        raise httpx.ConnectError("the SuperNode is gone")

    ended = []

    def retrying_call():
        with pytest.raises(httpx.ConnectError):
            invoker.invoke(unreachable)
        ended.append(len(tries))

    call = threading.Thread(target=retrying_call, daemon=True)
    call.start()
    while len(tries) < 3:
        time.sleep(0.01)
    runner.stop()
    call.join(timeout=5)
    assert not call.is_alive() and ended and len(tries) <= 5


def test_the_superexec_secret_is_private_to_the_site_and_never_a_planted_file(tmp_path, monkeypatch):
    """The secret lies in a new 0700 folder, in a file created exclusively with mode 0600; a file planted
    at the old predictable path (mode 0666) is neither used nor changed; the folder goes afterwards."""
    import os
    import stat
    import tempfile

    from dpsc.federated._deploy import superexec_secret

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    planted = tmp_path / f"dpsc-site-{os.getpid()}-9999.secret"
    planted.write_bytes(b"known to another user")
    planted.chmod(0o666)
    with superexec_secret() as secret:
        assert secret.parent.parent == tmp_path and secret != planted
        assert stat.S_IMODE(secret.stat().st_mode) == 0o600
        assert stat.S_IMODE(secret.parent.stat().st_mode) == 0o700
        assert len(secret.read_bytes()) == 32 and secret.read_bytes() != b"known to another user"
    assert not secret.parent.exists()
    assert planted.read_bytes() == b"known to another user" and stat.S_IMODE(planted.stat().st_mode) == 0o666
