"""tp_rope.py - lmk inside PyTorch's own tensor parallelism (NCCL), one process per GPU.

Each rank holds a slice of the attention heads of one Llama-3.1-8B layer (the usual tensor-parallel split
of the q/k projections), rotates its slice with lmk on its own GPU (lmk's device is the tensor's device, its
stream the rank's current torch stream), and the slices are gathered with torch.distributed.all_gather. Rank
0 then rotates the whole tensors on its one GPU and checks that the gathered result is bit-identical: the
split changes nothing, because every (token, head) row is computed by the same formula on any device.

    torchrun --nproc-per-node 2 examples/tp_rope.py        (from the repository root, after `make`;
                                                             PYTHONPATH=python LMK_LIBRARY=build/liblmk.so
                                                             when the package is not pip-installed)
"""
import math
import os
import sys

import torch
import torch.distributed as dist

import lmk


def llama3_freq_factors(D, base):
    """llama3 rope_type (factor 8, low 1, high 4, original 8192) as lmk freq_factors: base^(-2p/D) / inv_freq."""
    p = torch.arange(D // 2, dtype=torch.float64)
    inv = base ** (-2.0 * p / D)
    wavelen = 2 * math.pi / inv
    low_wl, high_wl = 8192 / 1.0, 8192 / 4.0
    smooth = (8192 / wavelen - 1.0) / (4.0 - 1.0)
    scaled = torch.where(wavelen > low_wl, inv / 8.0, inv)
    mid = (wavelen <= low_wl) & (wavelen >= high_wl)
    scaled = torch.where(mid, (1 - smooth) * inv / 8.0 + smooth * inv, scaled)
    return (inv / scaled).float()


def main():
    dist.init_process_group("nccl")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.cuda.set_device(rank)
    dev = torch.device("cuda", rank)
    T, H, HK, D, BASE = 4106, 32, 8, 128, 5e5
    assert H % world == 0 and HK % world == 0, "heads must split evenly over the ranks"
    g = torch.Generator().manual_seed(1234)  # every rank draws the same full tensors
    q_full = torch.randn(T, H, D, generator=g).bfloat16()
    k_full = torch.randn(T, HK, D, generator=g).bfloat16()
    pos = torch.randint(0, 131072, (T,), generator=g)
    ff = llama3_freq_factors(D, BASE)
    kw = dict(mode="neox", freq_base=BASE)

    hs, ks = H // world, HK // world
    q = q_full[:, rank * hs:(rank + 1) * hs].to(dev)
    k = k_full[:, rank * ks:(rank + 1) * ks].to(dev)
    qo, ko = lmk.rope(q, pos.to(dev), k=k, freq_factors=ff.to(dev), **kw)

    gq = [torch.empty_like(qo) for _ in range(world)]
    gk = [torch.empty_like(ko) for _ in range(world)]
    dist.all_gather(gq, qo.contiguous())
    dist.all_gather(gk, ko.contiguous())
    ok = torch.tensor([1], device=dev)
    if rank == 0:
        q1, k1 = lmk.rope(q_full.to(dev), pos.to(dev), k=k_full.to(dev), freq_factors=ff.to(dev), **kw)
        q_tp, k_tp = torch.cat(gq, dim=1), torch.cat(gk, dim=1)
        same = torch.equal(q_tp.view(torch.int16), q1.view(torch.int16)) and \
            torch.equal(k_tp.view(torch.int16), k1.view(torch.int16))
        print("tp_rope: %d ranks (%s), %d/%d q/k heads each, T=%d bf16: gathered result %s one GPU's" %
              (world, ", ".join(torch.cuda.get_device_name(i) for i in range(world)), hs, ks, T,
               "is bit-identical to" if same else "DIFFERS from"), flush=True)
        ok[0] = 1 if same else 0
    dist.broadcast(ok, 0)
    dist.destroy_process_group()
    return 0 if ok.item() == 1 else 1


if __name__ == "__main__":
    sys.exit(main())
