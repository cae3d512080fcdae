#!/usr/bin/env python3
"""bench_train_torch.py: the PyTorch peer of `kiln bench train` on the CPU.

It imports the model of ../shared/bench/torch_llama_train.py (LLaMA with RMSNorm, interleaved RoPE, GQA,
SwiGLU, untied head; --shared points elsewhere) and times the same training step as kiln's benchmark,
fp32 on the CPU with torch.set_num_threads(THREADS): forward, cross-entropy, backward, global-norm clip and
AdamW. Prints one JSON line (tokens_per_s, ms_per_step) that `kiln bench train --peer PYTHON` reads.
Not part of CI: it needs PyTorch (the GPU machine has it).
"""
import argparse, importlib.util, json, os, statistics, time

import torch

ap = argparse.ArgumentParser()
ap.add_argument("--config", default="tiny")
ap.add_argument("--B", type=int, default=8)
ap.add_argument("--T", type=int, default=0)
ap.add_argument("--steps", type=int, default=5)
ap.add_argument("--threads", type=int, default=os.cpu_count())
ap.add_argument("--shared", default=None, help="path of torch_llama_train.py (default: ../shared/bench, else .carry/train)")
a = ap.parse_args()
if a.shared is None:
    here = os.path.dirname(os.path.abspath(__file__))
    for cand in (os.path.join(here, "..", "..", "shared", "bench", "torch_llama_train.py"),
                 os.path.join(here, "..", ".carry", "train", "torch_llama_train.py")):
        if os.path.exists(cand):
            a.shared = cand
            break

spec = importlib.util.spec_from_file_location("peer", a.shared)
peer = importlib.util.module_from_spec(spec)
spec.loader.exec_module(peer)
configs = dict(peer.CONFIGS)
configs["tiny"] = dict(vocab=4096, d=256, L=4, H=8, KV=4, ffn=704, T=256)  # kiln's bundled default shape
c = dict(configs[a.config])
T = a.T or c["T"]
c["T"] = T
torch.set_num_threads(a.threads)
torch.manual_seed(0)
m = peer.LM(c)
opt = torch.optim.AdamW(m.parameters(), lr=1e-4)
idx = torch.randint(0, c["vocab"], (a.B, T))
tgt = torch.randint(0, c["vocab"], (a.B, T))
times = []
for i in range(a.steps + 1):
    t0 = time.perf_counter()
    loss = m(idx, tgt)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(m.parameters(), 1.0)
    opt.step()
    opt.zero_grad(set_to_none=True)
    if i:
        times.append(time.perf_counter() - t0)
med = statistics.median(times)
print(json.dumps(dict(peer="pytorch-cpu", config=a.config, B=a.B, T=T, threads=a.threads, ms_per_step=med * 1e3,
                      tokens_per_s=a.B * T / med, loss=float(loss), torch=torch.__version__)))
