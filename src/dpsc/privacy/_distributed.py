r"""Data-parallel DP-SGD over several processes: who I am, and the collectives DP needs.

Several processes (Lightning's DDP strategy: one per GPU, or CPU processes over gloo) train one
model. The privacy argument of a single process carries over unchanged when

* rank :math:`r` holds the shard :math:`S_r` (cells :math:`r, r+W, r+2W, \dots`) and includes
  each of its cells independently with the same rate :math:`q`, so that the union of the local
  batches is exactly a Poisson sample of all cells at rate :math:`q`
  (:class:`~dpsc.train.PoissonDataSplitter`);
* every rank clips its cells' gradients to norm :math:`C` and sums them; the sums are added
  across ranks (all-reduce) and Gaussian noise :math:`\mathcal N(0, \sigma^2 C^2 I)` is added
  **once** per global step, by rank 0 (Opacus's
  :class:`~opacus.optimizers.DistributedDPOptimizerFastGradientClipping`), so the released
  gradient is the single-process one;
* every rank takes the same number of steps, an empty local batch included, so every rank's
  accountant holds the same (σ, q, steps) as the single-process fit;
* a release that is not an SGD step (DP k-means centroids, cluster frequencies) is computed and
  accounted on every rank, and rank 0's value is broadcast; the others are discarded unseen;
* the releases a fit makes before and after training (its start clustering, the partition
  choice) draw from one secret key shared by the ranks (:func:`shared_noise_source`): each is
  one draw, made alike on every rank, and every rank writes the same results.
"""

from __future__ import annotations

import torch
import torch.distributed as dist


def world() -> tuple[int, int]:
    """Return ``(rank, world_size)``; ``(0, 1)`` outside an initialised process group."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def is_distributed() -> bool:
    """Return whether this process is one of several in a process group."""
    return world()[1] > 1


def broadcast_from_rank_zero(tensor: torch.Tensor) -> torch.Tensor:
    """Return rank 0's value of ``tensor`` on every rank (itself when not distributed)."""
    if not is_distributed():
        return tensor
    out = tensor.detach().clone().contiguous()
    dist.broadcast(out, src=0)
    return out


def sum_over_ranks(tensor: torch.Tensor) -> torch.Tensor:
    """All-reduce ``tensor`` in place with a sum over ranks; return it."""
    if is_distributed():
        dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
    return tensor


def shared_noise_source():
    """Return a secret :class:`~dpsc.privacy.NoiseSource` that every process of the group holds alike.

    The first process draws 32 bytes from OS entropy and broadcasts them; every process derives
    its streams from them. A release every process makes (a data-parallel fit's start
    clustering, its partition choice) is then the same draw on every process, one release, as
    the plan accounts it; each process's Poisson sample reads its own rank-indexed stream,
    independent of the others'. Outside a group: a secret source.
    """
    from ._noise import NoiseSource
    from ._random import KEY_BYTES, secure_key

    if not is_distributed():
        return NoiseSource()
    key = torch.frombuffer(bytearray(secure_key()), dtype=torch.uint8)
    if dist.get_backend() == "nccl":  # nccl broadcasts device tensors only
        key = key.cuda()
    shared = broadcast_from_rank_zero(key).cpu().numpy().tobytes()
    if len(shared) != KEY_BYTES:
        raise RuntimeError("The processes did not agree on one noise key.")
    return NoiseSource(shared_key=shared)


def join_process_group(world_size: int, backend: str) -> None:
    """Join the process group of processes launched together (``torchrun``: ``RANK``, or ``LOCAL_RANK``).

    Lightning's DDP strategy then trains in this group (it joins one only when none exists). The
    address is the launcher's (``MASTER_ADDR``, ``MASTER_PORT``).
    """
    import os

    if dist.is_initialized():
        return
    local = int(os.environ["LOCAL_RANK"])
    rank = int(os.environ.get("RANK", int(os.environ.get("NODE_RANK", 0)) * world_size + local))
    world = int(os.environ.get("WORLD_SIZE", world_size))
    dist.init_process_group(backend, init_method="env://", rank=rank, world_size=world)
