import pytest
import torch

from dpsc.privacy import DPSGDSettings, NoiseSource, make_accountant
from dpsc.train import DCANTrainingPlan

C = 0.05


def make_plan(module, stage, scope, sigma, seed=0, lr=0.0):
    dp = DPSGDSettings(
        noise_multiplier=sigma,
        max_grad_norm=C,
        sample_rate=0.1,
        expected_batch_size=6,
        accountant=make_accountant("rdp"),
        noise=NoiseSource(seed),
    )
    plan = DCANTrainingPlan(module, stage=stage, dp=dp, scope=scope, optimizer="sgd", lr=lr)
    plan.attach_privacy()
    return plan


def loss_of(plan, x):
    plan.mask_generator.manual_seed(7)
    return plan.per_cell_loss(x)[0]


def explicit_per_cell_grads(plan, x, params):
    """Reference: one autograd call per cell, with Opacus's hooks switched off."""
    plan._engine._gsm.disable_hooks()
    try:
        loss = loss_of(plan, x)
        rows = []
        for i in range(x.shape[0]):
            grads = torch.autograd.grad(loss[i], params, retain_graph=True)
            rows.append(torch.cat([g.flatten() for g in grads]))
    finally:
        plan._engine._gsm.enable_hooks()
    return torch.stack(rows)


@pytest.mark.parametrize("stage", ["instance", "cluster"])
@pytest.mark.parametrize("scope", ["encoder", "full", "paper"])
def test_ghost_norms_equal_explicit_per_cell_norms(tiny_module, counts, stage, scope):
    plan = make_plan(tiny_module, stage, scope, sigma=0.0)
    private = plan.private_parameters
    explicit = explicit_per_cell_grads(plan, counts, private).norm(dim=1)
    loss = loss_of(plan, counts)
    loss.sum().backward()
    ghost = plan._engine._gsm.get_norm_sample()
    torch.testing.assert_close(ghost, explicit, rtol=1e-4, atol=1e-6)
    plan.detach_privacy()


@pytest.mark.parametrize("stage", ["instance", "cluster"])
@pytest.mark.parametrize("scope", ["encoder", "full", "paper"])
def test_noise_free_step_is_sum_of_clipped_gradients(tiny_module, counts, stage, scope):
    plan = make_plan(tiny_module, stage, scope, sigma=0.0)
    private, public = plan.private_parameters, plan.public_parameters
    g = explicit_per_cell_grads(plan, counts, private)
    clipped = g * (C / (g.norm(dim=1, keepdim=True) + 1e-6)).clamp(max=1.0)
    expected_private = clipped.sum(0) / 6
    if stage == "cluster":  # the separation penalty's gradient is added after the noise
        penalty = tiny_module.parameter_penalty(plan.betas)
        pg = torch.autograd.grad(penalty, private, allow_unused=True)
        expected_private = expected_private + torch.cat(
            [
                (x if x is not None else torch.zeros_like(p)).flatten()
                for x, p in zip(pg, private, strict=True)
            ]
        )
    loss = loss_of(plan, counts)
    expected_public = (
        torch.cat([t.flatten() for t in torch.autograd.grad(loss.mean(), public, retain_graph=True)])
        if public
        else torch.zeros(0)
    )
    plan.private_step(loss)
    got_private = torch.cat([p.grad.flatten() for p in private])
    got_public = torch.cat([p.grad.flatten() for p in public]) if public else torch.zeros(0)
    torch.testing.assert_close(got_private, expected_private, rtol=1e-4, atol=1e-7)
    torch.testing.assert_close(got_public, expected_public, rtol=1e-4, atol=1e-7)
    # every clipped per-cell gradient has norm <= C: the bound the accountant relies on
    assert torch.all(clipped.norm(dim=1) <= C * (1 + 1e-5))
    plan.detach_privacy()


def _grads_after_noisy_step(module, counts, scope, seed):
    state = {k: v.clone() for k, v in module.state_dict().items()}
    plan = make_plan(module, "instance", scope, sigma=1.0, seed=seed)
    plan.private_step(loss_of(plan, counts))
    enc = torch.cat([p.grad.flatten() for p in module.encoder.parameters()])
    dec = torch.cat([p.grad.flatten() for m in module.public_decoder_modules() for p in m.parameters()])
    plan.detach_privacy()
    module.load_state_dict(state)
    return enc, dec


def test_paper_scope_noises_encoder_only(tiny_module, counts):
    enc_a, dec_a = _grads_after_noisy_step(tiny_module, counts, "paper", seed=1)
    enc_b, dec_b = _grads_after_noisy_step(tiny_module, counts, "paper", seed=2)
    assert not torch.allclose(enc_a, enc_b), "encoder gradients must carry noise"
    torch.testing.assert_close(dec_a, dec_b)  # decoder: same gradient whatever the noise draw


def test_encoder_scope_never_trains_the_decoder(tiny_module, counts):
    """The proven encoder-only scope: the decoder gets no gradient and keeps its initial weights."""
    decoder = [p for m in tiny_module.public_decoder_modules() for p in m.parameters()]
    before = [p.detach().clone() for p in decoder]
    plan = make_plan(tiny_module, "instance", "encoder", sigma=1.0, seed=1, lr=0.1)
    assert plan.public_parameters == [] and all(not p.requires_grad for p in decoder)
    encoder = [p.detach().clone() for p in tiny_module.encoder.parameters()]
    plan.attach_privacy()
    loss, _ = plan.per_cell_loss(counts)
    plan.private_step(loss)
    for old, p in zip(before, decoder, strict=True):
        assert p.grad is None
        torch.testing.assert_close(old, p.detach())
    moved = [
        not torch.equal(old, p.detach())
        for old, p in zip(encoder, tiny_module.encoder.parameters(), strict=True)
    ]
    assert any(moved)  # the encoder did train
    plan.detach_privacy()


def test_full_scope_noises_everything(tiny_module, counts):
    enc_a, dec_a = _grads_after_noisy_step(tiny_module, counts, "full", seed=1)
    enc_b, dec_b = _grads_after_noisy_step(tiny_module, counts, "full", seed=2)
    assert not torch.allclose(enc_a, enc_b)
    assert not torch.allclose(dec_a, dec_b)


def test_noise_has_the_calibrated_scale(tiny_module, counts):
    # zero data gradient (empty batch): the update is pure noise N(0, (sigma C / (qn))^2)
    plan = make_plan(tiny_module, "instance", "encoder", sigma=2.0)
    plan.noisy_empty_step()
    noise = torch.cat([p.grad.flatten() for p in plan.private_parameters])
    expected_std = 2.0 * C / 6
    assert noise.numel() > 3000
    assert abs(noise.std().item() / expected_std - 1) < 0.05
    plan.detach_privacy()


def test_empty_batch_still_steps_and_is_accounted(tiny_module):
    plan = make_plan(tiny_module, "instance", "encoder", sigma=1.0, lr=0.1)
    before = tiny_module.encoder[0].weight.detach().clone()
    plan.training_step({"X": torch.zeros(0, tiny_module.n_input)}, 0)
    assert plan.dp.accountant.history == [(1.0, 0.1, 1)]
    assert not torch.equal(before, tiny_module.encoder[0].weight)
    plan.detach_privacy()


def test_generators_follow_the_parameters_device():
    from dpsc.module._dcan import mask_views

    assert NoiseSource(5).stream("dpsgd").gaussian_tensor(1.0, (3,), "cpu").device.type == "cpu"
    # masks come from the generator's own device, so a seeded CPU generator gives the same
    # masks whatever device the data is on
    rep = torch.ones(4, 6)
    a = mask_views(rep, 2, 0.5, torch.Generator().manual_seed(3))
    b = mask_views(rep, 2, 0.5, torch.Generator().manual_seed(3))
    assert torch.equal(a, b) and 0 < int((a == 0).sum()) < a.numel()
    if torch.cuda.is_available():
        moved = NoiseSource(5).stream("dpsgd").gaussian_tensor(1.0, (3,), "cuda")
        assert moved.device.type == "cuda"
        on_gpu = mask_views(rep.cuda(), 2, 0.5, torch.Generator().manual_seed(3))
        assert torch.equal(on_gpu.cpu(), a)


def test_frozen_encoder_cluster_stage_noises_only_centroids(tiny_module, counts):
    dp = DPSGDSettings(
        noise_multiplier=1.0,
        max_grad_norm=C,
        sample_rate=0.1,
        expected_batch_size=6,
        accountant=make_accountant("rdp"),
        noise=NoiseSource(0),
    )
    plan = DCANTrainingPlan(tiny_module, stage="cluster", dp=dp, optimizer="sgd", lr=0.1, train_encoder=False)
    assert plan.private_parameters == [tiny_module.clustering.centroids]
    plan.attach_privacy()
    plan.on_train_start()
    encoder = [p.detach().clone() for p in tiny_module.encoder.parameters()]
    centroids = tiny_module.clustering.centroids.detach().clone()
    plan.private_step(plan.per_cell_loss(counts)[0])
    assert all(torch.equal(a, p) for a, p in zip(encoder, tiny_module.encoder.parameters(), strict=True))
    assert not torch.equal(centroids, tiny_module.clustering.centroids)
    assert plan.dp.accountant.history == [(1.0, 0.1, 1)]
    plan.detach_privacy()
    assert all(p.requires_grad for p in tiny_module.encoder.parameters())
    # the instance stage always trains the encoder
    assert DCANTrainingPlan(
        tiny_module, stage="instance", dp=None, optimizer="sgd", lr=0.1, train_encoder=False
    ).train_encoder


@pytest.mark.parametrize("stage", ["instance", "cluster"])
@pytest.mark.parametrize("scope", ["encoder", "full", "paper"])
def test_clipped_pass_starts_at_module_outputs(tiny_module, counts, stage, scope, monkeypatch):
    """The second ghost pass runs from the private modules' outputs, not through the loss."""
    from dpsc.privacy import _ghost

    calls = []
    real = _ghost._clipped_pass_from_outputs
    monkeypatch.setattr(_ghost, "_clipped_pass_from_outputs", lambda *a: calls.append(1) or real(*a))
    plan = make_plan(tiny_module, stage, scope, sigma=0.0)
    plan.private_step(loss_of(plan, counts))
    assert calls == [1]
    assert all(not kept for kept in plan._engine._outputs.outputs), "kept outputs are released"
    plan.detach_privacy()


@pytest.mark.parametrize("sigma", [0.0, 1.0])
def test_a_poisson_batch_split_into_chunks_is_the_same_noisy_accounted_step(sigma):
    """``poisson_steps`` in chunks of 7 cells leaves the weights and the accountant of one batch."""
    from dpsc.privacy import DPSGDEngine, poisson_steps

    cells = torch.randn(40, 5)
    targets = torch.randn(40)

    def run(max_physical_batch):
        torch.manual_seed(0)
        layer = torch.nn.Linear(5, 1)
        settings = DPSGDSettings(
            noise_multiplier=sigma,
            max_grad_norm=C,
            sample_rate=1.0,  # every cell in every batch: both runs see the same 40 cells
            expected_batch_size=40,
            accountant=make_accountant("rdp"),
            noise=NoiseSource(3),
        )
        engine = DPSGDEngine([layer], torch.optim.SGD(layer.parameters(), lr=1.0), settings)
        sizes = []

        def per_cell_loss(indices):
            sizes.append(len(indices))
            return (layer(cells[indices]).squeeze(1) - targets[indices]) ** 2

        poisson_steps(engine, 40, 2, per_cell_loss, max_physical_batch=max_physical_batch)
        engine.close()
        return (
            torch.cat([p.detach().flatten() for p in layer.parameters()]),
            settings.accountant.history,
            sizes,
        )

    whole, whole_history, whole_sizes = run(512)
    chunked, chunked_history, chunked_sizes = run(7)
    assert whole_sizes == [40, 40] and chunked_sizes == [7, 7, 7, 7, 7, 5] * 2
    assert whole_history == chunked_history == [(sigma, 1.0, 2)]
    torch.testing.assert_close(chunked, whole, rtol=0, atol=1e-6)
    with pytest.raises(ValueError, match="max_physical_batch"):
        run(0)
