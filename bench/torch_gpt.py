#!/usr/bin/env python3
"""The GPT of dplan's executor in torch.nn, trained by PyTorch's own engines (PyTorch >= 2).

One definition of the network serves two purposes:

  reference  --reference FILE (written by `dplan-worker --save-reference FILE` / `dplan run
             --save-reference FILE` on one rank): the executor's initial weights and every step's
             token ids. Trains those steps and prints, on rank 0, one JSON line
             {"engine", "world_size", "losses": [...], "grad_norms": [...], ...}.
  bench      (no --reference): the model of --config (a Hugging Face GPT-2 config.json), seeded
             init and synthetic batches; prints on rank 0 one JSON line with the median step
             time ({"median_step_s", "step_times_s", "tokens_per_s", ...}).

Engines (--engine), over Gloo on CPU, world 1 or 2 under torchrun:

  ddp    torch.nn.parallel.DistributedDataParallel (default 25 MB buckets)
  fsdp2  torch.distributed.fsdp.fully_shard per block then the root, reshard_after_forward=True
         (full sharding: ZeRO-3)
  tp     torch.distributed.tensor.parallel.parallelize_module over a 1-D DeviceMesh of the world:
         ColwiseParallel on q, k, v and fc1, RowwiseParallel on the attention output projection
         and fc2 (Megatron-LM's split; each rank attends over its heads / tp heads)

    torchrun --standalone --nproc_per_node 2 bench/torch_gpt.py --engine fsdp2 --reference ref.safetensors
    torchrun --standalone --nproc_per_node 2 bench/torch_gpt.py --engine ddp --steps 30 --warmup 5

The math is the executor's (executor/src/gpt.cpp, rank_setup.cpp, grad_sync.cpp): token plus learned
position embedding; pre-LayerNorm blocks x + proj(attn(norm1(x))), x + fc2(gelu(fc1(norm2(x))))
with exact (erf) GELU and causal attention; a final LayerNorm; the LM head tied to the token
embedding, its padded rows (the executor pads the vocabulary to a multiple of tp) masked out of
the softmax; the loss the mean cross-entropy over the global batch's tokens; the gradient clipped
by its global norm (scaled by max_norm / (norm + 1e-6) when the norm exceeds max_norm, as the
executor does); AdamW with weight decay on matrices and embeddings only.
"""

import argparse
import json
import math
import os
import statistics
import struct
import sys
import time
import warnings

warnings.filterwarnings("ignore", message="Failed to initialize NumPy")  # torch without numpy: harmless here

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

ENGINES = ("ddp", "fsdp2", "tp")
INIT_STD = 0.02  # bench mode's init, GPT-2's


class InputProblem(Exception):
    """Bad input: reported as one line, exit status 2."""


# ---------------------------------------------------------------------------------------------
# The network


class Attention(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        h, d = cfg["hidden_size"], cfg["head_dim"]
        self.head_dim = d
        # Separate q, k, v (not one fused qkv) so that a column-parallel shard of each holds whole
        # heads: rank r of tp gets heads [r * heads / tp, (r + 1) * heads / tp) of q, k and v alike.
        self.q = nn.Linear(h, cfg["num_heads"] * d, bias=cfg["qkv_bias"])
        self.k = nn.Linear(h, cfg["num_kv_heads"] * d, bias=cfg["qkv_bias"])
        self.v = nn.Linear(h, cfg["num_kv_heads"] * d, bias=cfg["qkv_bias"])
        self.proj = nn.Linear(cfg["num_heads"] * d, h, bias=cfg["out_bias"])

    def forward(self, x):
        b, s, _ = x.shape
        # -1: the heads this rank holds (all of them, or heads / tp under tensor parallel).
        q = self.q(x).view(b, s, -1, self.head_dim).transpose(1, 2)
        k = self.k(x).view(b, s, -1, self.head_dim).transpose(1, 2)
        v = self.v(x).view(b, s, -1, self.head_dim).transpose(1, 2)
        if hasattr(F, "scaled_dot_product_attention"):
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # exact softmax(q k^T / sqrt(d)) v
        else:  # torch 1.13 (ddp only: a control on Debian's libtorch, the one dplan-worker links)
            scores = (q @ k.transpose(-2, -1)) / math.sqrt(self.head_dim)
            future = torch.ones(s, s, dtype=torch.bool).triu(1)
            y = torch.softmax(scores.masked_fill(future, float("-inf")), dim=-1) @ v
        return self.proj(y.transpose(1, 2).reshape(b, s, -1))


class Mlp(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.fc1 = nn.Linear(cfg["hidden_size"], cfg["ffn_hidden_size"], bias=cfg["mlp_bias"])
        self.fc2 = nn.Linear(cfg["ffn_hidden_size"], cfg["hidden_size"], bias=cfg["mlp_bias"])

    def forward(self, x):
        return self.fc2(F.gelu(self.fc1(x)))  # exact (erf) GELU


class Block(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.norm1 = nn.LayerNorm(cfg["hidden_size"], eps=cfg["norm_eps"])
        self.attn = Attention(cfg)
        self.norm2 = nn.LayerNorm(cfg["hidden_size"], eps=cfg["norm_eps"])
        self.mlp = Mlp(cfg)

    def forward(self, x):
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class GPT(nn.Module):
    """Module names follow the executor's parameter names (layers.3.mlp.fc1.weight, ...)."""

    def __init__(self, cfg):
        super().__init__()
        self.vocab_size = cfg["vocab_size"]
        self.wte = nn.Embedding(cfg["padded_vocab_size"], cfg["hidden_size"])
        self.wpe = nn.Embedding(cfg["max_seq_len"], cfg["hidden_size"])
        self.layers = nn.ModuleList(Block(cfg) for _ in range(cfg["num_layers"]))
        self.final_norm = nn.LayerNorm(cfg["hidden_size"], eps=cfg["norm_eps"])

    def forward(self, tokens, targets):
        s = tokens.shape[1]
        x = self.wte(tokens) + self.wpe(torch.arange(s, device=tokens.device))
        for layer in self.layers:
            x = layer(x)
        logits = F.linear(self.final_norm(x), self.wte.weight)  # the LM head is the token embedding
        if logits.shape[-1] > self.vocab_size:  # padded rows: no token, out of the softmax
            logits = logits.masked_fill(torch.arange(logits.shape[-1]) >= self.vocab_size, float("-inf"))
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


def check_supported(cfg, where):
    """The executor's GPT-2 family only: what this module writes out."""
    wanted = {"mlp": "gelu", "norm": "layernorm", "position": "learned", "tied_embeddings": True}
    for key, value in wanted.items():
        if cfg.get(key) != value:
            raise InputProblem(f"{where}: {key} is {cfg.get(key)!r}; this reference implements only {value!r} (GPT-2)")
    if cfg.get("activation", "gelu") != "gelu" or cfg.get("qk_norm", False):
        raise InputProblem(f"{where}: activation {cfg.get('activation')!r} or q/k norms; this reference implements "
                           "only exact GELU without q/k norms (GPT-2)")
    if cfg["num_kv_heads"] != cfg["num_heads"]:
        raise InputProblem(f"{where}: {cfg['num_kv_heads']} kv heads for {cfg['num_heads']} heads; this reference "
                           "implements only multi-head attention (GPT-2)")
    if cfg.get("attention_dropout", 0) or cfg.get("hidden_dropout", 0):
        raise InputProblem(f"{where}: dropout is not 0; runs with dropout cannot be compared step by step")


def read_json(path):
    """The JSON file at path, or InputProblem naming it (also bench/torch_llama.py's reader)."""
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, json.JSONDecodeError) as e:
        raise InputProblem(f"{path}: {e}")


def config_from_hf(path):
    """Bench mode: the model of a Hugging Face GPT-2 config.json, as dplan reads it."""
    hf = read_json(path)
    if hf.get("model_type") != "gpt2":
        raise InputProblem(f"{path}: model_type {hf.get('model_type')!r}, expected 'gpt2'")
    h, heads = hf["n_embd"], hf["n_head"]
    cfg = {
        "num_layers": hf["n_layer"], "hidden_size": h, "num_heads": heads, "num_kv_heads": heads,
        "head_dim": h // heads, "ffn_hidden_size": hf.get("n_inner") or 4 * h, "vocab_size": hf["vocab_size"],
        "padded_vocab_size": hf["vocab_size"], "max_seq_len": hf["n_positions"],
        "mlp": "gelu" if hf.get("activation_function", "gelu") == "gelu" else hf["activation_function"],
        "norm": "layernorm", "position": "learned", "tied_embeddings": hf.get("tie_word_embeddings", True),
        "qkv_bias": True, "out_bias": True, "mlp_bias": True, "norm_eps": hf.get("layer_norm_epsilon", 1e-5),
        "attention_dropout": hf.get("attn_pdrop", 0.0), "hidden_dropout": hf.get("resid_pdrop", 0.0),
    }
    check_supported(cfg, path)
    return cfg


def seeded_init(model, seed):
    """Bench mode: GPT-2's init (N(0, 0.02) matrices and embeddings, zero biases, unit norms)."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() >= 2:
                p.copy_(torch.randn(p.shape, generator=gen) * INIT_STD)
            elif name.endswith("norm1.weight") or name.endswith("norm2.weight") or name == "final_norm.weight":
                p.fill_(1.0)
            else:
                p.zero_()


# ---------------------------------------------------------------------------------------------
# The executor's reference file


SAFETENSORS_DTYPES = {"F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
                      "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8,
                      "U8": torch.uint8, "BOOL": torch.bool}


def read_safetensors(path):
    """{name: tensor}, {metadata}: the format read directly (8-byte little-endian header length,
    JSON header, raw little-endian data), so that nothing beyond torch is needed."""
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except OSError as e:
        raise InputProblem(f"{path}: {e.strerror}")
    if len(raw) < 8:
        raise InputProblem(f"{path}: {len(raw)} bytes, too short for a safetensors file")
    (n,) = struct.unpack("<Q", raw[:8])
    if n > len(raw) - 8:
        raise InputProblem(f"{path}: header length {n} exceeds the file ({len(raw)} bytes)")
    try:
        header = json.loads(raw[8:8 + n])
    except json.JSONDecodeError as e:
        raise InputProblem(f"{path}: the header is not JSON ({e})")
    data = raw[8 + n:]
    metadata = header.pop("__metadata__", {})
    tensors = {}
    for name, info in header.items():
        begin, end = info["data_offsets"]
        dtype = SAFETENSORS_DTYPES.get(info["dtype"])
        if dtype is None or not 0 <= begin <= end <= len(data):
            raise InputProblem(f"{path}: tensor {name}: dtype {info['dtype']} or offsets [{begin}, {end}) not readable")
        if end == begin:
            tensors[name] = torch.empty(info["shape"], dtype=dtype)
        else:
            tensors[name] = torch.frombuffer(bytearray(data[begin:end]), dtype=dtype).reshape(info["shape"]).clone()
    return tensors, metadata


def load_reference(path):
    """(model cfg, optimizer settings, {parameter name: tensor}, [tokens of each step])."""
    tensors, metadata = read_safetensors(path)
    if "dplan" not in metadata:
        raise InputProblem(f"{path}: no 'dplan' metadata; write it with dplan-worker --save-reference")
    info = json.loads(metadata["dplan"])
    if info.get("format_version") != 1:
        raise InputProblem(f"{path}: reference format_version {info.get('format_version')!r}, this reads 1")
    cfg = info["model"]
    check_supported(cfg, path)
    steps = info["training"]["steps"]
    batches = []
    for k in range(steps):
        name = f"tokens.step{k}"
        if name not in tensors:
            raise InputProblem(f"{path}: {name} is missing ({steps} steps announced)")
        batches.append(tensors.pop(name))
    for name in [n for n in tensors if n.startswith(("logits.", "grad.", "hf_grad."))]:
        del tensors[name]  # step 1's results, for checks against other implementations (tests/reference/)
    return cfg, info["optimizer"], tensors, batches


def load_executor_weights(model, params, cfg, where):
    """Copies the executor's parameters (global names) into the module. The executor's fused
    layers.N.attn.qkv.weight is [q rows; k rows; v rows] at tp = 1 (gpt.cpp concatenates each tp
    rank's q, k, v shards; one rank holds them whole), so it splits by rows into q, k and v."""
    q_dim, kv_dim = cfg["num_heads"] * cfg["head_dim"], cfg["num_kv_heads"] * cfg["head_dim"]
    own = dict(model.named_parameters())
    expanded = {}
    for name, t in params.items():
        if name.endswith(".attn.qkv.weight") or name.endswith(".attn.qkv.bias"):
            prefix, kind = name.rsplit(".attn.qkv.", 1)
            if t.shape[0] != q_dim + 2 * kv_dim:
                raise InputProblem(f"{where}: {name} has {t.shape[0]} rows, expected {q_dim + 2 * kv_dim}")
            for part, piece in zip("qkv", t.split([q_dim, kv_dim, kv_dim], dim=0)):
                expanded[f"{prefix}.attn.{part}.{kind}"] = piece
        elif name == "wte" or name == "wpe":
            expanded[name + ".weight"] = t
        else:
            expanded[name] = t
    missing = sorted(set(own) - set(expanded))
    extra = sorted(set(expanded) - set(own))
    if missing or extra:
        raise InputProblem(f"{where}: parameters do not match the network: missing {missing[:4]}, unknown {extra[:4]}")
    with torch.no_grad():
        for name, p in own.items():
            if tuple(expanded[name].shape) != tuple(p.shape):
                raise InputProblem(f"{where}: {name} has shape {list(expanded[name].shape)}, expected {list(p.shape)}")
            p.copy_(expanded[name].to(torch.float32))


# ---------------------------------------------------------------------------------------------
# Engines, clipping, optimizer


def wrap(model, engine, world):
    """The model under the engine; also returns the mesh (None for DDP)."""
    if engine == "ddp":
        from torch.nn.parallel import DistributedDataParallel as DDP

        return DDP(model), None
    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh("cpu", (world,))
    if engine == "fsdp2":
        from torch.distributed.fsdp import fully_shard

        for layer in model.layers:
            fully_shard(layer, mesh=mesh, reshard_after_forward=True)
        fully_shard(model, mesh=mesh, reshard_after_forward=True)  # the root: embeddings, final norm
        return model, mesh
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    if model.layers[0].attn.q.out_features // model.layers[0].attn.head_dim % world:
        raise InputProblem(f"tp {world} does not divide the number of heads")
    plan = {"attn.q": ColwiseParallel(), "attn.k": ColwiseParallel(), "attn.v": ColwiseParallel(),
            "attn.proj": RowwiseParallel(), "mlp.fc1": ColwiseParallel(), "mlp.fc2": RowwiseParallel()}
    for layer in model.layers:
        parallelize_module(layer, mesh, plan)
    return model, mesh


def clip_global_norm(params, max_norm, world):
    """The global gradient norm, counting every shard once and every replica once (sharded DTensor
    gradients: local squares summed over ranks; replicated ones and plain tensors: this rank's),
    then the executor's clipping: scale by max_norm / (norm + 1e-6) when the norm exceeds
    max_norm. Returns the norm before clipping."""
    try:
        from torch.distributed.tensor import DTensor
    except ImportError:  # torch 1.13 has no DTensor, so no gradient is one
        DTensor = ()

    sharded = torch.zeros((), dtype=torch.float64)
    replicated = torch.zeros((), dtype=torch.float64)
    grads = [p.grad for p in params if p.grad is not None]
    for g in grads:
        if isinstance(g, DTensor):
            local = g.to_local().to(torch.float64)
            if any(pl.is_shard() for pl in g.placements):
                sharded += local.pow(2).sum()
            else:
                replicated += local.pow(2).sum()
        else:
            replicated += g.to(torch.float64).pow(2).sum()
    if world > 1:
        dist.all_reduce(sharded)
    norm = math.sqrt(float(sharded + replicated))
    if max_norm > 0 and norm > max_norm:
        scale = max_norm / (norm + 1e-6)
        for g in grads:
            (g.to_local() if isinstance(g, DTensor) else g).mul_(scale)
    return norm


def adamw(model, opt, decays=lambda name, p: p.dim() >= 2):
    """The executor's groups: weight decay on matrices and embeddings, none on norms and biases
    (by default told apart by their dimensions; `decays(name, parameter)` says otherwise)."""
    named = list(model.named_parameters())
    decay = [p for n, p in named if decays(n, p)]
    no_decay = [p for n, p in named if not decays(n, p)]
    return torch.optim.AdamW([{"params": decay, "weight_decay": opt["weight_decay"]},
                              {"params": no_decay, "weight_decay": 0.0}],
                             lr=opt["lr"], betas=tuple(opt["betas"]), eps=opt["eps"], foreach=False)


def rows_of_rank(tokens, engine, rank, world):
    """This rank's rows of a global batch: data-parallel rank r reads rows r, r + world, ...,
    as the executor's data-parallel ranks do; tensor-parallel ranks all read the whole batch."""
    return tokens if engine == "tp" else tokens[rank::world]


def train_step(model, optimizer, tokens, max_norm, engine, world, phases=None):
    """One step; returns (the global batch's mean loss, the gradient norm before clipping). With
    `phases` (a dict), adds the step's seconds in forward, backward (with the engine's gradient
    communication, which overlaps it) and optimizer (clipping and the step) to it, the phases
    dplan run's run.json names alike."""
    t0 = time.perf_counter()
    optimizer.zero_grad(set_to_none=True)
    loss = model(tokens[:, :-1], tokens[:, 1:])  # the mean over this rank's tokens
    t1 = time.perf_counter()
    loss.backward()  # DDP averages gradients over ranks, FSDP2 reduce-scatters their mean
    t2 = time.perf_counter()
    norm = clip_global_norm(list(model.parameters()), max_norm, world)
    optimizer.step()
    if phases is not None:
        for name, seconds in (("forward", t1 - t0), ("backward", t2 - t1), ("optimizer", time.perf_counter() - t2)):
            phases[name] = phases.get(name, 0.0) + seconds
    mean = loss.detach().clone()
    if engine != "tp" and world > 1:  # data-parallel ranks hold equal shares of the global batch
        dist.all_reduce(mean)
        mean /= world
    return float(mean), norm


def shut_down():
    """Every rank past its last collective before any tears its process group down: without the
    barrier, Gloo under torch 2.15 now and then aborts a rank at exit ("terminate called without
    an active exception") after the results are printed."""
    dist.barrier()
    dist.destroy_process_group()


# ---------------------------------------------------------------------------------------------


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--engine", choices=ENGINES, default="ddp")
    p.add_argument("--reference", help="train the executor's initial weights and batches from this safetensors file")
    p.add_argument("--config", default=os.path.join(here, "gpt-bench", "config.json"), help="bench mode's model")
    p.add_argument("--steps", type=int, default=30, help="bench mode: steps in all, warm-up included")
    p.add_argument("--warmup", type=int, default=5, help="bench mode: leading steps left out of the median")
    p.add_argument("--global-batch", type=int, default=16, help="bench mode: sequences per step, all ranks")
    p.add_argument("--seq", type=int, default=128, help="bench mode: tokens per sequence")
    p.add_argument("--seed", type=int, default=1234, help="bench mode: init and data")
    p.add_argument("--lr", type=float, default=1e-3, help="bench mode (reference mode takes the file's)")
    p.add_argument("--max-grad-norm", type=float, default=1.0, help="bench mode (reference mode takes the file's)")
    p.add_argument("--perturb", metavar="NAME",
                   help="reference mode: add 1e-3 to the first element of this parameter (torch name, e.g. "
                        "layers.0.mlp.fc1.weight), to check that a comparison catches a mismatch")
    p.add_argument("--threads", type=int, default=1,
                   help="intra-op threads per rank (default 1, as each dplan-worker rank runs)")
    args = p.parse_args()

    if "RANK" not in os.environ:
        raise InputProblem("start it under torchrun (torchrun --standalone --nproc_per_node N bench/torch_gpt.py ...)")
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    if world not in (1, 2):
        raise InputProblem(f"world size {world}: this runs on 1 or 2 ranks")
    if args.threads < 1:
        raise InputProblem(f"--threads must be at least 1, got {args.threads}")
    torch.set_num_threads(args.threads)

    if args.reference:
        cfg, opt, params, batches = load_reference(args.reference)
        model = GPT(cfg)
        load_executor_weights(model, params, cfg, args.reference)
        if args.perturb:
            own = dict(model.named_parameters())
            if args.perturb not in own:
                raise InputProblem(f"--perturb {args.perturb}: no such parameter; e.g. {next(iter(own))}")
            with torch.no_grad():
                own[args.perturb].view(-1)[0] += 1e-3
        global_batch = batches[0].shape[0]
        if args.engine != "tp" and global_batch % world:
            raise InputProblem(f"the global batch of {global_batch} is not divisible by world size {world}")
        model, _ = wrap(model, args.engine, world)
        optimizer = adamw(model, opt)
        losses, norms = [], []
        for tokens in batches:
            loss, norm = train_step(model, optimizer, rows_of_rank(tokens, args.engine, rank, world),
                                    opt["max_grad_norm"], args.engine, world)
            losses.append(loss)
            norms.append(norm)
        if rank == 0:
            print(json.dumps({"engine": args.engine, "world_size": world, "steps": len(losses), "losses": losses,
                              "grad_norms": norms, "torch_version": torch.__version__}), flush=True)
        shut_down()
        return 0

    if args.steps <= args.warmup or args.warmup < 0:
        raise InputProblem(f"--steps {args.steps} must exceed --warmup {args.warmup} (>= 0)")
    if args.engine != "tp" and args.global_batch % world:
        raise InputProblem(f"--global-batch {args.global_batch} is not divisible by world size {world}")
    cfg = config_from_hf(args.config)
    if args.seq > cfg["max_seq_len"]:
        raise InputProblem(f"--seq {args.seq} exceeds the model's {cfg['max_seq_len']} positions")
    model = GPT(cfg)
    seeded_init(model, args.seed)
    model, _ = wrap(model, args.engine, world)
    optimizer = adamw(model, {"lr": args.lr, "betas": (0.9, 0.95), "eps": 1e-8, "weight_decay": 0.1})
    gen = torch.Generator().manual_seed(args.seed + 1)  # the same global batches on every rank
    times, losses, phases = [], [], []
    for _ in range(args.steps):
        tokens = torch.randint(0, cfg["vocab_size"], (args.global_batch, args.seq + 1), generator=gen)
        mine = rows_of_rank(tokens, args.engine, rank, world)
        phases.append({})
        t0 = time.perf_counter()
        loss, _ = train_step(model, optimizer, mine, args.max_grad_norm, args.engine, world, phases[-1])
        times.append(time.perf_counter() - t0)
        losses.append(loss)
    measured = times[args.warmup:]
    median = statistics.median(measured)
    phases_s = {name: statistics.median(p[name] for p in phases[args.warmup:]) for name in phases[0]}
    if rank == 0:
        print(json.dumps({
            "engine": args.engine, "world_size": world, "median_step_s": median, "steps": len(measured),
            "warmup": args.warmup, "step_times_s": measured, "tokens_per_s": args.global_batch * args.seq / median,
            "global_batch": args.global_batch, "seq": args.seq, "threads_per_rank": args.threads,
            "first_loss": losses[0], "last_loss": losses[-1], "torch_version": torch.__version__,
            "phases_s": phases_s,
        }), flush=True)
    shut_down()
    return 0


if __name__ == "__main__":
    try:
        status = main()
    except InputProblem as e:
        if os.environ.get("RANK", "0") == "0":
            print(f"torch_gpt.py: error: {e}", file=sys.stderr)
        status = 2
    # Out without the interpreter's teardown: even past shut_down's barrier, Gloo's threads under
    # torch 2.15 now and then abort a rank there (SIGABRT), after the results are printed.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)
