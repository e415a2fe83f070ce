"""``PrivateDBN``: private RBM hidden layers stacked under a private softmax layer."""

from __future__ import annotations

from typing import Any

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from ..privacy import NoiseSource, estimator_record
from ._moments import scale_patches
from ._rbm import PrivateRBM
from ._softmax import PrivateSoftmax


def image_patches(images: np.ndarray, kernel_size: int) -> np.ndarray:
    """``(n, H, W)`` images → ``(n, P, k²)`` patches (stride 1, no padding)."""
    windows = sliding_window_view(images, (kernel_size, kernel_size), axis=(1, 2))
    n, gh, gw = windows.shape[:3]
    return windows.reshape(n, gh * gw, kernel_size * kernel_size)


def max_pool(hidden: np.ndarray, grid: tuple[int, int], pool: int) -> np.ndarray:
    """``(n, P, m)`` hidden maps on a ``grid`` → max over ``pool × pool`` blocks, flattened."""
    n, _, m = hidden.shape
    gh, gw = grid
    ph, pw = gh // pool, gw // pool
    maps = hidden.reshape(n, gh, gw, m)[:, : ph * pool, : pw * pool]
    return maps.reshape(n, ph, pool, pw, pool, m).max(axis=(2, 4)).reshape(n, -1)


def centre_hidden(hidden: np.ndarray) -> np.ndarray:
    """``(2h − 1) / m`` for ``h ∈ [0, 1]^m``: a fixed affine map into ``‖·‖_1 ≤ 1``, centred at 0."""
    return (2.0 * hidden - 1.0) / hidden.shape[-1]


def softmax_features(hidden: np.ndarray) -> np.ndarray:
    """Top-layer input ``a = (2h − 1)/m`` (no intercept column) for ``h ∈ [0, 1]^m``: ``‖a‖_1 ≤ 1``.

    Centring at ``h = ½`` (a constant, not a data mean) keeps the common offset of all cells out
    of the noisy statistics. There is no constant feature: its noisy class coefficient would be
    added to every cell's score alike and, at small ε, decide the prediction on its own.
    """
    return centre_hidden(hidden)


class PrivateDBN:
    """Private deep belief network classifier (pCDBN-style, Phan, Wu & Dou 2017).

    Layers are trained greedily, bottom-up, each on the output of the one below:
    hidden layers are :class:`PrivateRBM` (the first one convolutional when ``image_shape`` is set),
    the top is :class:`PrivateSoftmax` on ``P(h = 1 | x)`` of the last hidden layer. Layer ``i``
    spends ``ε_i = epsilon · epsilon_split[i]``; they see the same samples, so by sequential
    composition the model is ``Σ_i ε_i = epsilon``-DP (pure, ``δ = 0``) with respect to replacing
    one training sample (its features and label). The number of epochs does not change this.

    Parameters
    ----------
    hidden
        Hidden units per RBM layer (for the convolutional layer: number of filters).
    epsilon
        Total budget.
    epsilon_split
        Shares of ``epsilon`` per layer (hidden layers, then softmax), summing to 1; equal shares
        by default.
    degree, radius, approximation
        Polynomial approximation of each RBM's energy (:func:`dpsc.fm.approximate_softplus`).
    epochs, lr
        Gradient steps and Adam learning rate of each RBM.
    image_shape, kernel_size, pool
        For image input ``X`` of shape ``(n, H·W)`` with values in ``[0, 1]``: the first layer is
        convolutional with ``kernel_size²`` filters' inputs, followed by ``pool × pool`` max pooling.
    input_l1_bound
        Dense input: ``None`` scales every sample to unit L1 norm (direction only); a number is a
        public bound on ``‖x‖_1`` used as a fixed divisor. Image patches use the bound ``k²``
        (pixels in ``[0, 1]``), see :func:`dpsc.fm.scale_patches`.
    """

    def __init__(
        self,
        hidden: tuple[int, ...] = (16,),
        *,
        epsilon: float = 1.0,
        epsilon_split: tuple[float, ...] | None = None,
        degree: int = 7,
        radius: float = 4.0,
        approximation: str = "chebyshev",
        epochs: int = 200,
        lr: float = 0.01,
        image_shape: tuple[int, int] | None = None,
        kernel_size: int = 3,
        pool: int = 2,
        input_l1_bound: float | None = None,
        regularization: float | None = None,
        random_state: int = 0,
        noise_seed: int | None = None,
    ) -> None:
        self.hidden = tuple(hidden)
        self.epsilon = epsilon
        self.epsilon_split = epsilon_split
        self.degree = degree
        self.radius = radius
        self.approximation = approximation
        self.epochs = epochs
        self.lr = lr
        self.image_shape = image_shape
        self.kernel_size = kernel_size
        self.pool = pool
        self.input_l1_bound = input_l1_bound
        self.regularization = regularization
        self.random_state = random_state
        self.noise_seed = noise_seed

    def _split(self) -> np.ndarray:
        n_layers = len(self.hidden) + 1
        split = (
            np.full(n_layers, 1.0 / n_layers)
            if self.epsilon_split is None
            else np.asarray(self.epsilon_split, float)
        )
        if split.shape != (n_layers,) or np.any(split <= 0) or not np.isclose(split.sum(), 1.0):
            raise ValueError(
                f"epsilon_split must hold {n_layers} positive shares (hidden layers, then softmax) "
                f"summing to 1, got {self.epsilon_split}."
            )
        return split

    def _first_patches(self, X: np.ndarray) -> np.ndarray:
        if self.image_shape is None:
            return scale_patches(X[:, None, :], self.input_l1_bound)
        if X.min(initial=0.0) < 0 or X.max(initial=0.0) > 1:
            raise ValueError(
                "Image input must have values in [0, 1] (divide by the public maximum, e.g. 16 for digits)."
            )
        images = X.reshape(-1, *self.image_shape)
        return scale_patches(image_patches(images, self.kernel_size), float(self.kernel_size**2))

    def _layer_output(self, index: int, layer: PrivateRBM, patches: np.ndarray) -> np.ndarray:
        hidden = layer.transform(patches)
        if index == 0 and self.image_shape is not None:
            grid = (self.image_shape[0] - self.kernel_size + 1, self.image_shape[1] - self.kernel_size + 1)
            return max_pool(hidden, grid, self.pool)
        return hidden[:, 0, :]

    def fit(self, X: np.ndarray, y: np.ndarray) -> PrivateDBN:
        """Train on features ``X`` ``(n, d)`` and integer-coded or string labels ``y``."""
        if not self.epsilon > 0:
            raise ValueError(f"epsilon must be > 0, got {self.epsilon}.")
        X = np.asarray(X, dtype=float)
        self.n_train_ = int(X.shape[0])
        self.classes_, codes = np.unique(np.asarray(y), return_inverse=True)
        if self.classes_.size < 2:
            raise ValueError("Need at least 2 classes to train a classifier.")
        split = self._split()
        self.epsilon_per_layer_ = [float(self.epsilon * s) for s in split]
        rng = NoiseSource(self.noise_seed).stream("fm.dbn")  # secret unless noise_seed
        self.layers_: list[PrivateRBM] = []
        if self.image_shape is not None and not self.hidden:
            raise ValueError("Image input needs at least one (convolutional) hidden layer.")
        patches = self._first_patches(X)
        hidden = patches[:, 0, :]
        for i, n_hidden in enumerate(self.hidden):
            layer = PrivateRBM(
                n_hidden,
                epsilon=self.epsilon_per_layer_[i],
                degree=self.degree,
                radius=self.radius,
                approximation=self.approximation,
                epochs=self.epochs,
                lr=self.lr,
                random_state=self.random_state + i,
            ).fit(patches, rng)
            self.layers_.append(layer)
            hidden = self._layer_output(i, layer, patches)
            patches = centre_hidden(hidden)[:, None, :]
        features = softmax_features(hidden) if self.hidden else hidden
        self.top_ = PrivateSoftmax(
            epsilon=self.epsilon_per_layer_[-1],
            regularization=self.regularization,
            random_state=self.random_state,
        ).fit(features, codes, self.classes_.size, rng)
        self.spent_epsilon_ = float(sum(self.epsilon_per_layer_))
        return self

    def _top_features(self, X: np.ndarray) -> np.ndarray:
        patches = self._first_patches(np.asarray(X, dtype=float))
        hidden = patches[:, 0, :]
        for i, layer in enumerate(self.layers_):
            hidden = self._layer_output(i, layer, patches)
            patches = centre_hidden(hidden)[:, None, :]
        return softmax_features(hidden) if self.hidden else hidden

    def predict_proba(self, X: np.ndarray) -> np.ndarray:
        return self.top_.predict_proba(self._top_features(X))

    def predict(self, X: np.ndarray) -> np.ndarray:
        return self.classes_[self.predict_proba(X).argmax(1)]

    def privacy_record(self) -> dict[str, Any]:
        """Per-layer ε, mechanisms, sensitivities and the total (sequential composition)."""
        return estimator_record(
            tool="PrivateDBN",
            epsilon=self.spent_epsilon_,
            delta=0.0,
            n_rows=self.n_train_,
            mechanism="the functional mechanism (Laplace noise on the Chebyshev coefficients of each "
            "layer's objective, released once, whatever the number of epochs)",
            covered="the weights of every layer",
            noise_seed=self.noise_seed,
            details={
                "epsilon_split": [float(s) for s in self._split()],
                # a dict, not a list of dicts, so that the record can be written to .h5ad
                "layers": {
                    **{f"rbm_{i}": layer.privacy_record() for i, layer in enumerate(self.layers_)},
                    "softmax": self.top_.privacy_record(),
                },
                "composition": "sequential (sum of the per-layer ε), pure ε-DP",
                "epochs": self.epochs,
            },
        ).to_dict()
