"""Trains the tiny model with DeepSpeed on CPU (gloo) under the exported ds_config.json, started
by the exported launch-deepspeed.sh (the `deepspeed` launcher passes --local_rank, the script
--deepspeed --deepspeed_config):

    LOCAL_SIZE=2 DS_ACCELERATOR=cpu TRAIN_SCRIPT=tiny_train_deepspeed.py launch-deepspeed.sh --steps 4

(LOCAL_SIZE: how many CPU "devices" DeepSpeed's CPU accelerator reports to the launcher.) Prints
DeepSpeed's own view of the batch and ZeRO stage, then one line per optimizer step; exits 1 when
the loss did not fall."""
import argparse
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import deepspeed  # noqa: E402
from tiny_model import TinyLM, batch, loss_of  # noqa: E402

parser = argparse.ArgumentParser()
parser.add_argument("--local_rank", "--local-rank", type=int, default=-1)
parser.add_argument("--steps", type=int, default=4)
parser = deepspeed.add_config_arguments(parser)
args = parser.parse_args()
config_path, steps = args.deepspeed_config, args.steps
if not args.deepspeed or not config_path:
    sys.exit("tiny_train_deepspeed.py: needs --deepspeed --deepspeed_config FILE (launch-deepspeed.sh passes them)")
deepspeed.init_distributed(dist_backend="gloo")
config = json.load(open(config_path))
torch.manual_seed(0)
model = TinyLM()
offload = config.get("zero_optimization", {}).get("offload_optimizer", {}).get("device", "none") == "cpu"
if offload:
    # ZeRO-Offload refuses a client torch optimizer (engine.py _configure_optimizer): its own CPU Adam.
    from deepspeed.ops.adam import DeepSpeedCPUAdam

    optimizer = DeepSpeedCPUAdam(model.parameters(), lr=3e-3)
else:
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
engine, _, _, _ = deepspeed.initialize(model=model, optimizer=optimizer, config=config_path)
rank = engine.global_rank
dtype = torch.bfloat16 if engine.bfloat16_enabled() else torch.half if engine.fp16_enabled() else torch.float32
if rank == 0:
    print(f"deepspeed {deepspeed.__version__}: world {engine.world_size} zero {engine.zero_optimization_stage()} "
          f"micro {engine.train_micro_batch_size_per_gpu()} accumulation {engine.gradient_accumulation_steps()} "
          f"train_batch_size {engine.train_batch_size()} dtype {dtype} offload {offload}", flush=True)
losses = []
micro = 0
for step in range(steps):
    total = 0.0
    for _ in range(engine.gradient_accumulation_steps()):
        tokens, targets = batch(micro, rank, engine.train_micro_batch_size_per_gpu())
        micro += 1
        loss = loss_of(engine(tokens), targets)
        engine.backward(loss)
        engine.step()
        total += loss.item() / engine.gradient_accumulation_steps()
    losses.append(total)
    if rank == 0:
        print(f"step {step + 1}/{steps} loss {total:.4f}", flush=True)
if losses[-1] >= losses[0]:
    print(f"rank {rank}: the loss did not fall ({losses[0]:.4f} -> {losses[-1]:.4f})", flush=True)
    sys.exit(1)
# Every rank past its last collective before any tears the process group down: without this,
# Gloo under PyTorch 2.15 now and then aborts a rank at exit (SIGABRT, "terminate called without
# an active exception"; the launcher then exits 250, that is -6), after the steps have printed.
# bench/torch_gpt.py's shut_down does the same.
if torch.distributed.is_initialized():
    torch.distributed.barrier()
    torch.distributed.destroy_process_group()
