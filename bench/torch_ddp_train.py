# Peer for `kiln bench train --gpu --nproc N --peer PYTHON`: PyTorch DistributedDataParallel training throughput
# on N GPUs of one host, one process per GPU, started by torch.distributed.run. The model, config and step are
# those of the one-GPU peer script (../shared/bench/torch_llama_train.py, imported from --model-script): bf16
# autocast, fused AdamW, gradient clipping, torch.compile with --compile. DDP sums the fp32 gradients over NCCL in
# 25 MB buckets overlapped with the backward, as kiln does in its per-layer buckets. Each rank trains its own
# B x T rows; rank 0 prints one JSON line with the global tokens/s.
# Usage: python3 -m torch.distributed.run --standalone --nproc_per_node N bench/torch_ddp_train.py
#            --model-script PATH [--compile] [--config 124m|350m|small] [--B 16] [--T 1024] [--steps 30]
import argparse, importlib.util, json, os, time

os.environ.setdefault("NCCL_NVLS_ENABLE", "0")  # never NVLink multicast (see the device notes)
os.environ.setdefault("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--model-script", required=True)
    p.add_argument("--config", default="124m"); p.add_argument("--B", type=int, default=16)
    p.add_argument("--T", type=int, default=0); p.add_argument("--steps", type=int, default=30)
    p.add_argument("--compile", action="store_true")
    a = p.parse_args()
    spec = importlib.util.spec_from_file_location("peer_model", a.model_script)
    pm = importlib.util.module_from_spec(spec); spec.loader.exec_module(pm)
    c = dict(pm.CONFIGS[a.config]); T = a.T or c["T"]; c["T"] = T

    local = int(os.environ["LOCAL_RANK"]); torch.cuda.set_device(local)
    dist.init_process_group("nccl", device_id=torch.device("cuda", local))
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0); dev = torch.device("cuda", local)
    m = pm.LM(c).to(dev); n_params = sum(x.numel() for x in m.parameters())
    ddp = DDP(m, device_ids=[local], gradient_as_bucket_view=True)
    opt = torch.optim.AdamW(m.parameters(), lr=3e-4, fused=True)
    step = torch.compile(ddp) if a.compile else ddp
    g = torch.Generator(device=dev); g.manual_seed(1 + rank)  # every rank its own rows
    idx = torch.randint(0, c["vocab"], (a.B, T), device=dev, generator=g)
    tgt = torch.randint(0, c["vocab"], (a.B, T), device=dev, generator=g)

    def one():
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = step(idx, tgt)
        loss.backward(); torch.nn.utils.clip_grad_norm_(m.parameters(), 1.0); opt.step(); opt.zero_grad(set_to_none=True)
        return loss

    for _ in range(5): one()
    torch.cuda.synchronize(); dist.barrier(); t0 = time.perf_counter()
    for _ in range(a.steps): loss = one()
    torch.cuda.synchronize(); dist.barrier(); dt = (time.perf_counter() - t0) / a.steps
    tok = world * a.B * T / dt
    n_mat = n_params - c["vocab"] * c["d"]
    flops_tok = 6 * n_mat + 6 * c["L"] * T * c["d"]
    if rank == 0:
        print(json.dumps(dict(peer="pytorch-ddp", compile=a.compile, config=a.config, world=world, B_per_gpu=a.B, T=T,
                              params=n_params, ms_per_step=dt * 1e3, tokens_per_s=tok,
                              mfu_per_gpu=tok * flops_tok / world / 989e12, loss=float(loss.detach()),
                              torch=torch.__version__)), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
