#!/usr/bin/env python3
"""Loads the files `dplan export` wrote with the engine's own parser or config classes and asserts
that the engine's view of the layout equals the plan's.

    check_export.py --engine ENGINE --plan plan.json --dir EXPORT_DIR

ENGINE: megatron, torchtitan, deepspeed, accelerate. On success prints one line per file the
engine accepted, naming the engine and its version, and exits 0. A file the engine rejects, or a
view that differs from the plan, is one line "ENGINE VERSION rejected FILE: why" and exit 1. A
missing engine is one line naming `scripts/torch-venv.sh --engines`, exit 1 (the test fails: it
never skips). Bad arguments: exit 2.

What each engine's own code checks here (versions pinned in requirements.txt; docs/engines.md):
- Megatron-Core: TransformerConfig (ModelParallelConfig), DistributedDataParallelConfig and
  OptimizerConfig built from megatron.args so that their __post_init__ validation runs; the
  microbatch calculator; the per-stage layer split (get_num_layers_to_build,
  get_transformer_layer_offset); RankGenerator's rank groups against the plan's `ranks`.
- torchtitan: ConfigManager.parse_args on torchtitan.toml (0.2.2), ParallelDims validation, the
  pipeline split (generate_llm_fqn_per_model_part) and the model args; torchtitan.overrides
  parsed by 0.3.0's ConfigManager (installed apart, see requirements-torchtitan-head.txt).
- DeepSpeed: DeepSpeedConfig on ds_config.json with the plan's data-parallel size (through an
  mpu, as Megatron-DeepSpeed passes it), which runs its batch assertion.
- Accelerate: `accelerate launch`'s own argument parsing and config loading
  (_validate_launch_command), the environment its launcher hands the processes, and the
  ParallelismConfig / FullyShardedDataParallelPlugin / DeepSpeedPlugin built from it.
"""
import argparse
import contextlib
import dataclasses
import io
import json
import os
import re
import shlex
import subprocess
import sys
import warnings

HERE = os.path.dirname(os.path.abspath(__file__))
HINT = "install them with scripts/torch-venv.sh --engines"
PINS = {}
with open(os.path.join(HERE, "requirements.txt")) as _f:
    for _line in _f:
        _line = _line.split("#")[0].strip()
        if _line:
            _name, _version = _line.split("==")
            PINS[_name] = _version


class Rejected(Exception):
    """The engine refused a file, or its view differs from the plan."""

    def __init__(self, file, why, engine=None):
        why = str(why).strip().splitlines()[0] if str(why).strip() else repr(why)  # one line
        super().__init__(f"{file}: {why}")
        self.file, self.why, self.engine = file, why, engine


def engine_version(package):
    from importlib.metadata import PackageNotFoundError, version

    try:
        installed = version(package)
    except PackageNotFoundError:
        print(f"check_export: {package} is not installed in {sys.executable}; {HINT}")
        sys.exit(1)
    if installed != PINS[package]:
        print(f"check_export: {package} {installed} is installed, the tests pin {PINS[package]}; {HINT}")
        sys.exit(1)
    return installed


@contextlib.contextmanager
def quiet():
    """Engines log at import and construction; their chatter goes to a buffer shown on failure."""
    buffer = io.StringIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with contextlib.redirect_stdout(buffer), contextlib.redirect_stderr(buffer):
            try:
                yield buffer
            except Rejected:
                raise  # our own verdict: the engine's chatter adds nothing
            except BaseException:
                sys.__stderr__.write(buffer.getvalue()[-4000:])
                raise


class Plan:
    """The layout facts of a plan.json as `dplan estimate -o` writes it (docs/cli.md)."""

    def __init__(self, path):
        with open(path) as f:
            d = json.load(f)
        self.raw = d
        p, t, m = d["parallel"], d["training"], d["model"]
        self.gpus = d["gpus"]
        self.tp, self.pp, self.vpp, self.cp = p["tp"], p["pp"], p.get("vpp", 1), p["cp"]
        self.ep, self.dp = p.get("ep", 1), p["dp"]
        self.etp = p.get("etp") or p.get("expert_tp") or self.tp
        self.zero = p["zero_stage"]
        self.distributed_optimizer = p.get("distributed_optimizer", False)
        self.offload = p.get("offload_optimizer", False)
        self.recompute = p["recompute"]
        self.sp = p.get("sequence_parallel", False)
        self.mbs, self.gbs = p["micro_batch"], t["global_batch"]
        self.microbatches = d["num_microbatches"]
        self.precision = t["precision"]
        self.seq = t["seq_len"]
        self.model = m
        self.moe = m.get("num_experts", 0) > 0
        self.stages = d["stages"]
        self.ranks = d["rank_layout"]["ranks"]
        self.gpus_per_node = d["cluster"]["gpus_per_node"]
        self.nodes = (self.gpus + self.gpus_per_node - 1) // self.gpus_per_node

    def sharding(self):
        """The ZeRO stage the plan asks for: a distributed optimizer is ZeRO-1."""
        return max(self.zero, 1 if self.distributed_optimizer else 0)

    def chunk(self, pp_rank, vp):
        c = self.stages[pp_rank]["chunks"][vp]
        return c["first_layer"], c["num_layers"]

    def groups(self, dim, coords):
        """Ranks that share every coordinate in `coords` but `dim`, ordered by `dim`: the plan's
        process groups along `dim`."""
        out = {}
        for r in self.ranks:
            key = tuple(r.get(c, 0) for c in coords if c != dim)
            out.setdefault(key, []).append((r.get(dim, 0), r["rank"]))
        return sorted([rank for _, rank in sorted(g)] for g in out.values())


def expect(file, what, engine_value, plan_value):
    if engine_value != plan_value:
        raise Rejected(file, f"the engine reads {what} = {engine_value!r}, the plan has {plan_value!r}")


def comment_header(path, engine):
    """The file's leading `#` comment names the engine and the version whose spellings it uses."""
    name = os.path.basename(path)
    header = []
    for line in open(path):
        if line.startswith("#!"):
            continue
        if not line.startswith("#"):
            break
        header.append(line)
    text = "".join(header)
    if not re.search(engine, text, re.I) or not re.search(r"\d+\.\d+|core_v|[0-9a-f]{10}", text):
        raise Rejected(name, f"its leading comment does not name {engine} and a version: {text.strip()[:200]!r}")
    readme = os.path.join(os.path.dirname(path), "README.export")
    if not os.path.isfile(readme) or not re.search(engine, open(readme).read(), re.I):
        raise Rejected("README.export", f"missing or does not name {engine}")


def check_torchrun_launch(export_dir, script, plan, env_names=()):
    """The torchrun line a launch script runs, parsed by torchrun's own parser
    (torch.distributed.run.get_args_parser): nodes and processes per node must be the plan's.
    Returns the training script (or module), its arguments and the exported `env_names`."""
    if not os.access(os.path.join(export_dir, script), os.X_OK):
        raise Rejected(script, "missing or not executable")
    comment_header(os.path.join(export_dir, script), script.split("-")[1].split(".")[0])
    argv, exported = launch_arguments(export_dir, script, "torchrun", env_names)
    from torch.distributed.run import get_args_parser

    try:
        with quiet():
            args = get_args_parser().parse_args(argv)
    except SystemExit:
        raise Rejected(script, f"torchrun refuses its arguments: {' '.join(argv)[:300]}")
    nodes, per_node = plan.nodes, min(plan.gpus, plan.gpus_per_node)
    if str(args.nnodes) != str(nodes) or str(args.nproc_per_node) != str(per_node):
        raise Rejected(script, f"torchrun --nnodes {args.nnodes} --nproc-per-node {args.nproc_per_node}; the plan has "
                               f"{nodes} node(s) x {per_node}")
    return args.training_script, list(args.training_script_args), exported


# ---------------------------------------------------------------------------------------------
# Megatron-Core
# ---------------------------------------------------------------------------------------------

# megatron.training (arguments.py) is not in the megatron-core wheel. Its argparse dest is the flag
# with dashes turned into underscores (argparse); core_transformer_config_from_args then
# copies every dest that names a TransformerConfig field and renames a few (below). These are the
# flags whose dest is not the config field of the same name (core_v0.15.0
# megatron/training/arguments.py, _add_network_size_args / _add_mixed_precision_args /
# core_transformer_config_from_args).
MEGATRON_RENAMED = {
    "disable_bias_linear": ("add_bias_linear", False),
    "num_experts": ("num_moe_experts", None),
    "fp8_format": ("fp8", None),
    "apply_layernorm_1p": ("layernorm_zero_centered_gamma", True),
    "decoder_first_pipeline_num_layers": ("num_layers_in_first_pipeline_stage", None),
    "decoder_last_pipeline_num_layers": ("num_layers_in_last_pipeline_stage", None),
    "no_gradient_accumulation_fusion": ("gradient_accumulation_fusion", False),
}
# Arguments of megatron/training that no megatron-core config class holds (the data, tokenizer,
# checkpoint and batch side of pretrain_gpt.py), with their meaning checked below where the plan
# has it.
MEGATRON_TRAINING_ONLY = {
    "micro_batch_size", "global_batch_size", "seq_length", "max_position_embeddings", "vocab_size",
    "make_vocab_size_divisible_by", "position_embedding_type", "untie_embeddings_and_output_weights",
    "group_query_attention", "swiglu", "squared_relu", "num_layers_per_virtual_pipeline_stage",
    "num_virtual_stages_per_pipeline_rank", "ckpt_format", "tokenizer_type", "grad_reduce_in_bf16",
    "rotary_base", "norm_epsilon", "use_distributed_optimizer", "use_megatron_fsdp",
    "data_parallel_sharding_strategy", "overlap_grad_reduce", "overlap_param_gather",
    "optimizer_cpu_offload", "bf16", "fp16", "rotary_percent",
}


def parse_megatron_args(path):
    """megatron.args: `#` comments, then one flag and its values per line."""
    args = {}
    for n, line in enumerate(open(path), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        words = shlex.split(line)
        if not words[0].startswith("--") or any(w.startswith("--") for w in words[1:]):
            raise Rejected("megatron.args", f"line {n}: not one flag and its values: {line}")
        dest = words[0][2:].replace("-", "_")
        if dest in args:
            raise Rejected("megatron.args", f"line {n}: {words[0]} given twice")
        values = words[1:]
        args[dest] = True if not values else values[0] if len(values) == 1 else values
    return args


def number(v):
    if isinstance(v, bool):
        return v
    try:
        return int(v)
    except (TypeError, ValueError):
        try:
            return float(v)
        except (TypeError, ValueError):
            return v


def check_megatron(plan, export_dir):
    version = engine_version("megatron-core")
    file = "megatron.args"
    path = os.path.join(export_dir, file)
    comment_header(path, "megatron")
    args = {k: number(v) for k, v in parse_megatron_args(path).items()}
    with quiet():
        import torch
        import torch.nn.functional as F
        from megatron.core.activations import squared_relu
        from megatron.core.distributed import DistributedDataParallelConfig
        from megatron.core.num_microbatches_calculator import ConstantNumMicroBatchesCalculator
        from megatron.core.optimizer import OptimizerConfig
        from megatron.core.parallel_state import RankGenerator
        from megatron.core.transformer.transformer_block import get_num_layers_to_build
        from megatron.core.transformer.transformer_config import TransformerConfig
        from megatron.core.transformer.transformer_layer import get_transformer_layer_offset

    tc_fields = {f.name for f in dataclasses.fields(TransformerConfig)}
    ddp_fields = {f.name for f in dataclasses.fields(DistributedDataParallelConfig)}
    opt_fields = {f.name for f in dataclasses.fields(OptimizerConfig)}
    kw, ddp_kw, opt_kw = {}, {}, {}
    for dest, value in args.items():
        if dest in MEGATRON_RENAMED:
            field, fixed = MEGATRON_RENAMED[dest]
            kw[field] = value if fixed is None else fixed
        elif dest in tc_fields:
            kw[dest] = value
        known = dest in MEGATRON_RENAMED or dest in tc_fields or dest in MEGATRON_TRAINING_ONLY
        if dest in ddp_fields:
            ddp_kw[dest] = value
            known = True
        if dest in opt_fields:
            opt_kw[dest] = value
            known = True
        if not known:
            raise Rejected(file, f"--{dest.replace('_', '-')} is neither a field of Megatron-Core {version}'s "
                                 "config classes nor a known pretrain_gpt.py argument")
    # arguments.py's parsers: --window-size through tuple_type ("4095,0"), --window-attn-skip-freq
    # and --moe-layer-freq through their list-expression types.
    if "window_size" in args:
        kw["window_size"] = tuple(int(x) for x in str(args["window_size"]).strip("()").split(","))
    for dest in ("window_attn_skip_freq", "moe_layer_freq"):
        if isinstance(args.get(dest), str) and "[" in args[dest]:
            if re.search(r"[^,\d\[\]\(\)\+\*]", args[dest]):
                raise Rejected(file, f"--{dest.replace('_', '-')} {args[dest]}: not a list expression")
            kw[dest] = eval(args[dest])  # digits, brackets, + and * only (checked above), as arguments.py evaluates it
    # validate_args / core_transformer_config_from_args (core_v0.15.0): dtype, gated units, GQA.
    dtype = torch.bfloat16 if args.get("bf16") else torch.half if args.get("fp16") else torch.float32
    kw["params_dtype"] = kw["pipeline_dtype"] = dtype
    kw["bf16"], kw["fp16"] = bool(args.get("bf16")), bool(args.get("fp16"))
    if args.get("swiglu"):
        kw["gated_linear_unit"], kw["activation_func"] = True, F.silu
    if args.get("squared_relu"):
        kw["activation_func"] = squared_relu
    kw["num_query_groups"] = args.get("num_query_groups") if args.get("group_query_attention") else None
    if args.get("recompute_activations"):
        kw["recompute_granularity"] = "selective"
    # Virtual pipeline (validate_args, core_v0.15.0): layers per pipeline rank, the embedding and the
    # loss counted when the account-for flags are given, over the layers per virtual stage.
    pp = kw.get("pipeline_model_parallel_size", 1)
    if "num_layers_per_virtual_pipeline_stage" in args:
        layers = kw["num_layers"] + bool(args.get("account_for_embedding_in_pipeline_split")) + bool(
            args.get("account_for_loss_in_pipeline_split"))
        if layers % pp or (layers // pp) % args["num_layers_per_virtual_pipeline_stage"]:
            raise Rejected(file, f"{layers} layers over pp {pp} do not split into virtual stages of "
                                 f"{args['num_layers_per_virtual_pipeline_stage']}")
        vpp = layers // pp // args["num_layers_per_virtual_pipeline_stage"]
        kw["virtual_pipeline_model_parallel_size"] = vpp if vpp > 1 else None
    elif "num_virtual_stages_per_pipeline_rank" in args:
        vpp = args["num_virtual_stages_per_pipeline_rank"]
        kw["virtual_pipeline_model_parallel_size"] = vpp if vpp > 1 else None
    if args.get("fp8_format"):
        kw["fp8"] = args["fp8_format"]
    ddp_kw.setdefault("use_distributed_optimizer", bool(args.get("use_distributed_optimizer")))
    opt_kw.update(bf16=kw["bf16"], fp16=kw["fp16"], params_dtype=dtype)
    # Without Transformer Engine (not on PyPI for CPU machines) megatron-core 0.16.1's
    # is_te_min_version compares None with a version and raises TypeError in OptimizerConfig's
    # precision-aware-optimizer branch; "no TE" is "not that TE version", which that branch handles.
    import megatron.core.optimizer.optimizer_config as optimizer_config
    from megatron.core.utils import get_te_version

    if get_te_version() is None:
        optimizer_config.is_te_min_version = lambda *args, **kwargs: False
    try:
        with quiet():
            config = TransformerConfig(**kw)
            ddp = DistributedDataParallelConfig(**ddp_kw)
            opt = OptimizerConfig(**opt_kw)
    except (AssertionError, ValueError, TypeError) as e:
        raise Rejected(file, f"{type(e).__name__}: {e}")

    tp, cp = config.tensor_model_parallel_size, config.context_parallel_size
    vpp = config.virtual_pipeline_model_parallel_size or 1
    expect(file, "tensor_model_parallel_size", tp, plan.tp)
    expect(file, "pipeline_model_parallel_size", pp, plan.pp)
    expect(file, "virtual_pipeline_model_parallel_size", vpp, plan.vpp)
    expect(file, "context_parallel_size", cp, plan.cp)
    expect(file, "sequence_parallel", config.sequence_parallel, plan.sp and plan.tp > 1)
    # initialize_model_parallel (megatron/core/parallel_state.py): dp = world / (tp * pp * cp).
    world = plan.gpus
    if world % (tp * pp * cp):
        raise Rejected(file, f"world size {world} is not divisible by tp*pp*cp = {tp * pp * cp}")
    dp = world // (tp * pp * cp)
    expect(file, "data-parallel size (world / (tp*pp*cp))", dp, plan.dp)
    ep = config.expert_model_parallel_size
    etp = config.expert_tensor_parallel_size or tp
    if plan.moe:
        expect(file, "expert_model_parallel_size", ep, plan.ep)
        expect(file, "expert_tensor_parallel_size", etp, plan.etp)
        expect(file, "num_moe_experts", config.num_moe_experts, plan.model["num_experts"])
        expect(file, "moe_router_topk", config.moe_router_topk, plan.model["experts_per_token"])
    # Batch: the constant microbatch calculator (megatron/core/num_microbatches_calculator.py).
    try:
        with quiet():
            calc = ConstantNumMicroBatchesCalculator(args["global_batch_size"], args["micro_batch_size"], dp, None, 0)
    except (AssertionError, KeyError) as e:
        raise Rejected(file, f"the microbatch calculator refuses the batch: {e}")
    expect(file, "micro_batch_size", args["micro_batch_size"], plan.mbs)
    expect(file, "global_batch_size", args["global_batch_size"], plan.gbs)
    expect(file, "number of microbatches", calc.get(), plan.microbatches)
    # ZeRO: distributed optimizer = optimizer states sharded; Megatron-FSDP's strategies
    # optim / optim_grads / optim_grads_params = ZeRO 1 / 2 / 3.
    strategies = {"no_shard": 0, "optim": 1, "optim_grads": 2, "optim_grads_params": 3}
    if ddp.use_megatron_fsdp:
        zero = strategies[ddp.data_parallel_sharding_strategy]
    else:
        zero = 1 if ddp.use_distributed_optimizer else 0
    expect(file, "sharding (distributed optimizer / Megatron-FSDP strategy as a ZeRO stage)", zero, plan.sharding())
    expect(file, "optimizer_cpu_offload", opt.optimizer_cpu_offload, plan.offload)
    expect(file, "recompute_granularity", config.recompute_granularity or "none", plan.recompute)
    precision = "fp8" if config.fp8 else "bf16" if config.bf16 else "fp16" if config.fp16 else "fp32"
    expect(file, "precision", precision, plan.precision)
    m = plan.model
    expect(file, "num_layers", config.num_layers, m["num_layers"])
    expect(file, "hidden_size", config.hidden_size, m["hidden_size"])
    expect(file, "num_attention_heads", config.num_attention_heads, m["num_heads"])
    expect(file, "num_query_groups", config.num_query_groups or config.num_attention_heads, m["num_kv_heads"])
    expect(file, "kv_channels", config.kv_channels, m["head_dim"])
    expect(file, "ffn_hidden_size", config.moe_ffn_hidden_size if plan.moe else config.ffn_hidden_size,
           m["ffn_hidden_size"])
    expect(file, "seq_length", args.get("seq_length"), plan.seq)
    # The layers each pipeline rank builds, per model chunk (transformer_block.py, transformer_layer.py).
    for pp_rank in range(pp):
        for vp in range(vpp):
            stage = vp if vpp > 1 else None
            built = get_num_layers_to_build(config, vp_stage=stage, pp_rank=pp_rank)
            offset = get_transformer_layer_offset(config, vp_stage=stage, pp_rank=pp_rank)
            expect(file, f"(first layer, layers) of pipeline rank {pp_rank} chunk {vp}", (offset, built),
                   plan.chunk(pp_rank, vp))
    # Rank groups: Megatron's two generators (parallel_state.initialize_model_parallel, order
    # tp-cp-ep-dp-pp) against the plan's coordinates.
    with quiet():
        decoder = RankGenerator(tp=tp, ep=1, dp=dp, pp=pp, cp=cp, order="tp-cp-ep-dp-pp")
    dense = ("tp", "cp", "dp", "pp")
    for dim in dense:
        expect(file, f"{dim} rank groups", sorted(decoder.get_ranks(dim)), plan.groups(dim, dense))
    if plan.moe:
        edp = world // (etp * ep * pp)
        with quiet():
            expert = RankGenerator(tp=etp, ep=ep, dp=edp, pp=pp, cp=1, order="tp-cp-ep-dp-pp")
        sparse = ("etp", "ep", "edp", "pp")
        for dim, name in (("etp", "tp"), ("ep", "ep"), ("edp", "dp")):
            expect(file, f"expert {name} rank groups", sorted(expert.get_ranks(name)), plan.groups(dim, sparse))
    # launch-megatron.sh: torchrun over the plan's nodes, pretrain_gpt.py with exactly these
    # arguments, and CUDA_DEVICE_MAX_CONNECTIONS as validate_args (core_v0.15.0) asserts it: 1 with
    # tp or cp > 1, and not 1 under Megatron-FSDP.
    script, rest, exported = check_torchrun_launch(export_dir, "launch-megatron.sh", plan,
                                                   ("CUDA_DEVICE_MAX_CONNECTIONS",))
    if not script.endswith("/pretrain_gpt.py"):
        raise Rejected("launch-megatron.sh", f"torchrun runs {script}, not $MEGATRON_LM/pretrain_gpt.py")
    tokens = [w for line in open(path) if line.strip() and not line.lstrip().startswith("#") for w in shlex.split(line)]
    if rest != tokens:
        raise Rejected("launch-megatron.sh", "does not pass pretrain_gpt.py the arguments of megatron.args as they are")
    connections = exported["CUDA_DEVICE_MAX_CONNECTIONS"]
    if ddp.use_megatron_fsdp and connections == "1":
        raise Rejected("launch-megatron.sh", "CUDA_DEVICE_MAX_CONNECTIONS=1 under Megatron-FSDP (validate_args asserts it is not 1)")
    if not ddp.use_megatron_fsdp and (tp > 1 or cp > 1) and connections != "1":
        raise Rejected("launch-megatron.sh", f"tp or cp > 1 with CUDA_DEVICE_MAX_CONNECTIONS={connections!r} "
                                             "(validate_args asserts 1)")
    print(f"megatron-core {version} accepted {file}: tp {tp} pp {pp} vpp {vpp} cp {cp} ep {ep} etp {etp} dp {dp} "
          f"zero {zero} mbs {args['micro_batch_size']} gbs {args['global_batch_size']} microbatches {calc.get()} "
          f"recompute {config.recompute_granularity or 'none'} {precision} offload {opt.optimizer_cpu_offload}; "
          f"layer split and {len(dense) + (3 if plan.moe else 0)} kinds of rank groups equal the plan's")


# ---------------------------------------------------------------------------------------------
# torchtitan
# ---------------------------------------------------------------------------------------------

HEAD_DIR_ENV = "DPLAN_TORCHTITAN_HEAD"


def torchtitan_view(job, plan, file):
    """What torchtitan makes of a parsed job config; shared by the TOML (0.2.2) and the overrides
    (0.3.0) checks. Returns a dict of the layout facts."""
    from torchtitan.distributed.parallel_dims import ParallelDims

    par, tr, ac = job.parallelism, job.training, job.activation_checkpoint
    degrees = dict(dp_shard=par.data_parallel_shard_degree, dp_replicate=par.data_parallel_replicate_degree,
                   cp=par.context_parallel_degree, tp=par.tensor_parallel_degree, pp=par.pipeline_parallel_degree,
                   ep=par.expert_parallel_degree, world_size=plan.gpus)
    # 0.3.0 has no expert tensor parallel degree (expert layers take tp): its ParallelDims has no etp.
    if "etp" in {f.name for f in dataclasses.fields(ParallelDims)}:
        degrees["etp"] = par.expert_tensor_parallel_degree
    try:
        with quiet():
            dims = ParallelDims(**degrees)
    except (AssertionError, ValueError) as e:
        raise Rejected(file, f"ParallelDims: {e}")
    # Batch (torchtitan/train.py, Trainer.__init__): global = local x (dp_replicate x dp_shard) x
    # gradient-accumulation steps; with pp the local batch runs as local / microbatch_size
    # microbatches (distributed/pipeline_parallel.py, build_pipeline_schedule).
    batch_degree = dims.dp_replicate * dims.dp_shard
    gbs = tr.global_batch_size if tr.global_batch_size > 0 else tr.local_batch_size * batch_degree
    if gbs % (tr.local_batch_size * batch_degree):
        raise Rejected(file, f"global batch {gbs} is not a multiple of local batch {tr.local_batch_size} x "
                             f"data-parallel degree {batch_degree} (train.py)")
    accumulation = gbs // (tr.local_batch_size * batch_degree)
    if dims.pp > 1:
        if tr.local_batch_size % par.pipeline_parallel_microbatch_size:
            raise Rejected(file, f"local batch {tr.local_batch_size} is not divisible by microbatch size "
                                 f"{par.pipeline_parallel_microbatch_size} (build_pipeline_schedule)")
        mbs = par.pipeline_parallel_microbatch_size
        microbatches = accumulation * (tr.local_batch_size // mbs)
    else:
        mbs, microbatches = tr.local_batch_size, accumulation
    if dims.dp_shard > 1:
        zero = {"always": 3, "never": 2, "default": 3}[par.fsdp_reshard_after_forward]
    else:
        zero = 0
    precision = {"bfloat16": "bf16", "float32": "fp32", "float16": "fp16"}[tr.mixed_precision_param]
    model = getattr(job, "model", None)
    if "float8" in (getattr(model, "converters", None) or []):
        precision = "fp8"
    # 0.2.2: activation_checkpoint.mode; 0.3.0: a config class per kind (FullAC.Config,
    # SelectiveAC.Config, ...) or None (torchtitan/distributed/activation_checkpoint.py).
    if hasattr(ac, "mode"):
        recompute = ac.mode
    elif ac is None:
        recompute = "none"
    else:
        kind = type(ac).__qualname__.split(".")[0]
        recompute = {"FullAC": "full", "SelectiveAC": "selective", "MemoryBudgetAC": "memory_budget"}.get(kind, kind)
    return dict(tp=dims.tp, pp=dims.pp, cp=dims.cp, ep=dims.ep, etp=getattr(dims, "etp", dims.tp), dp=batch_degree, zero=zero,
                mbs=mbs, gbs=gbs, microbatches=microbatches, recompute=recompute, precision=precision,
                offload=tr.enable_cpu_offload, seq=tr.seq_len)


def torchtitan_expect(file, view, plan):
    for key, want in (("tp", plan.tp), ("pp", plan.pp), ("cp", plan.cp), ("dp", plan.dp), ("mbs", plan.mbs),
                      ("gbs", plan.gbs), ("microbatches", plan.microbatches), ("recompute", plan.recompute),
                      ("precision", plan.precision), ("offload", plan.offload), ("seq", plan.seq)):
        expect(file, key, view[key], want)
    # FSDP is ZeRO-3 (reshard after forward) or ZeRO-2 (keep); torchtitan has no ZeRO-1.
    expect(file, "sharding as a ZeRO stage", view["zero"], plan.zero)
    if plan.moe:
        expect(file, "ep", view["ep"], plan.ep)
        expect(file, "etp", view["etp"], plan.etp)


def check_torchtitan(plan, export_dir):
    version = engine_version("torchtitan")
    file = "torchtitan.toml"
    path = os.path.join(export_dir, file)
    comment_header(path, "torchtitan")
    with quiet():
        from torchtitan.config import ConfigManager
        from torchtitan.distributed.pipeline_parallel import generate_llm_fqn_per_model_part
        from torch.distributed.pipelining.schedules import PipelineScheduleSingle, get_schedule_class
    try:
        with quiet():
            job = ConfigManager().parse_args(["--job.config_file", path])
    except (ValueError, TypeError, SystemExit, Exception) as e:  # tyro exits on a bad key
        raise Rejected(file, f"ConfigManager.parse_args: {type(e).__name__}: {e}")
    view = torchtitan_view(job, plan, file)
    torchtitan_expect(file, view, plan)
    par = job.parallelism
    # Pipeline split (pipeline_parallel.py, pipeline_llm): virtual stages from layers_per_stage,
    # stage i of the looped schedule on rank i % pp; each stage's layers from
    # generate_llm_fqn_per_model_part.
    layers = plan.model["num_layers"]
    stages_per_rank = 1
    if par.pipeline_parallel_degree > 1:
        schedule = get_schedule_class(par.pipeline_parallel_schedule)
        single = issubclass(schedule, PipelineScheduleSingle)
        first, last = par.pipeline_parallel_first_stage_less_layers, par.pipeline_parallel_last_stage_less_layers
        if par.pipeline_parallel_layers_per_stage is not None:
            stages = -(-(layers + first + last) // par.pipeline_parallel_layers_per_stage)
        else:
            stages = par.pipeline_parallel_degree * (1 if single else 2)
        if stages % par.pipeline_parallel_degree:
            raise Rejected(file, f"{stages} virtual stages are not divisible by pp {par.pipeline_parallel_degree}")
        stages_per_rank = stages // par.pipeline_parallel_degree
        if single != (stages_per_rank == 1):
            raise Rejected(file, f"schedule {par.pipeline_parallel_schedule} with {stages_per_rank} stages per rank "
                                 "(pipeline_llm refuses it)")
        try:
            parts = generate_llm_fqn_per_model_part(stages, layers, first, last)
        except ValueError as e:
            raise Rejected(file, f"generate_llm_fqn_per_model_part: {e}")
        for s, names in enumerate(parts):
            ids = [int(n.split(".")[1]) for n in names if n.startswith("layers.")]
            got = (ids[0] if ids else None, len(ids))
            want = plan.chunk(s % par.pipeline_parallel_degree, s // par.pipeline_parallel_degree)
            expect(file, f"(first layer, layers) of virtual stage {s}", got if ids else (want[0], 0), want)
    expect(file, "stages per pipeline rank (vpp)", stages_per_rank, plan.vpp)
    check_torchtitan_model(job, plan, path, file)
    script, rest, _ = check_torchrun_launch(export_dir, "launch-torchtitan.sh", plan)
    if script != "torchtitan.train" or len(rest) < 2 or rest[0] != "--job.config_file" or \
            os.path.realpath(rest[1]) != os.path.realpath(path):
        raise Rejected("launch-torchtitan.sh", f"runs {script} {' '.join(rest[:2])}, not -m torchtitan.train "
                                               "--job.config_file with this torchtitan.toml")
    print(f"torchtitan {version} accepted {file}: tp {view['tp']} pp {view['pp']} vpp {stages_per_rank} cp {view['cp']} "
          f"ep {view['ep']} etp {view['etp']} dp {view['dp']} zero {view['zero']} local/micro batch {view['mbs']} "
          f"gbs {view['gbs']} microbatches {view['microbatches']} recompute {view['recompute']} {view['precision']} "
          f"offload {view['offload']}; ParallelDims({plan.gpus}) and the stage split agree with the plan")
    check_torchtitan_overrides(plan, export_dir, view)


def check_torchtitan_model(job, plan, path, file):
    """The model the job names: a llama3 flavor torchtitan ships, or the "dplan" flavor whose
    TransformerModelArgs the file's comment gives; built on the meta device by torchtitan."""
    import torch
    from torchtitan.models.llama3 import llama3_args
    from torchtitan.models.llama3.model.args import TransformerModelArgs
    from torchtitan.models.llama3.model.model import Transformer

    if job.model.name != "llama3":
        raise Rejected(file, f"model.name {job.model.name!r}: the checks know torchtitan's llama3 only")
    flavor = job.model.flavor
    if flavor in llama3_args:
        args = llama3_args[flavor]
    else:
        found = re.search(r"TransformerModelArgs\((.*)\)", open(path).read())
        if not found:
            raise Rejected(file, f"flavor {flavor!r} is no llama3 flavor and the file gives no TransformerModelArgs")
        try:
            args = eval("TransformerModelArgs(" + found.group(1) + ")", {"TransformerModelArgs": TransformerModelArgs})
        except Exception as e:
            raise Rejected(file, f"TransformerModelArgs({found.group(1)}): {e}")
    with torch.device("meta"):
        model = Transformer(args)
    m = plan.model
    block = model.layers["0"]
    expect(file, "n_layers", len(model.layers), m["num_layers"])
    expect(file, "dim", args.dim, m["hidden_size"])
    expect(file, "n_heads", args.n_heads, m["num_heads"])
    expect(file, "n_kv_heads", args.n_kv_heads or args.n_heads, m["num_kv_heads"])
    expect(file, "FFN width (feed_forward.w1 rows)", block.feed_forward.w1.weight.shape[0], m["ffn_hidden_size"])
    expect(file, "vocab_size", args.vocab_size, m["vocab_size"])
    if plan.tp > 1 and args.n_kv_heads and args.n_kv_heads % plan.tp:
        raise Rejected(file, f"torchtitan's tensor parallel needs tp {plan.tp} to divide n_kv_heads {args.n_kv_heads}")


def check_torchtitan_overrides(plan, export_dir, toml_view):
    """torchtitan.overrides under torchtitan 0.3.0's ConfigManager (a child python with the apart
    install first on its path): the same view as the TOML's."""
    file = "torchtitan.overrides"
    path = os.path.join(export_dir, file)
    comment_header(path, "torchtitan")
    head = os.environ.get(HEAD_DIR_ENV) or os.path.join(os.path.dirname(os.path.dirname(sys.executable)),
                                                          "engines", "torchtitan-head")
    if not os.path.isdir(os.path.join(head, "torchtitan")):
        print(f"check_export: torchtitan 0.3.0 is not at {head}; {HINT}")
        sys.exit(1)
    env = dict(os.environ, PYTHONPATH=head + os.pathsep + os.environ.get("PYTHONPATH", ""))
    child = subprocess.run([sys.executable, os.path.abspath(__file__), "--torchtitan-head-view", path,
                            "--plan", plan.path], env=env, capture_output=True, text=True)
    if child.returncode != 0:
        lines = [l for l in (child.stdout + child.stderr).splitlines() if l.strip()]
        raise Rejected(file, lines[-1] if lines else f"exit status {child.returncode}", engine="torchtitan 0.3.0")
    out = child.stdout.strip().splitlines()[-1]
    version, view = out.split(" ", 1)
    view = json.loads(view)
    for key, value in toml_view.items():
        if key in ("ep", "etp") and not plan.moe:
            continue
        try:
            expect(file, f"{key} (against the 0.2.2 TOML's)", view[key], value)
        except Rejected as e:
            raise Rejected(file, e.why, engine=f"torchtitan {version}")
    print(f"torchtitan {version} accepted {file}: the overrides give the TOML's layout")


def torchtitan_head_view(path, plan):
    """Runs in the child: parse the overrides with torchtitan 0.3.0 (config classes, --module/--config
    pick a base config; the overrides set the rest) and print the version and the view."""
    from importlib.metadata import version as pkg_version

    import torchtitan

    tokens = []
    for line in open(path):
        line = line.strip()
        if line and not line.startswith("#"):
            tokens += shlex.split(line)
    with quiet():
        from torchtitan.config import ConfigManager
    buffer = io.StringIO()
    try:
        with warnings.catch_warnings(), contextlib.redirect_stdout(buffer), contextlib.redirect_stderr(buffer):
            warnings.simplefilter("ignore")
            job = ConfigManager().parse_args(["--module", "llama3", "--config", "llama3_debugmodel"] + tokens)
    except (SystemExit, Exception) as e:
        # tyro prints its verdict in a box and exits: keep the box's text lines, on one line.
        said = []
        for line in buffer.getvalue().splitlines():
            line = line.strip(" |│╭╮╰╯")
            if len(said) >= 2 and line and set(line) <= set("-─"):
                break  # the verdict ends where tyro's suggestions begin
            line = line.strip("-─ ")
            if line and "has no effect" not in line:
                said.append(line)
        print(f"ConfigManager.parse_args: {' '.join(said) or type(e).__name__ + ': ' + str(e)}")
        sys.exit(1)
    try:
        view = torchtitan_view(job, plan, os.path.basename(path))
    except Rejected as e:
        print(e.why)
        sys.exit(1)
    head_version = pkg_version("torchtitan")
    if not torchtitan.__file__.startswith(os.environ.get("PYTHONPATH", "").split(os.pathsep)[0]):
        print(f"the child imported torchtitan from {torchtitan.__file__}, not the apart install")
        sys.exit(1)
    print(head_version, json.dumps(view))


# ---------------------------------------------------------------------------------------------
# DeepSpeed
# ---------------------------------------------------------------------------------------------

_deepspeed_ready = False


def deepspeed_config(path, dp):
    """DeepSpeedConfig with a data-parallel size of `dp`: a one-process gloo group for
    deepspeed.comm, and an mpu that reports dp (deepspeed/runtime/config.py takes the batch
    assertion's world size from mpu.get_data_parallel_world_size())."""
    global _deepspeed_ready
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    with quiet():
        import deepspeed
        import deepspeed.comm
        from deepspeed.runtime.config import DeepSpeedConfig
        if not _deepspeed_ready:
            import socket

            with socket.socket() as s:
                s.bind(("127.0.0.1", 0))
                port = s.getsockname()[1]
            os.environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
            deepspeed.init_distributed(dist_backend="gloo", verbose=False)
            _deepspeed_ready = True

    class Mpu:
        def get_data_parallel_world_size(self):
            return dp

        def get_data_parallel_rank(self):
            return 0

    with quiet():
        return DeepSpeedConfig(path, mpu=Mpu())


def deepspeed_view(config):
    zero = config.zero_optimization_stage if config.zero_enabled else 0
    offload = config.zero_config.offload_optimizer
    precision = "bf16" if config.bfloat16_config.enabled else "fp16" if config.float16_config.enabled else "fp32"
    return dict(gbs=config.train_batch_size, mbs=config.train_micro_batch_size_per_gpu,
                accumulation=config.gradient_accumulation_steps, zero=int(zero), precision=precision,
                offload=offload is not None and str(getattr(offload.device, "value", offload.device)) == "cpu",
                clipping=config.gradient_clipping)


def deepspeed_expect(file, view, plan):
    expect(file, "train_batch_size", view["gbs"], plan.gbs)
    expect(file, "train_micro_batch_size_per_gpu", view["mbs"], plan.mbs)
    expect(file, "gradient_accumulation_steps", view["accumulation"], plan.microbatches)
    expect(file, "zero_optimization.stage", view["zero"], plan.sharding())
    expect(file, "offload_optimizer to cpu", view["offload"], plan.offload)
    expect(file, "precision", view["precision"], "bf16" if plan.precision == "fp8" else plan.precision)
    if not view["clipping"]:
        raise Rejected(file, "gradient_clipping is 0 (deepspeed/runtime/constants.py GRADIENT_CLIPPING_DEFAULT: no clipping; the docs say 1.0)")


def check_deepspeed(plan, export_dir):
    version = engine_version("deepspeed")
    file = "ds_config.json"
    path = os.path.join(export_dir, file)
    try:
        config = deepspeed_config(path, plan.dp)
    except (AssertionError, ValueError, KeyError, TypeError) as e:
        raise Rejected(file, f"DeepSpeedConfig: {type(e).__name__}: {e}")
    view = deepspeed_view(config)
    deepspeed_expect(file, view, plan)
    launch = os.path.join(export_dir, "launch-deepspeed.sh")
    if not os.access(launch, os.X_OK):
        raise Rejected("launch-deepspeed.sh", "missing or not executable")
    comment_header(launch, "deepspeed")  # JSON has no comments: the script and README.export say the version
    print(f"deepspeed {version} accepted {file} with data-parallel size {plan.dp}: zero {view['zero']} "
          f"mbs {view['mbs']} gas {view['accumulation']} train_batch_size {view['gbs']} {view['precision']} "
          f"offload {view['offload']} clipping {view['clipping']}")


# ---------------------------------------------------------------------------------------------
# Accelerate
# ---------------------------------------------------------------------------------------------


def launch_arguments(export_dir, script, program, env_names=()):
    """The arguments `script` hands `program` (and the values of `env_names` it exports): the
    script runs with a stand-in for `program` first on PATH, from another directory (so that a
    path relative to the working directory shows), with TRAIN_SCRIPT=train.py."""
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        shim = os.path.join(tmp, program)
        out = os.path.join(tmp, "args")
        with open(shim, "w") as f:
            f.write("#!/usr/bin/env bash\n{ printf '%s\\0' \"$@\"; printf '\\1'; ")
            for name in env_names:
                f.write(f"printf '%s\\0' \"${{{name}:-}}\"; ")
            f.write(f"}} > {shlex.quote(out)}\n")
        os.chmod(shim, 0o755)
        # A multi-node script asks which node it runs on: node 0 of a job whose first node is here.
        env = dict(os.environ, PATH=tmp + os.pathsep + os.environ["PATH"], TRAIN_SCRIPT="train.py", NODE_RANK="0",
                   MASTER_ADDR="127.0.0.1", MEGATRON_LM="/megatron-lm")
        run = subprocess.run(["bash", os.path.join(os.path.abspath(export_dir), script)], cwd=tmp, env=env,
                             capture_output=True, text=True)
        if run.returncode != 0 or not os.path.exists(out):
            said = run.stderr.strip().splitlines()
            raise Rejected(script, f"exit {run.returncode} before starting {program}: {said[-1] if said else ''}",
                           engine="bash")
        args, exported = open(out).read().split("\1")
        return args.split("\0")[:-1], dict(zip(env_names, exported.split("\0")))


def check_accelerate(plan, export_dir):
    version = engine_version("accelerate")
    file = "accelerate.yaml"
    path = os.path.join(export_dir, file)
    comment_header(path, "accelerate")
    with quiet():
        from accelerate.commands.launch import _validate_launch_command, launch_command_parser
        from accelerate.utils import DistributedType
        from accelerate.utils.launch import prepare_deepspeed_cmd_env, prepare_multi_gpu_env
    # What launch-accelerate.sh passes `accelerate launch`, parsed by accelerate's own parser.
    argv, exported = launch_arguments(export_dir, "launch-accelerate.sh", "accelerate",
                                      ("ACCELERATE_GRADIENT_ACCUMULATION_STEPS",))
    if argv[:1] != ["launch"] or "--config_file" not in argv:
        raise Rejected("launch-accelerate.sh", f"runs `accelerate {' '.join(argv)}`, not `accelerate launch --config_file ...`")
    parser = launch_command_parser()
    try:
        with quiet():
            args = parser.parse_args(argv[1:])
            args, defaults, mp_from_config_flag = _validate_launch_command(args)
    except (ValueError, TypeError, KeyError, SystemExit, FileNotFoundError) as e:
        raise Rejected(file, f"accelerate launch: {type(e).__name__}: {e}")
    if os.path.realpath(args.config_file) != os.path.realpath(path):
        raise Rejected("launch-accelerate.sh", f"passes --config_file {args.config_file}, not {path}")
    kind = defaults.distributed_type
    expect(file, "num_processes", args.num_processes, plan.gpus)
    expect(file, "num_machines", args.num_machines, plan.nodes)
    try:
        with quiet():
            if kind == DistributedType.DEEPSPEED:
                # As launch_command does (accelerate/commands/launch.py).
                fields = list(defaults.deepspeed_config.keys()) + (["mixed_precision"] if mp_from_config_flag else [])
                args.deepspeed_fields_from_accelerate_config = ",".join(fields)
                _, env = prepare_deepspeed_cmd_env(args)
            else:
                env = prepare_multi_gpu_env(args)
    except (ValueError, TypeError, KeyError, AssertionError, AttributeError) as e:
        raise Rejected(file, f"accelerate's launcher environment (accelerate/utils/launch.py): {type(e).__name__}: {e}")
    view = dict(tp=1, cp=1, dp=plan.gpus, zero=0, recompute="none")
    saved = dict(os.environ)
    os.environ.update(env)
    try:
        with quiet():
            from accelerate.parallelism_config import ParallelismConfig
            from accelerate.utils import DeepSpeedPlugin, FullyShardedDataParallelPlugin
            if env.get("ACCELERATE_USE_PARALLELISM_CONFIG", "false") == "true" or defaults.parallelism_config:
                pc = ParallelismConfig()
                view.update(tp=pc.tp_size, cp=pc.cp_size, dp=pc.dp_replicate_size * pc.dp_shard_size)
                if pc.total_size != plan.gpus:
                    raise Rejected(file, f"ParallelismConfig total_size {pc.total_size} != num_processes {plan.gpus}")
            if kind == DistributedType.FSDP:
                fsdp = FullyShardedDataParallelPlugin()
                expect(file, "fsdp_version", fsdp.fsdp_version, 2)
                view["zero"] = 3 if fsdp.reshard_after_forward in (True, "FULL_SHARD") else 2
                view["recompute"] = "full" if fsdp.activation_checkpointing else "none"
                from torch.distributed.fsdp import CPUOffloadPolicy

                view["offload"] = isinstance(fsdp.cpu_offload, CPUOffloadPolicy)
            elif kind == DistributedType.DEEPSPEED:
                # The plugin reads the file the launcher names and fills its "auto" precision from
                # mixed_precision, as AcceleratorState does (state.py); DeepSpeed then checks the result.
                plugin = DeepSpeedPlugin()
                plugin.set_mixed_precision(str(args.mixed_precision))
                engine_version("deepspeed")
                dsv = deepspeed_view(deepspeed_config(dict(plugin.deepspeed_config), plan.dp))
                deepspeed_expect("ds_config.json (through Accelerate's DeepSpeedPlugin)", dsv, plan)
                view["zero"] = dsv["zero"]
                # AcceleratorState.mixed_precision under DeepSpeed is the config's (state.py): fp16,
                # else bf16 when enabled, else no.
                config = plugin.deepspeed_config
                enabled = lambda key: str(config.get(key, {}).get("enabled", False)).lower() == "true"
                view["mixed_precision"] = "fp16" if enabled("fp16") else "bf16" if enabled("bf16") else "no"
            elif kind != DistributedType.MULTI_GPU:
                raise Rejected(file, f"distributed_type {kind}: the checks know MULTI_GPU, FSDP and DEEPSPEED")
    except (ValueError, TypeError, KeyError, AssertionError) as e:
        raise Rejected(file, f"{type(e).__name__}: {e}")
    finally:
        os.environ.clear()
        os.environ.update(saved)
    mixed = {"no": "fp32", "bf16": "bf16", "fp16": "fp16", "fp8": "fp8"}.get(view.get("mixed_precision", str(args.mixed_precision)))
    for key, want in (("tp", plan.tp), ("cp", plan.cp), ("dp", plan.dp), ("zero", plan.sharding())):
        expect(file, key, view[key], want)
    # The YAML's mixed_precision, or with DeepSpeed ds_config.json's (accelerate refuses the YAML's
    # beside a deepspeed_config_file: accelerate/utils/dataclasses.py _deepspeed_config_checks).
    expect(file, "mixed_precision", mixed, "bf16" if plan.precision == "fp8" else plan.precision)
    if kind == DistributedType.FSDP:
        expect(file, "fsdp_offload_params", view["offload"], False if not plan.offload else True)
        expect(file, "fsdp_activation_checkpointing", view["recompute"],
               plan.recompute if plan.recompute != "selective" else "full")
    accumulation = "from ds_config.json"
    if kind != DistributedType.DEEPSPEED:
        # Accelerator() takes ACCELERATE_GRADIENT_ACCUMULATION_STEPS (accelerator.py, parse_choice_from_env).
        accumulation = exported.get("ACCELERATE_GRADIENT_ACCUMULATION_STEPS") or "1"
        expect("launch-accelerate.sh", "ACCELERATE_GRADIENT_ACCUMULATION_STEPS", int(accumulation), plan.microbatches)
    print(f"accelerate {version} accepted {file} (as launch-accelerate.sh passes it): {kind.value} processes "
          f"{args.num_processes} machines {args.num_machines} tp {view['tp']} cp {view['cp']} dp {view['dp']} "
          f"zero {view['zero']} mixed_precision {view.get('mixed_precision', args.mixed_precision)} gradient accumulation {accumulation}")


CHECKS = {"megatron": check_megatron, "torchtitan": check_torchtitan, "deepspeed": check_deepspeed,
          "accelerate": check_accelerate}
PACKAGE = {"megatron": "megatron-core", "torchtitan": "torchtitan", "deepspeed": "deepspeed", "accelerate": "accelerate"}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--engine", choices=sorted(CHECKS))
    parser.add_argument("--plan", required=True)
    parser.add_argument("--dir")
    parser.add_argument("--torchtitan-head-view", help=argparse.SUPPRESS)
    parser.add_argument("--engines-installed", action="store_true",
                        help="exit 0 when every pinned engine is installed, else say how to install them")
    if "--engines-installed" in sys.argv[1:]:
        for package in PINS:
            engine_version(package)
        head = os.path.join(os.path.dirname(os.path.dirname(sys.executable)), "engines", "torchtitan-head")
        if not os.path.isdir(os.path.join(os.environ.get(HEAD_DIR_ENV) or head, "torchtitan")):
            print(f"check_export: torchtitan 0.3.0 is not at {head}; {HINT}")
            sys.exit(1)
        print("check_export: " + ", ".join(f"{p} {v}" for p, v in PINS.items()) + " installed")
        return
    a = parser.parse_args()
    try:
        plan = Plan(a.plan)
    except (OSError, ValueError, KeyError) as e:
        print(f"check_export: {a.plan}: not a readable plan ({e})", file=sys.stderr)
        sys.exit(2)
    plan.path = a.plan
    if a.torchtitan_head_view:
        torchtitan_head_view(a.torchtitan_head_view, plan)
        return
    if not a.engine or not a.dir:
        parser.error("--engine and --dir are required")
    if not os.path.isdir(a.dir):
        print(f"check_export: {a.dir}: no such export directory", file=sys.stderr)
        sys.exit(2)
    try:
        CHECKS[a.engine](plan, a.dir)
    except Rejected as e:
        from importlib.metadata import version

        engine = e.engine or f"{PACKAGE[a.engine]} {version(PACKAGE[a.engine])}"
        print(f"{engine} rejected {e.file} ({a.dir}): {e.why}")
        sys.exit(1)
    except ImportError as e:
        print(f"check_export: {a.engine} does not import ({e}); {HINT}")
        sys.exit(1)


if __name__ == "__main__":
    main()
