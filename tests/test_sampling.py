import numpy as np

from dpsc.model import DPDCAN
from dpsc.privacy import NoiseSource, PoissonSampling
from dpsc.train import PoissonDataSplitter


def test_poisson_batches_vary_and_match_the_rate(small_adata):
    DPDCAN.setup_anndata(small_adata)
    model = DPDCAN(small_adata, n_clusters=3)
    n = small_adata.n_obs
    splitter = PoissonDataSplitter(
        model.adata_manager, PoissonSampling(0.1, NoiseSource()), steps_per_epoch=10
    )
    sizes = []
    for _ in range(20):
        batches = list(splitter.train_dataloader())
        assert len(batches) == 10  # one epoch = round(1/q) draws, as accounted
        sizes += [b["X"].shape[0] for b in batches]
    sizes = np.array(sizes)
    assert len(set(sizes)) > 5, "Poisson batches must vary in size"
    # mean qn, sd sqrt(n q (1-q)); 200 draws
    assert abs(sizes.mean() - 0.1 * n) < 4 * np.sqrt(n * 0.09 / len(sizes))
    assert sizes.min() >= 0 and sizes.max() <= n


def test_batches_are_rows_of_the_data(small_adata):
    DPDCAN.setup_anndata(small_adata)
    model = DPDCAN(small_adata, n_clusters=3)
    splitter = PoissonDataSplitter(
        model.adata_manager, PoissonSampling(0.5, NoiseSource()), steps_per_epoch=1
    )
    batch = next(iter(splitter.train_dataloader()))["X"].numpy()
    dense = small_adata.X.toarray()
    assert all(any(np.array_equal(row, d) for d in dense) for row in batch[:5])


def test_the_engine_loop_and_the_data_splitter_draw_the_same_poisson_batches(small_adata):
    """One sampler: at the same noise seed, the DP-SGD loop and DP-DCAN's loader take the same cells."""
    from dpsc.privacy import DPSGDSettings

    n = small_adata.n_obs
    settings = DPSGDSettings.from_sigma(
        n_obs=n, sample_rate=0.2, noise_multiplier=1.0, max_grad_norm=1.0, noise=NoiseSource(noise_seed=3)
    )
    loop = [list(batch) for batch in settings.sampling.batches(n, 5)]
    DPDCAN.setup_anndata(small_adata)
    model = DPDCAN(small_adata, n_clusters=3)
    splitter = PoissonDataSplitter(model.adata_manager, PoissonSampling(0.2, NoiseSource(noise_seed=3)), 5)
    loader = list(splitter.train_dataloader().sampler)
    assert loop == loader and len({len(b) for b in loop}) > 1


def test_no_module_draws_a_poisson_sample_of_cells_outside_the_one_sampler():
    """A scan of the package: the secure Bernoulli mask is drawn only inside PoissonSampling."""
    from pathlib import Path

    import dpsc

    root = Path(dpsc.__file__).parent
    drawers = {
        str(path.relative_to(root))
        for path in root.rglob("*.py")
        for line in path.read_text().splitlines()
        if "bernoulli_mask(" in line and "def bernoulli_mask" not in line
    }
    assert drawers == {"privacy/_engine.py"}
