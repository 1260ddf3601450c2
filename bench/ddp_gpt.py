#!/usr/bin/env python3
"""PyTorch DDP (Gloo, CPU) baseline for the dplan executor benchmark.

Trains the same small GPT that `dplan run` trains (see bench/README.md) with
torch.nn.parallel.DistributedDataParallel and prints one JSON line on rank 0:

    {"world_size", "median_step_s", "steps", "warmup", "step_times_s", "tokens_per_s", ...}

Launch with torchrun, e.g.

    torchrun --standalone --nproc_per_node 2 bench/ddp_gpt.py --config bench/gpt-bench/config.json

`--steps` counts every step including the `--warmup` ones, as `dplan run` does; the
median is taken over the steps - warmup measured steps.
"""

import argparse
import json
import math
import os
import statistics
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP


class Attention(nn.Module):
    def __init__(self, hidden, heads, max_seq):
        super().__init__()
        if hidden % heads:
            raise ValueError(f"n_embd {hidden} is not divisible by n_head {heads}")
        self.hidden = hidden
        self.heads = heads
        self.head_dim = hidden // heads
        self.scale = 1.0 / math.sqrt(self.head_dim)
        self.qkv = nn.Linear(hidden, 3 * hidden, bias=True)
        self.proj = nn.Linear(hidden, hidden, bias=True)
        # A plain attribute, not a registered buffer: DDP would otherwise broadcast it on
        # every forward (broadcast_buffers=True), which the dplan executor does not do.
        self.causal = torch.triu(torch.ones(max_seq, max_seq, dtype=torch.bool), diagonal=1)

    def forward(self, x):
        b, t, _ = x.shape
        q, k, v = self.qkv(x).split(self.hidden, dim=-1)
        q = q.view(b, t, self.heads, self.head_dim).transpose(1, 2)  # (b, h, t, d)
        k = k.view(b, t, self.heads, self.head_dim).transpose(1, 2)
        v = v.view(b, t, self.heads, self.head_dim).transpose(1, 2)
        scores = (q @ k.transpose(-2, -1)) * self.scale  # (b, h, t, t)
        scores = scores.masked_fill(self.causal[:t, :t], float("-inf"))
        probs = torch.softmax(scores, dim=-1)
        y = (probs @ v).transpose(1, 2).contiguous().view(b, t, self.hidden)
        return self.proj(y)


class Block(nn.Module):
    def __init__(self, hidden, heads, inner, max_seq, eps):
        super().__init__()
        self.ln1 = nn.LayerNorm(hidden, eps=eps)
        self.attn = Attention(hidden, heads, max_seq)
        self.ln2 = nn.LayerNorm(hidden, eps=eps)
        self.fc1 = nn.Linear(hidden, inner, bias=True)
        self.fc2 = nn.Linear(inner, hidden, bias=True)

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        x = x + self.fc2(F.gelu(self.fc1(self.ln2(x))))  # exact (erf) GELU
        return x


class GPT(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        hidden = cfg["n_embd"]
        inner = cfg.get("n_inner") or 4 * hidden
        eps = cfg.get("layer_norm_epsilon", 1e-5)
        self.n_positions = cfg["n_positions"]
        self.wte = nn.Embedding(cfg["vocab_size"], hidden)
        self.wpe = nn.Embedding(self.n_positions, hidden)
        self.blocks = nn.ModuleList(
            Block(hidden, cfg["n_head"], inner, self.n_positions, eps) for _ in range(cfg["n_layer"])
        )
        self.ln_f = nn.LayerNorm(hidden, eps=eps)
        self.apply(self._init)

    @staticmethod
    def _init(m):
        if isinstance(m, nn.Linear):
            nn.init.normal_(m.weight, mean=0.0, std=0.02)
            if m.bias is not None:
                nn.init.zeros_(m.bias)
        elif isinstance(m, nn.Embedding):
            nn.init.normal_(m.weight, mean=0.0, std=0.02)
        elif isinstance(m, nn.LayerNorm):
            nn.init.ones_(m.weight)
            nn.init.zeros_(m.bias)

    def forward(self, idx, targets):
        t = idx.shape[1]
        if t > self.n_positions:
            raise ValueError(f"sequence length {t} exceeds n_positions {self.n_positions}")
        pos = torch.arange(t, dtype=torch.long)
        x = self.wte(idx) + self.wpe(pos)
        for block in self.blocks:
            x = block(x)
        x = self.ln_f(x)
        logits = F.linear(x, self.wte.weight)  # LM head tied to wte, no bias
        return F.cross_entropy(logits.view(-1, logits.shape[-1]), targets.reshape(-1))


def load_config(path):
    with open(path) as f:
        cfg = json.load(f)
    if cfg.get("model_type") != "gpt2":
        raise ValueError(f"{path}: model_type {cfg.get('model_type')!r}, expected 'gpt2'")
    if cfg.get("activation_function", "gelu") != "gelu":
        raise ValueError(f"{path}: only activation_function 'gelu' (exact) is supported")
    if not cfg.get("tie_word_embeddings", True):
        raise ValueError(f"{path}: only tie_word_embeddings true is supported")
    return cfg


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--config", default=os.path.join(here, "gpt-bench", "config.json"))
    p.add_argument("--steps", type=int, default=30, help="steps in all, warm-up included")
    p.add_argument("--warmup", type=int, default=5, help="leading steps left out of the median")
    p.add_argument("--global-batch", type=int, default=16, help="sequences per step, all ranks")
    p.add_argument("--seq", type=int, default=128)
    p.add_argument("--seed", type=int, default=1234)
    args = p.parse_args()

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    if args.global_batch % world:
        raise SystemExit(f"--global-batch {args.global_batch} is not divisible by world size {world}")
    if args.steps <= args.warmup:
        raise SystemExit(f"--steps {args.steps} must exceed --warmup {args.warmup}")
    micro_batch = args.global_batch // world
    threads = max(1, (os.cpu_count() or 1) // world)
    torch.set_num_threads(threads)

    cfg = load_config(args.config)
    torch.manual_seed(args.seed)  # same init everywhere; DDP also broadcasts rank 0's weights
    model = DDP(GPT(cfg))  # default bucket_cap_mb=25
    # Weight decay 0.1 on the matrices and embeddings, none on biases and LayerNorms, as the
    # dplan executor does.
    decay = [q for q in model.parameters() if q.dim() >= 2]
    no_decay = [q for q in model.parameters() if q.dim() < 2]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
        lr=1e-3, betas=(0.9, 0.95), eps=1e-8,
    )

    gen = torch.Generator().manual_seed(args.seed + 1 + rank)  # each rank its own data shard
    vocab = cfg["vocab_size"]

    times, losses = [], []
    for step in range(args.steps):
        tokens = torch.randint(0, vocab, (micro_batch, args.seq + 1), generator=gen)
        inputs, targets = tokens[:, :-1], tokens[:, 1:]
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        loss = model(inputs, targets)
        loss.backward()  # DDP all-reduces gradient buckets during backward
        opt.step()
        times.append(time.perf_counter() - t0)
        losses.append(loss.item())

    measured = times[args.warmup:]
    median = statistics.median(measured)
    if rank == 0:
        print(json.dumps({
            "world_size": world,
            "median_step_s": median,
            "steps": len(measured),
            "warmup": args.warmup,
            "step_times_s": measured,
            "tokens_per_s": args.global_batch * args.seq / median,
            "micro_batch": micro_batch,
            "global_batch": args.global_batch,
            "seq": args.seq,
            "threads_per_rank": threads,
            "first_loss": losses[0],
            "last_loss": losses[-1],
            "torch_version": torch.__version__,
        }), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    sys.exit(main())
