"""Trains the tiny model under `accelerate launch` (started by the exported launch-accelerate.sh).

    TRAIN_SCRIPT=tiny_train_accelerate.py launch-accelerate.sh STEPS

Prints Accelerate's own view (distributed type, processes, gradient accumulation, which it reads
from ACCELERATE_GRADIENT_ACCUMULATION_STEPS), then one line per optimizer step; exits 1 when the
loss did not fall."""
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import accelerate  # noqa: E402
from accelerate import Accelerator  # noqa: E402
from tiny_model import TinyLM, batch, loss_of  # noqa: E402

steps = int(sys.argv[1])
acc = Accelerator()
torch.manual_seed(0)
model = TinyLM()
optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
model, optimizer = acc.prepare(model, optimizer)
accumulation = acc.gradient_accumulation_steps
acc.print(f"accelerate {accelerate.__version__}: {acc.distributed_type.value} processes {acc.num_processes} "
          f"gradient accumulation {accumulation} mixed_precision {acc.mixed_precision} device {acc.device}",
          flush=True)
losses, micro = [], 0
for step in range(steps):
    total = 0.0
    for _ in range(accumulation):
        tokens, targets = batch(micro, acc.process_index, 1)
        micro += 1
        with acc.accumulate(model):
            loss = loss_of(model(tokens), targets)
            acc.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
        total += loss.item() / accumulation
    losses.append(total)
    acc.print(f"step {step + 1}/{steps} loss {total:.4f}", flush=True)
if losses[-1] >= losses[0]:
    print(f"rank {acc.process_index}: the loss did not fall ({losses[0]:.4f} -> {losses[-1]:.4f})", flush=True)
    sys.exit(1)
# Every rank past its last collective before any tears the process group down: without this,
# Gloo under PyTorch 2.15 now and then aborts a rank at exit (SIGABRT, "terminate called without
# an active exception"; the launcher then exits 250, that is -6), after the steps have printed.
# bench/torch_gpt.py's shut_down does the same.
if torch.distributed.is_initialized():
    torch.distributed.barrier()
    torch.distributed.destroy_process_group()
