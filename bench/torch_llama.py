#!/usr/bin/env python3
"""A dplan plan's Llama-style model trained by plain PyTorch on one GPU: the reference the
executor's single-GPU speed is measured against (docs/gpu-check.md).

    python3 bench/torch_llama.py --plan dense-plan.json --steps 12 --warmup 2 [--compile]

Reads the plan's model (layers, widths, heads, kv heads, vocabulary, tied embeddings) and its
layout (micro-batch, global batch, sequence, recompute none or full) and trains that model the way
a PyTorch user trains on one GPU: fp32 parameters under bf16 autocast, PyTorch's fused
scaled_dot_product_attention (flash on CUDA), gradients accumulated over global_batch / micro_batch
micro-batches, the global norm clipped to 1, fused AdamW. --compile compiles each block with
torch.compile (torchtitan's per-block compile), the first steps paying for it (left out with the
warm-up). Synthetic tokens, seeded. Prints one JSON line: {"median_step_s", "step_times_s",
"tokens_per_s", "compile", "peak_allocated_bytes", "phases_s"?, ...}.

The network (Llama 2/3 as Hugging Face's modeling_llama.py defines it, transformers 4.x/5.x):
x + o(attn(rope(q(n1(x))), rope(k(n1(x))), v(n1(x)))), x + down(silu(gate(n2(x))) * up(n2(x)))
with RMSNorm, rotary embeddings on the first and second halves of each head, grouped-query
attention (kv heads repeated by SDPA's enable_gqa), a final RMSNorm and the LM head (tied to the
embedding when the model says so).
"""

import argparse
import json
import statistics
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.utils.checkpoint


from torch_gpt import InputProblem, read_json  # beside this file: bad input is one line, exit status 2


class RMSNorm(nn.Module):
    def __init__(self, h, eps=1e-5):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(h))
        self.eps = eps

    def forward(self, x):
        return F.rms_norm(x, (x.shape[-1],), self.weight, self.eps)


def rotary_tables(seq, head_dim, theta, device):
    inv = 1.0 / theta ** (torch.arange(0, head_dim, 2, device=device, dtype=torch.float32) / head_dim)
    freqs = torch.outer(torch.arange(seq, device=device, dtype=torch.float32), inv)
    emb = torch.cat([freqs, freqs], dim=-1)
    return emb.cos(), emb.sin()


def rotate(x, cos, sin):
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return (x * cos + rotated * sin).to(x.dtype)


class Block(nn.Module):
    def __init__(self, m):
        super().__init__()
        h, d = m["hidden_size"], m["head_dim"]
        self.heads, self.kv_heads, self.head_dim = m["num_heads"], m["num_kv_heads"], d
        self.n1, self.n2 = RMSNorm(h, m.get("norm_eps", 1e-5)), RMSNorm(h, m.get("norm_eps", 1e-5))
        self.q = nn.Linear(h, self.heads * d, bias=m.get("qkv_bias", False))
        self.k = nn.Linear(h, self.kv_heads * d, bias=m.get("qkv_bias", False))
        self.v = nn.Linear(h, self.kv_heads * d, bias=m.get("qkv_bias", False))
        self.o = nn.Linear(self.heads * d, h, bias=m.get("out_bias", False))
        f = m["ffn_hidden_size"]
        self.gate = nn.Linear(h, f, bias=m.get("mlp_bias", False))
        self.up = nn.Linear(h, f, bias=m.get("mlp_bias", False))
        self.down = nn.Linear(f, h, bias=m.get("mlp_bias", False))

    def forward(self, x, cos, sin):
        b, s, _ = x.shape
        y = self.n1(x)
        q = rotate(self.q(y).view(b, s, self.heads, self.head_dim).transpose(1, 2), cos, sin)
        k = rotate(self.k(y).view(b, s, self.kv_heads, self.head_dim).transpose(1, 2), cos, sin)
        v = self.v(y).view(b, s, self.kv_heads, self.head_dim).transpose(1, 2)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=self.kv_heads != self.heads)
        x = x + self.o(a.transpose(1, 2).reshape(b, s, -1))
        y = self.n2(x)
        return x + self.down(F.silu(self.gate(y)) * self.up(y))


class Llama(nn.Module):
    def __init__(self, m, recompute):
        super().__init__()
        self.embed = nn.Embedding(m["vocab_size"], m["hidden_size"])
        self.layers = nn.ModuleList(Block(m) for _ in range(m["num_layers"]))
        self.norm = RMSNorm(m["hidden_size"], m.get("norm_eps", 1e-5))
        self.head = None if m.get("tied_embeddings") else nn.Linear(m["hidden_size"], m["vocab_size"], bias=False)
        self.recompute = recompute
        self.head_dim = m["head_dim"]

    def forward(self, tokens, targets, cos, sin):
        x = self.embed(tokens)
        for layer in self.layers:
            if self.recompute:
                x = torch.utils.checkpoint.checkpoint(layer, x, cos, sin, use_reentrant=False)
            else:
                x = layer(x, cos, sin)
        x = self.norm(x)
        logits = F.linear(x, self.embed.weight) if self.head is None else self.head(x)
        return F.cross_entropy(logits.float().view(-1, logits.shape[-1]), targets.reshape(-1))


def read_plan(path):
    plan = read_json(path)
    m, p = plan.get("model", {}), plan.get("parallel", {})
    if m.get("mlp") != "swiglu" or m.get("position") != "rotary" or m.get("num_experts", 0) > 1:
        raise InputProblem(f"{path}: model {m.get('name')!r} is not a dense Llama-style model "
                           "(swiglu, rotary, no experts); this reference trains only those")
    if p.get("tp", 1) * p.get("pp", 1) * p.get("cp", 1) * p.get("dp", 1) != 1:
        raise InputProblem(f"{path}: a plan for more than one GPU; this reference trains on one")
    if p.get("recompute") not in ("none", "full"):
        raise InputProblem(f"{path}: recompute {p.get('recompute')!r}; valid here: none, full")
    return plan


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--plan", required=True, help="a one-GPU plan of a dense Llama-style model (dplan -o)")
    ap.add_argument("--steps", type=int, default=12, help="steps in all, warm-up included")
    ap.add_argument("--warmup", type=int, default=2, help="leading steps left out of the median")
    ap.add_argument("--compile", action="store_true", help="torch.compile each block")
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda",
                    help="cpu: fp32, no autocast (checks the script's mechanics, times nothing of interest)")
    ap.add_argument("--seed", type=int, default=1234)
    args = ap.parse_args()
    try:
        plan = read_plan(args.plan)
        if args.device == "cuda" and not torch.cuda.is_available():
            raise InputProblem("--device cuda: no CUDA device is visible to this PyTorch")
        if args.steps <= args.warmup:
            raise InputProblem(f"--steps {args.steps} must exceed --warmup {args.warmup}")
    except InputProblem as e:
        print(f"torch_llama: error: {e}", file=sys.stderr)
        return 2
    m, p = plan["model"], plan["parallel"]
    seq, mbs = int(plan["training"]["seq_len"]), int(p["micro_batch"])
    global_batch = int(plan["training"]["global_batch"])
    accumulation = global_batch // mbs
    torch.manual_seed(args.seed)
    dev = torch.device(args.device)
    cuda = args.device == "cuda"
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    model = Llama(m, p["recompute"] == "full").to(dev)
    if args.compile:
        for layer in model.layers:
            layer.compile()
    decay = [q for q in model.parameters() if q.dim() >= 2]
    rest = [q for q in model.parameters() if q.dim() < 2]
    optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": rest, "weight_decay": 0.0}],
                                  lr=3e-4, betas=(0.9, 0.95), eps=1e-8, fused=cuda)
    # The plan's rotary base and norm epsilon (absent in plans of models with the old defaults).
    cos, sin = rotary_tables(seq, m["head_dim"], m.get("rope_theta", 10000.0), dev)
    gen = torch.Generator(device=dev).manual_seed(args.seed)
    times, losses = [], []
    compute_s, optimizer_s = [], []
    for step in range(args.steps):
        tokens = torch.randint(0, m["vocab_size"], (accumulation, mbs, seq + 1), device=dev, generator=gen)
        sync()
        t0 = time.perf_counter()
        total = torch.zeros((), device=dev)
        for i in range(accumulation):
            with torch.autocast(args.device, dtype=torch.bfloat16, enabled=cuda):
                loss = model(tokens[i, :, :-1], tokens[i, :, 1:], cos, sin) / accumulation
            loss.backward()
            total += loss.detach()
        sync()
        t1 = time.perf_counter()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0, foreach=True)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        sync()
        t2 = time.perf_counter()
        times.append(t2 - t0)
        compute_s.append(t1 - t0)
        optimizer_s.append(t2 - t1)
        losses.append(float(total))
    kept = times[args.warmup:]
    median_s = statistics.median(kept)
    print(json.dumps({
        "engine": "pytorch", "torch": torch.__version__,
        "device": torch.cuda.get_device_name() if cuda else "cpu",
        "model": m.get("name"), "seq": seq, "micro_batch": mbs, "global_batch": global_batch,
        "recompute": p["recompute"], "compile": args.compile,
        "precision": "fp32 weights, bf16 autocast" if cuda else "fp32",
        "median_step_s": median_s, "step_times_s": [round(t, 5) for t in times],
        "tokens_per_s": global_batch * seq / median_s,
        "phases_s": {"forward_backward": statistics.median(compute_s[args.warmup:]),
                     "optimizer": statistics.median(optimizer_s[args.warmup:])},
        "first_loss": losses[0], "last_loss": losses[-1],
        "peak_allocated_bytes": torch.cuda.max_memory_allocated() if cuda else None}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
