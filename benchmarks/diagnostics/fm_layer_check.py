"""Which layer's noise hurts pCDBN on digits? One layer gets ε = 4, the other an ε so large it is noise-free.

Usage: python benchmarks/diagnostics/fm_layer_check.py (about 30 s; output quoted in docs/benchmarks.md).
"""

import numpy as np
import torch
from sklearn.datasets import load_digits

from dpsc import fm

torch.set_num_threads(1)
X, y = load_digits(return_X_y=True)
X = X / 16
order = np.random.default_rng(0).permutation(len(y))
tr, te = order[:1257], order[1257:]
big = 1e9
for label, eps, split in [
    ("RBM ε=4, softmax noise-free", 4 + big, (4 / (4 + big), big / (4 + big))),
    ("RBM noise-free, softmax ε=4", 4 + big, (big / (4 + big), 4 / (4 + big))),
]:
    m = fm.PrivateDBN(
        (8,), epsilon=eps, epsilon_split=split, image_shape=(8, 8), kernel_size=3, pool=3, epochs=100
    ).fit(X[tr], y[tr])
    print(label, round(float((m.predict(X[te]) == y[te]).mean()), 3))
