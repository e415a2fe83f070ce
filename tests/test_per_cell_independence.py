"""Per-sample means per-sample: a cell's loss may depend on that cell only.

For each loss term we compute every cell's per-sample gradient (one autograd call per cell),
change the counts of one cell k, and check that only row k changed. A negative control (DEC's
original batch-normalised target) shows the check detects coupling.
"""

import pytest
import torch

from dpsc.module import DCANModule, dec_kl_per_cell, student_t_assignment

K = 2


def per_sample_grads(module, loss_fn, x):
    params = [p for p in module.parameters() if p.requires_grad]
    loss = loss_fn(x)
    assert loss.shape == (x.shape[0],), "loss must be one value per cell"
    rows = []
    for i in range(x.shape[0]):
        grads = torch.autograd.grad(loss[i], params, retain_graph=True, allow_unused=True)
        rows.append(
            torch.cat(
                [
                    (g if g is not None else torch.zeros_like(p)).flatten()
                    for g, p in zip(grads, params, strict=True)
                ]
            )
        )
    return torch.stack(rows)


@pytest.fixture(params=["genes", "input_pcs"])
def tiny_module(request, small_adata):
    """The conftest module reading genes, and one reading frozen input loadings (``input_pcs``)."""
    torch.manual_seed(0)
    pcs = 3 if request.param == "input_pcs" else None
    module = DCANModule(n_input=small_adata.n_vars, n_clusters=3, n_latent=4, n_hidden=(16, 8), input_pcs=pcs)
    with torch.no_grad():
        module.clustering.centroids.normal_()
        if pcs:
            module.set_input_loadings(torch.linalg.qr(torch.randn(small_adata.n_vars, pcs))[0])
    return module


def changed_rows(module, loss_fn, x):
    before = per_sample_grads(module, loss_fn, x)
    x2 = x.clone()
    x2[K] = x2[K] * 3 + 1
    after = per_sample_grads(module, loss_fn, x2)
    diff = (before - after).abs().amax(1)
    return {i for i in range(x.shape[0]) if diff[i] > 1e-7}


def _with_grad_instance(module, x, name):
    from dpsc.module import instance_loss_per_cell
    from dpsc.module._dcan import mask_views

    g = torch.Generator().manual_seed(123)
    rep = module.represent(x)
    views = torch.cat([rep.unsqueeze(1), mask_views(rep, 2, 0.2, g)], dim=1)
    z_all = module.encode(views)
    if name == "reconstruction":
        return module.reconstruction_per_cell(x, rep, z_all[:, 0])
    return instance_loss_per_cell(z_all[:, 1:])


def _cluster_term(module, name):
    def fn(x):
        from dpsc.module import per_cell_target

        rep = module.represent(x)
        z = module.encode(rep)
        if name == "reconstruction":
            return module.reconstruction_per_cell(x, rep, z)
        q = module.soft_assignment(z)
        return dec_kl_per_cell(q, per_cell_target(q))

    return fn


@pytest.mark.parametrize("name", ["reconstruction", "instance"])
def test_instance_stage_terms_are_per_cell(tiny_module, counts, name):
    assert changed_rows(tiny_module, lambda x: _with_grad_instance(tiny_module, x, name), counts) == {K}


def test_instance_stage_total_is_per_cell(tiny_module, counts):
    def total(x):
        g = torch.Generator().manual_seed(123)
        return tiny_module.instance_stage_loss(x, rho=0.8, mask_rate=0.2, generator=g)[0]

    assert changed_rows(tiny_module, total, counts) == {K}


@pytest.mark.parametrize("name", ["reconstruction", "clustering"])
def test_cluster_stage_terms_are_per_cell(tiny_module, counts, name):
    assert changed_rows(tiny_module, _cluster_term(tiny_module, name), counts) == {K}


@pytest.mark.parametrize("frequency", [None, "released"])
def test_cluster_stage_total_is_per_cell(tiny_module, counts, frequency):
    # released frequencies are a constant (computed before the step), as dp_cluster_frequency gives
    f = None if frequency is None else torch.linspace(5.0, 1.0, tiny_module.clustering.centroids.shape[0])

    def total(x):
        return tiny_module.cluster_stage_loss(x, betas=(0.4, 0.4, 0.2), frequency=f)[0]

    assert changed_rows(tiny_module, total, counts) == {K}


def test_separation_penalty_reads_no_cell(tiny_module):
    # the data-independent term has no data argument at all: its gradient is post-processing
    penalty = tiny_module.parameter_penalty((0.4, 0.4, 0.2))
    assert penalty.dim() == 0


def test_negative_control_batch_normalised_target_is_detected(tiny_module, counts):
    """DEC's original target p ∝ q²/f_j with f_j summed over the batch couples cells."""

    def coupled(x):
        z = tiny_module.encode(tiny_module.represent(x))
        q = tiny_module.soft_assignment(z)
        p = q.pow(2) / q.sum(0)  # not detached: the batch frequency carries other cells' data
        p = p / p.sum(1, keepdim=True)
        return dec_kl_per_cell(q, p)

    assert len(changed_rows(tiny_module, coupled, counts)) > 1


def test_student_t_uses_no_batch_statistics():
    d = torch.rand(5, 3)
    q_all = student_t_assignment(d)
    q_one = torch.cat([student_t_assignment(d[i : i + 1]) for i in range(5)])
    torch.testing.assert_close(q_all, q_one)
