"""DP vs non-private local training time of one FedSC site (synthetic counts, 1 thread).

Usage: python benchmarks/diagnostics/federated_step_timing.py  (prints the two times and their ratio)
Both runs take the same number of steps: ⌈n/B⌉ per epoch (shuffled batches vs Poisson draws).
"""

import time

import numpy as np
import torch

from dpsc.federated import SSLConfig
from dpsc.federated._ssl import ClientDP, SSLNet, local_train, local_train_private

torch.set_num_threads(1)
X = np.log1p(np.random.default_rng(0).poisson(1.0, (1000, 2000))).astype(np.float32)
times = {}
for label in ("non-private", "DP-SGD (ghost clipping)"):
    torch.manual_seed(0)
    net = SSLNet(X.shape[1], SSLConfig(method="fedsc"))
    start = time.perf_counter()
    if label == "non-private":
        local_train(net, X, 3, random_state=0)
    else:
        local_train_private(net, X, 3, seed=0, dp=ClientDP(1.0, 1.0, "sgd", 0.032))
    times[label] = time.perf_counter() - start
    print(f"{label}: {times[label]:.2f} s for 3 local epochs")
print(f"ratio DP / non-private: {times['DP-SGD (ghost clipping)'] / times['non-private']:.2f}")
