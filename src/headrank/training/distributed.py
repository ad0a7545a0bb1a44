"""Where a run executes: the device (:func:`resolve_device`) and, under ``torchrun``, its place
in a torch.distributed job (:class:`Dist`, :func:`join`): gloo on the CPU, nccl on CUDA. Every
rank draws the same global batch and keeps its own slice; DDP averages the gradients."""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch

from headrank.errors import HeadRankError


def resolve_device(device: str) -> torch.device:
    """``auto`` → CUDA when available, else CPU; anything else must be a usable torch device."""
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError):
        raise HeadRankError(f"unknown device {device!r} (use auto, cpu, cuda, cuda:N, mps)") from None
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise HeadRankError(f"device {device!r} requested but CUDA is not available here")
    if dev.type == "cuda" and dev.index is not None and dev.index >= torch.cuda.device_count():
        raise HeadRankError(f"device {device!r}: only {torch.cuda.device_count()} CUDA devices")
    if dev.type == "mps" and not (hasattr(torch.backends, "mps") and torch.backends.mps.is_available()):
        raise HeadRankError("device 'mps' requested but it is not available here")
    if dev.type not in ("cpu", "cuda", "mps"):
        raise HeadRankError(f"unsupported device {device!r} (use auto, cpu, cuda, cuda:N, mps)")
    return dev


#: ``amp`` choices of :func:`autocast_dtype` (``train(amp=...)``, sweeps, the paper profile)
AMP_CHOICES = ("off", "auto", "bf16")


def autocast_dtype(dev: torch.device, amp: str) -> torch.dtype | None:
    """The dtype the training forward pass autocasts to on ``dev``, or None (full float32).

    ``off``: never. ``auto``: bfloat16 on a CUDA device that supports it, else None (the CPU and
    older GPUs train in float32). ``bf16``: bfloat16, and an error where CUDA bf16 is missing.
    Only the forward pass and the loss run under autocast (torch keeps softmax, norms and the
    cross-entropy in float32 there); the weights, the optimiser state, the evaluation and every
    spectrum stay float32, which is what makes it safe for the rank measurements."""
    if amp not in AMP_CHOICES:
        raise HeadRankError(f"amp must be one of {', '.join(AMP_CHOICES)}, got {amp!r}")
    usable = dev.type == "cuda" and torch.cuda.is_available() and torch.cuda.is_bf16_supported()
    if amp == "off" or (amp == "auto" and not usable):
        return None
    if not usable:
        raise HeadRankError(f"amp 'bf16' needs a CUDA device with bfloat16 support; this run is on {dev}")
    return torch.bfloat16


@dataclass
class Dist:
    """This process's place in a torch.distributed job (world 1 = plain single process)."""

    rank: int = 0
    world: int = 1
    owned: bool = False  # we initialised the process group, so we destroy it

    @property
    def main(self) -> bool:
        """Rank 0: the process that writes the run directory."""
        return self.rank == 0

    def barrier(self) -> None:
        """Wait for every rank (a no-op in a single process)."""
        if self.world > 1:
            torch.distributed.barrier()

    def close(self) -> None:
        """Leave the process group if :func:`join` created it."""
        if self.owned:
            torch.distributed.destroy_process_group()


def join(dev: torch.device) -> Dist:
    """Join the process group torchrun describes (``WORLD_SIZE`` > 1): gloo on the CPU, nccl on CUDA."""
    import torch.distributed as dist

    world = int(os.environ.get("WORLD_SIZE", "1") or 1)
    if world <= 1:
        return Dist()
    if dist.is_initialized():
        return Dist(dist.get_rank(), dist.get_world_size(), owned=False)
    if dev.type == "cuda":
        local = int(os.environ.get("LOCAL_RANK", "0"))
        torch.cuda.set_device(local)
    dist.init_process_group(backend="nccl" if dev.type == "cuda" else "gloo")
    return Dist(dist.get_rank(), dist.get_world_size(), owned=True)
