#!/usr/bin/env python3
"""torch_time_to_loss.py: the PyTorch peer of `kiln train` for time to loss (issue #8). It trains exactly kiln's
model on exactly kiln's tokens with kiln's optimizer and schedule, and reports the wall time to a validation loss.

What it mirrors, and where kiln defines it:
  data      the shards of `kiln data` (src/train/data.h: a 64-byte header, then uint16/uint32 ids), split by split
            concatenated in index order; a batch is src/train/data.c kiln_loader_next: row b holds tokens
            [pos, pos+T) as inputs and [pos+1, pos+T+1) as targets, indices modulo the split's token count,
            and pos advances T a row. Evaluation (src/train/train.c evaluate) restarts the validation split at 0
            and averages the loss of eval_batches batches; it runs after steps eval_every, 2*eval_every, ... and
            after the last step, never at step 0.
  model     src/train/llama_train.c: RMSNorm (eps 1e-5, weight), interleaved-pair RoPE base 10000, GQA (query
            head h reads KV head h // (NH/NKV)), SwiGLU, output tied to the embedding or not. Its initial
            weights are kiln_llama_train_init_random's, drawn with kiln's own generator (splitmix64, Box-Muller)
            in kiln's tensor order, so both trainers start from the same weights: N(0, 0.02), attn_output and
            ffn_down N(0, 0.02/sqrt(2L)), norms 1.
  loss      mean cross-entropy over every target (kiln's label smoothing and z-loss default to 0).
  optimizer src/train/optim.c: AdamW b1 0.9, b2 0.95, eps 1e-8, decoupled decay (default 0.1) on the tensors
            kiln decays (the attention and FFN matrices and an untied output; not the embedding, so not a tied
            output, and not the norms); the gradient is scaled by min(1, clip/norm) of its global L2 norm
            (clip 1.0). Schedule kiln_lr_at with tools/cmd_train.c's defaults: warmup steps/10 from lr/warmup
            to lr, cosine to min_lr = lr/10 at the last step.
  precision fp32 master weights and AdamW; on CUDA, bf16 autocast (as ../shared/bench/torch_llama_train.py) and
            fused AdamW; on the CPU, fp32 throughout (kiln's CPU trainer is fp32 too).

Timing follows kiln's log: the clock starts before the first step (after the model, its initial weights and
the tokens are on the device) and an eval's time is the elapsed time at the end of its step, synchronized,
before the eval runs; earlier evals are included, as kiln's elapsed_s includes them. With --compile the
compilation happens inside the first step (and, for the no-grad graph, the first eval), so it counts in the wall
time; first_step_s reports the first step alone and first_eval_s the first eval.

Output: each eval as a JSON line on stderr, then one JSON line on stdout (steps, val losses, seconds to the
target, total seconds, tok/s, versions). Not part of CI: it needs PyTorch. bench/time_to_loss.sh runs it beside
`kiln train --gpu`.
"""
import argparse, json, math, os, sys, time

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

# ---------------------------------------------------------------- shards and the loader

SHARD_MAGIC, SHARD_VERSION, SHARD_HEADER = 0x4448534B, 1, 64


def read_split(folder, split):
    """The tokens of split's shards, SPLIT_000.bin upwards to the first missing index, concatenated (int64),
    and the vocab size of their headers."""
    parts, vocab = [], None
    for i in range(1 << 20):
        path = os.path.join(folder, f"{split}_{i:03d}.bin")
        if not os.path.exists(path):
            break
        raw = np.fromfile(path, dtype=np.uint8)
        if raw.size < SHARD_HEADER:
            sys.exit(f"torch_time_to_loss: {path}: truncated: {raw.size} bytes, less than the 64-byte header")
        magic, version = (int(x) for x in raw[:8].view("<u4"))
        n = int(raw[16:24].view("<u8")[0])
        bpt, v = (int(x) for x in raw[24:32].view("<u4"))
        if magic != SHARD_MAGIC or version != SHARD_VERSION or bpt not in (2, 4):
            sys.exit(f"torch_time_to_loss: {path}: not a kiln shard (magic {magic:#x}, version {version}, {bpt} bytes per token)")
        if raw.size - SHARD_HEADER != n * bpt:
            sys.exit(f"torch_time_to_loss: {path}: the header says {n} tokens of {bpt} bytes but {raw.size - SHARD_HEADER} bytes follow it")
        if vocab is not None and v != vocab:
            sys.exit(f"torch_time_to_loss: {path}: vocab {v} differs from the earlier shards' {vocab}")
        vocab = v
        parts.append(raw[SHARD_HEADER:].view("<u2" if bpt == 2 else "<u4").astype(np.int64))
    if not parts:
        sys.exit(f"torch_time_to_loss: {folder}: no {split} shards ({split}_000.bin is missing)")
    tokens = np.concatenate(parts)
    if tokens.size and int(tokens.max()) >= vocab:
        sys.exit(f"torch_time_to_loss: {folder}: {split} token {int(tokens.max())} is outside the vocab of {vocab}")
    return tokens, vocab


class Loader:
    """kiln_loader_next on the device: row b starts at pos + b*T (mod n) and reads T+1 tokens, wrapping."""

    def __init__(self, tokens, device):
        self.tokens = torch.from_numpy(tokens).to(device)
        self.n, self.pos = tokens.size, 0

    def next(self, B, T):
        if self.n < T + 1:
            sys.exit(f"torch_time_to_loss: {self.n} tokens in the shards, a row of {T} + 1 needs more")
        dev = self.tokens.device
        starts = (self.pos + T * torch.arange(B, device=dev)) % self.n
        rows = self.tokens[(starts[:, None] + torch.arange(T + 1, device=dev)[None, :]) % self.n]  # (B, T+1)
        self.pos = (self.pos + B * T) % self.n
        return rows[:, :T], rows[:, 1:]


# ---------------------------------------------------------------- the model


class RMSNorm(nn.Module):
    def __init__(s, C, eps=1e-5):
        super().__init__()
        s.weight, s.eps = nn.Parameter(torch.ones(C)), eps

    def forward(s, x):  # in fp32, as kiln's rmsnorm
        xf = x.float()
        return s.weight * (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + s.eps)).type_as(x)


def rope(x, cos, sin):  # x (B, NH, T, HS); pairs (2i, 2i+1) rotated by pos * base^(-2i/HS)
    x1, x2 = x[..., 0::2], x[..., 1::2]
    return torch.stack((x1 * cos - x2 * sin, x1 * sin + x2 * cos), -1).flatten(-2)


class Block(nn.Module):
    def __init__(s, C, NH, NKV, F_):
        super().__init__()
        s.NH, s.NKV, s.HS = NH, NKV, C // NH
        s.attn_norm, s.ffn_norm = RMSNorm(C), RMSNorm(C)
        s.wq = nn.Linear(C, NH * s.HS, bias=False)   # attn_q      (Q, C)
        s.wk = nn.Linear(C, NKV * s.HS, bias=False)  # attn_k      (KV, C)
        s.wv = nn.Linear(C, NKV * s.HS, bias=False)  # attn_v      (KV, C)
        s.wo = nn.Linear(NH * s.HS, C, bias=False)   # attn_output (C, Q)
        s.w_gate = nn.Linear(C, F_, bias=False)      # ffn_gate    (F, C)
        s.w_up = nn.Linear(C, F_, bias=False)        # ffn_up      (F, C)
        s.w_down = nn.Linear(F_, C, bias=False)      # ffn_down    (C, F)

    def forward(s, x, cos, sin):
        B, T, C = x.shape
        h = s.attn_norm(x)
        q = s.wq(h).view(B, T, s.NH, s.HS).transpose(1, 2)
        k = s.wk(h).view(B, T, s.NKV, s.HS).transpose(1, 2)
        v = s.wv(h).view(B, T, s.NKV, s.HS).transpose(1, 2)
        q, k = rope(q, cos, sin), rope(k, cos, sin)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)  # scale 1/sqrt(HS)
        x = x + s.wo(a.transpose(1, 2).reshape(B, T, C))
        h = s.ffn_norm(x)
        return x + s.w_down(F.silu(s.w_gate(h)) * s.w_up(h))


class Llama(nn.Module):
    def __init__(s, V, C, L, NH, NKV, F_, T, tied, rope_base=10000.0):
        super().__init__()
        s.tok_embd = nn.Embedding(V, C)  # token_embd (V, C)
        s.blocks = nn.ModuleList(Block(C, NH, NKV, F_) for _ in range(L))
        s.output_norm = RMSNorm(C)
        s.output = None if tied else nn.Linear(C, V, bias=False)  # output (V, C)
        HS = C // NH
        freq = 1.0 / (rope_base ** (torch.arange(0, HS, 2).float() / HS))
        ang = torch.outer(torch.arange(T).float(), freq)  # (T, HS/2)
        s.register_buffer("cos", ang.cos(), persistent=False)
        s.register_buffer("sin", ang.sin(), persistent=False)

    def forward(s, idx, tgt):
        T = idx.shape[1]
        x = s.tok_embd(idx)
        cos, sin = s.cos[:T], s.sin[:T]
        for b in s.blocks:
            x = b(x, cos, sin)
        x = s.output_norm(x)
        logits = F.linear(x, s.tok_embd.weight) if s.output is None else s.output(x)
        return F.cross_entropy(logits.float().view(-1, logits.size(-1)), tgt.reshape(-1))

    def kiln_tensors(s):
        """(name, parameter, decay) in kiln's tensor order (llama_train.c kiln_llama_train_new)."""
        out = [("token_embd.weight", s.tok_embd.weight, False)]
        for l, b in enumerate(s.blocks):
            out += [(f"blk.{l}.attn_norm.weight", b.attn_norm.weight, False), (f"blk.{l}.attn_q.weight", b.wq.weight, True),
                    (f"blk.{l}.attn_k.weight", b.wk.weight, True), (f"blk.{l}.attn_v.weight", b.wv.weight, True),
                    (f"blk.{l}.attn_output.weight", b.wo.weight, True), (f"blk.{l}.ffn_norm.weight", b.ffn_norm.weight, False),
                    (f"blk.{l}.ffn_gate.weight", b.w_gate.weight, True), (f"blk.{l}.ffn_up.weight", b.w_up.weight, True),
                    (f"blk.{l}.ffn_down.weight", b.w_down.weight, True)]
        out.append(("output_norm.weight", s.output_norm.weight, False))
        if s.output is not None:
            out.append(("output.weight", s.output.weight, True))
        return out


# ---------------------------------------------------------------- kiln's initial weights

GOLDEN = 0x9E3779B97F4A7C15  # splitmix64's increment


def kiln_init(model, L, seed):
    """kiln_llama_train_init_random: one stream of normals over the matrices in tensor order, each a pair of
    splitmix64 outputs through Box-Muller; norms are 1 and draw nothing. u1 = 0 (probability 2^-53 a draw)
    would make kiln draw again; it is checked rather than mimicked."""
    std, std_res = 0.02, 0.02 / math.sqrt(2.0 * L)
    drawn = 0  # splitmix64 outputs consumed so far
    with np.errstate(over="ignore"):
        for name, p, _ in model.kiln_tensors():
            if p.dim() == 1:
                p.data.fill_(1.0)
                continue
            n = p.numel()
            k = np.arange(1, 2 * n + 1, dtype=np.uint64) + np.uint64(drawn)
            z = np.uint64(seed) + k * np.uint64(GOLDEN)
            z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
            z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
            z = z ^ (z >> np.uint64(31))
            a, b = z[0::2] >> np.uint64(11), z[1::2] >> np.uint64(11)
            if not a.all():
                sys.exit(f"torch_time_to_loss: kiln's generator redraws in {name} (u1 = 0); this seed is not supported")
            u1, u2 = a.astype(np.float64) * 2.0**-53, b.astype(np.float64) * 2.0**-53
            normal = np.sqrt(-2.0 * np.log(u1)) * np.cos(2.0 * math.pi * u2)
            sd = std_res if ("attn_output" in name or "ffn_down" in name) else std
            p.data.copy_(torch.from_numpy((normal * sd).astype(np.float32)).view_as(p))
            drawn += 2 * n


# ---------------------------------------------------------------- schedule


def kiln_lr_at(step, lr, min_lr, warmup, total):
    """src/train/optim.c kiln_lr_at, cosine decay, 0-based step."""
    if step < warmup:
        return lr * (step + 1) / warmup
    if step >= total:
        return min_lr
    progress = (step - warmup) / (total - warmup)
    return min_lr + 0.5 * (lr - min_lr) * (1.0 + math.cos(math.pi * progress))


# ---------------------------------------------------------------- main


def main():
    ap = argparse.ArgumentParser(description="PyTorch training of kiln's llama on kiln's shards: wall time to a validation loss")
    ap.add_argument("--data", required=True, help="shard folder written by `kiln data`")
    ap.add_argument("--tied", action="store_true")
    ap.add_argument("-V", type=int, default=0, help="vocab (default: the shards')")
    ap.add_argument("-C", type=int, default=256)
    ap.add_argument("-L", type=int, default=4)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--kv-heads", type=int, default=4)
    ap.add_argument("-F", type=int, default=704)
    ap.add_argument("-B", type=int, default=8)
    ap.add_argument("-T", type=int, default=256)
    ap.add_argument("--steps", type=int, default=1000)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--min-lr", type=float, default=None, help="default lr/10")
    ap.add_argument("--warmup", type=int, default=None, help="default steps/10")
    ap.add_argument("--wd", type=float, default=0.1)
    ap.add_argument("--clip", type=float, default=1.0)
    ap.add_argument("--eval-every", type=int, default=100)
    ap.add_argument("--eval-batches", type=int, default=20)
    ap.add_argument("--target", type=float, default=None, help="validation loss whose first attainment is timed")
    ap.add_argument("--compile", action="store_true", help="torch.compile the model (its compile time counts in the wall time)")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu", choices=["cuda", "cpu"])
    ap.add_argument("--seed", type=int, default=1337)
    ap.add_argument("--dump-batches", type=int, default=0, help="print the first 16 input and target ids of the first N training batches")
    a = ap.parse_args()
    if a.steps <= 0 or a.B <= 0 or a.T <= 1 or a.eval_batches < 0:
        sys.exit("torch_time_to_loss: steps and B must be positive and T at least 2")
    min_lr = a.lr / 10 if a.min_lr is None else a.min_lr
    warmup = a.steps // 10 if a.warmup is None else a.warmup

    dev = torch.device(a.device)
    cuda = dev.type == "cuda"
    train_tok, vocab = read_split(a.data, "train")
    val_tok = read_split(a.data, "val")[0] if a.eval_batches > 0 and os.path.exists(os.path.join(a.data, "val_000.bin")) else None
    V = a.V or vocab
    if V < vocab:
        sys.exit(f"torch_time_to_loss: the model's vocab ({V}) is smaller than the shards' ({vocab})")
    if a.C % a.heads or a.heads % a.kv_heads or (a.C // a.heads) % 2:
        sys.exit("torch_time_to_loss: C must divide into NH heads of even size, NH into NKV groups")

    torch.manual_seed(a.seed)
    model = Llama(V, a.C, a.L, a.heads, a.kv_heads, a.F, a.T, a.tied)
    kiln_init(model, a.L, a.seed)
    model.to(dev)
    n_params = sum(p.numel() for p in model.parameters())
    tensors = model.kiln_tensors()
    decay = [p for _, p, d in tensors if d]
    no_decay = [p for _, p, d in tensors if not d]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": a.wd}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=a.lr, betas=(0.9, 0.95), eps=1e-8, **({"fused": True} if cuda else {}))
    params = [p for _, p, _ in tensors]
    step_fn = torch.compile(model) if a.compile else model
    train, val = Loader(train_tok, dev), (Loader(val_tok, dev) if val_tok is not None else None)

    def sync():
        if cuda:
            torch.cuda.synchronize()

    def autocast():
        return torch.autocast("cuda", dtype=torch.bfloat16) if cuda else torch.autocast("cpu", enabled=False)

    def evaluate():  # train.c evaluate: from the start of the split, the mean over eval_batches batches
        val.pos = 0
        total = torch.zeros((), device=dev)
        with torch.no_grad(), autocast():
            for _ in range(a.eval_batches):
                x, y = val.next(a.B, a.T)
                total += step_fn(x, y).float()
        return float(total) / a.eval_batches

    print(json.dumps(dict(event="start", params=n_params, train_tokens=int(train_tok.size),
                          val_tokens=int(val_tok.size) if val_tok is not None else 0, V=V, device=a.device,
                          compile=a.compile, torch=torch.__version__)), file=sys.stderr, flush=True)
    evals, losses = [], []
    best, t_target, step_target, first_step_s, elapsed = math.inf, None, None, None, 0.0
    sync()
    t0 = time.perf_counter()
    for step in range(a.steps):
        x, y = train.next(a.B, a.T)
        if step < a.dump_batches:
            print(json.dumps(dict(event="batch", index=step, inputs=x[0, :16].tolist(), targets=y[0, :16].tolist(),
                                  row1_inputs=x[1, :16].tolist() if a.B > 1 else None)), file=sys.stderr, flush=True)
        lr = kiln_lr_at(step, a.lr, min_lr, warmup, a.steps)
        for g in opt.param_groups:
            g["lr"] = lr
        with autocast():
            loss = step_fn(x, y)
        loss.backward()
        # kiln's clip: g *= min(1, clip / ||g||), computed on the device so the step does not wait for the host
        grads = [p.grad for p in params]
        norm = torch.linalg.vector_norm(torch.stack(torch._foreach_norm(grads)))
        if a.clip > 0:
            torch._foreach_mul_(grads, torch.clamp(a.clip / norm, max=1.0))
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.detach())
        done = step + 1
        if done == 1:
            sync()
            first_step_s = time.perf_counter() - t0
        last = done == a.steps
        if val is not None and (last or (a.eval_every > 0 and done % a.eval_every == 0)):
            sync()
            elapsed = time.perf_counter() - t0  # the time of this eval, as kiln's elapsed_s of the step's line
            te = time.perf_counter()
            vl = evaluate()
            eval_s = time.perf_counter() - te
            train_loss = float(torch.stack(losses[-(a.eval_every or 1):]).float().mean())
            best = min(best, vl)
            if a.target is not None and t_target is None and vl <= a.target:
                t_target, step_target = elapsed, done
            evals.append(dict(step=done, val_loss=vl, elapsed_s=elapsed, eval_s=eval_s))
            print(json.dumps(dict(step=done, val_loss=round(vl, 6), train_loss=round(train_loss, 6), lr=lr,
                                  elapsed_s=round(elapsed, 3), eval_s=round(eval_s, 3))), file=sys.stderr, flush=True)
    sync()
    total_s = time.perf_counter() - t0
    # the last step's time without its final eval, as kiln's elapsed_s of its last step line
    end_s = evals[-1]["elapsed_s"] if evals and evals[-1]["step"] == a.steps else total_s
    print(json.dumps(dict(peer="pytorch", steps=a.steps, B=a.B, T=a.T, params=n_params, target=a.target,
                          final_val_loss=evals[-1]["val_loss"] if evals else None,
                          best_val_loss=best if evals else None, time_to_target_s=t_target, step_at_target=step_target,
                          total_s=end_s, total_with_final_eval_s=total_s, first_step_s=first_step_s,
                          first_eval_s=evals[0]["eval_s"] if evals else None,
                          tokens_per_s=a.steps * a.B * a.T / end_s, final_train_loss=float(losses[-1]),
                          torch=torch.__version__, device=torch.cuda.get_device_name() if cuda else "cpu",
                          compile=a.compile, evals=evals)), flush=True)


if __name__ == "__main__":
    main()
