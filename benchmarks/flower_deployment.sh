#!/usr/bin/env bash
# Run FedSC as a real multi-process Flower deployment on loopback: one SuperLink, one SuperNode
# per site, and `flwr run` submitting the dpsc apps (dpsc.federated.app). Uses the embedded PBMC
# data split over N_SITES sites; prints the per-round losses and the ARI of the global encoder.
# Usage: bash benchmarks/flower_deployment.sh [N_SITES] [ROUNDS] [LOCAL_EPOCHS]
set -euo pipefail
N=${1:-2}; ROUNDS=${2:-3}; EPOCHS=${3:-1}
WORK=$(mktemp -d); export FLWR_HOME="$WORK/flwr-home"; mkdir -p "$FLWR_HOME"
trap 'kill $(jobs -p) 2>/dev/null || true' EXIT

python - "$WORK" "$N" <<'PY'
import sys
from pathlib import Path
import numpy as np
import dpsc
from dpsc.federated._flower import write_client_data
from dpsc.tl._federated import represent

work, n = Path(sys.argv[1]), int(sys.argv[2])
adata = dpsc.datasets.pbmc4k()
dpsc.pp.partition(adata, n, random_state=0)
X = represent(adata.X, "zinb")
sites = adata.obs["client"].astype(int).to_numpy()
write_client_data(work / "data", [X[sites == k] for k in range(n)])
np.save(work / "all.npy", X)
np.save(work / "labels.npy", adata.obs["cell_type"].astype(str).to_numpy())
PY

# Flower resolves app components inside the app directory, so the app is a one-line module
# assigning dpsc's apps (Flower checks for the assignments statically).
printf 'import dpsc.federated.app as apps\n\nserver_app = apps.server_app\nclient_app = apps.client_app\n' > "$WORK/fedsc_app.py"
cat > "$WORK/pyproject.toml" <<TOML
[build-system]
requires = ["hatchling"]
build-backend = "hatchling.build"

[project]
name = "dpsc-fedsc"
version = "0.1.0"
dependencies = []

[tool.hatch.build.targets.wheel]
packages = ["."]

[tool.flwr.app]
publisher = "dpsc"

[tool.flwr.app.components]
serverapp = "fedsc_app:server_app"
clientapp = "fedsc_app:client_app"

[tool.flwr.app.config]
method = "fedsc"
rounds = $ROUNDS
local-epochs = $EPOCHS
data-dir = "$WORK/data"
out-dir = "$WORK/out"
TOML
cat > "$FLWR_HOME/config.toml" <<TOML
[superlink]
default = "loopback"

[superlink.loopback]
address = "127.0.0.1:8000"
insecure = true
TOML

flower-superlink --insecure > "$WORK/superlink.log" 2>&1 &
sleep 5
for k in $(seq 0 $((N - 1))); do
  flower-supernode --insecure --superlink 127.0.0.1:8000 --port $((9094 + k)) \
    --node-config "partition-id=$k num-partitions=$N" > "$WORK/supernode_$k.log" 2>&1 &
done
sleep 5
start=$(date +%s)
(cd "$WORK" && flwr run . loopback --stream)
for _ in $(seq 1 120); do [ -f "$WORK/out/history.json" ] && break; sleep 2; done
echo "wall time of the run: $(( $(date +%s) - start )) s"

python - "$WORK" <<'PY'
import json, sys
from pathlib import Path
import numpy as np, torch
from sklearn.cluster import KMeans
from sklearn.metrics import adjusted_rand_score
from dpsc.federated._ssl import SSLConfig, SSLNet, embed

work = Path(sys.argv[1])
history = json.loads((work / "out" / "history.json").read_text())
print("per-round mean client loss:", {r: round(m["loss"], 4) for r, m in history.items()})
X, labels = np.load(work / "all.npy"), np.load(work / "labels.npy", allow_pickle=True)
net = SSLNet(X.shape[1], SSLConfig(method="fedsc"))
net.load_shared(torch.load(work / "out" / "global.pt", weights_only=True))
z = embed(net, X)
pred = KMeans(8, n_init=10, random_state=0).fit_predict(z)
print(f"ARI of the deployed global encoder + k-means: {adjusted_rand_score(labels, pred):.3f}")
PY
