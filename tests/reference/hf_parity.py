#!/usr/bin/env python3
"""dplan's executor against Hugging Face's own implementation of each model family.

For a family, a tiny config.json: transformers builds the model (seeded random weights, every
parameter drawn, biases and norm scales included, so that each tensor's mapping is exercised) and
saves it as safetensors; `dplan estimate` plans one rank for that config.json, `dplan run
--init-from` starts from the saved weights and trains --steps steps, writing its batches
(--save-reference) and its losses and gradient norms (run.json). The same steps in transformers'
model, fp32: the mean cross-entropy of its logits over the same tokens, the gradient's global norm,
the executor's clipping and AdamW (bench/torch_gpt.py's, which the existing parity tests use).

Checked: step 1's loss within 1e-5 relative and its logits within 1e-5 of the largest logit (the
forward), step 1's gradient norm and every checkpoint tensor's gradient within 1e-4 relative (the
backward: the one-rank run writes them under the checkpoint's names, dplan run --save-reference
with --init-from; tensors transformers holds fused in memory by their joint norm), and every
step's loss within 1e-4 (training). Prints one JSON line per family. DeepSeek-V3's multi-token
prediction, which transformers does not build, is made of transformers' own layers and the paper's
equations (deepseek_v3_mtp: hf_mtp_model, mtp_forward); its gradients reach every tensor compared.
With --layout FLAGS, dplan's run uses that layout instead (e.g. "--tp 2"), compared the same way.
DPLAN_HF_PERTURB=NAME moves one of transformers' parameters by 1e-3 (the check then fails).

    hf_parity.py DPLAN WORKDIR FAMILY [--steps 5] [--layout "--tp 2"]

Exit status: 0 when every check holds, 1 when one fails, 2 on bad usage or a missing package.
"""

import argparse
import json
import math
import os
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "bench"))

try:
    import torch
    import torch.nn.functional as F
    import transformers
    from torch_gpt import adamw, clip_global_norm, read_safetensors
except ImportError as e:  # the engines' environment has them: scripts/torch-venv.sh --engines
    print(f"hf_parity: {e}; make the environment with scripts/torch-venv.sh --engines", file=sys.stderr)
    sys.exit(2)

SEQ, BATCH = 32, 4

# Tiny configs, one per family, each exercising what sets the family apart: grouped-query
# attention, an untied head, a rotary base and norm epsilon away from the defaults, Qwen2's q/k/v
# biases, Qwen3's q/k norms and explicit head_dim, Mixtral's and Qwen3-MoE's routers and experts,
# Qwen2-MoE's dense layer and gated shared expert,
# GPT-2's Conv1D, learned positions and gelu_new; sliding windows shorter than the 32-token
# sequence (Mistral's on every layer, Qwen2's from max_window_layers on, gpt-oss's on its even
# layers); Llama 3.1's and YaRN's scaled rotary; Nemotron's squared ReLU, LayerNorm1P and partial
# rotary; GPT-NeoX's fused per-head QKV, partial rotary and parallel residual; gpt-oss's sinks,
# biased router and experts (stacked, gate and up interleaved) and a clamped SwiGLU that clamps;
# DeepSeek-V2's and V3's latent attention and grouped routing.
COMMON = {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
          "intermediate_size": 128, "vocab_size": 256, "max_position_embeddings": 64,
          "rms_norm_eps": 1e-5, "rope_theta": 50000.0, "tie_word_embeddings": False, "attention_dropout": 0.0}
CONFIGS = {
    "llama": dict(COMMON, model_type="llama", architectures=["LlamaForCausalLM"]),
    # Llama 3.1's rope_scaling at a small original context, so that all three frequency bands occur
    # (head_dim 16, base 5e4: wavelengths 6.3, 25, 97, ... against 16 / 4 and 16 / 1).
    "llama_rope_llama3": dict(COMMON, model_type="llama", architectures=["LlamaForCausalLM"],
                              rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                            "high_freq_factor": 4.0, "original_max_position_embeddings": 16}),
    "llama_rope_yarn": dict(COMMON, model_type="llama", architectures=["LlamaForCausalLM"],
                            rope_scaling={"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16,
                                          "beta_fast": 8.0, "beta_slow": 1.0}),
    "mistral": dict(COMMON, model_type="mistral", architectures=["MistralForCausalLM"], sliding_window=8),
    "qwen2": dict(COMMON, model_type="qwen2", architectures=["Qwen2ForCausalLM"], tie_word_embeddings=True,
                  use_sliding_window=True, sliding_window=8, max_window_layers=1),
    "qwen3": dict(COMMON, model_type="qwen3", architectures=["Qwen3ForCausalLM"], head_dim=32),
    # Mixtral: top-2 of 4 experts; output_router_logits false, so neither side adds the balance loss.
    "mixtral": dict(COMMON, model_type="mixtral", architectures=["MixtralForCausalLM"], num_local_experts=4,
                    num_experts_per_tok=2, output_router_logits=False, router_jitter_noise=0.0),
    # Qwen3-MoE: q/k norms and top-2 of 4 experts, norm_topk_prob false (its default): the top-k
    # softmax probabilities are not renormalised.
    "qwen3_moe": dict(COMMON, model_type="qwen3_moe", architectures=["Qwen3MoeForCausalLM"], head_dim=32,
                      num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32, norm_topk_prob=False,
                      output_router_logits=False),
    # Qwen2-MoE: a dense first layer (mlp_only_layers), then top-2 of 4 experts beside a gated
    # shared expert.
    "qwen2_moe": dict(COMMON, model_type="qwen2_moe", architectures=["Qwen2MoeForCausalLM"], num_experts=4,
                      num_experts_per_tok=2, moe_intermediate_size=32, shared_expert_intermediate_size=48,
                      mlp_only_layers=[0], decoder_sparse_step=1, norm_topk_prob=False, output_router_logits=False),
    "nemotron": dict({k: v for k, v in COMMON.items() if k != "rms_norm_eps"}, model_type="nemotron", architectures=["NemotronForCausalLM"], hidden_act="relu2",
                     norm_eps=1e-5, partial_rotary_factor=0.5, attention_bias=False, mlp_bias=False),
    "gpt_neox": {"model_type": "gpt_neox", "architectures": ["GPTNeoXForCausalLM"], "hidden_size": 64,
                 "num_hidden_layers": 2, "num_attention_heads": 4, "intermediate_size": 128, "vocab_size": 256,
                 "max_position_embeddings": 64, "rotary_pct": 0.25, "rotary_emb_base": 50000,
                 "use_parallel_residual": True, "layer_norm_eps": 1e-5, "hidden_act": "gelu",
                 "attention_dropout": 0.0, "hidden_dropout": 0.0, "tie_word_embeddings": False},
    # gpt-oss: top-2 of 4 biased experts, swiglu_limit 0.7 so that both clamps cut (on about 8 % of
    # the values) while no pre-activation of step 1 lies within 4e-5 of a clamp (at 0.5 one lay one
    # fp32 ulp under it, and the two sides' rounding put it on different sides), window 8 on layer
    # 0, YaRN as its config has it but at a small original context.
    "gpt_oss": dict(COMMON, model_type="gpt_oss", architectures=["GptOssForCausalLM"], head_dim=16,
                    intermediate_size=32, num_local_experts=4, num_experts_per_tok=2, sliding_window=8,
                    swiglu_limit=0.7, output_router_logits=False,
                    rope_scaling={"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16,
                                  "beta_fast": 32.0, "beta_slow": 1.0, "truncate": False}),
    # DeepSeek-V3: multi-head latent attention (q and kv latents, decoupled interleaved rotary key,
    # v_head_dim 12 against q/k's 16) under YaRN with DeepSeek's mscale (the softmax scale moves), a
    # dense first layer, then sigmoid routing of 2 of 8 experts from the best 2 of 4 groups, a
    # random correction bias, renormalised and scaled by 2.5, beside a shared expert. transformers
    # adds no balance loss for DeepSeek (aux_loss_alpha 0 on both sides) and builds no multi-token
    # prediction module (num_mtp_layers 0 here; deepseek_v3_mtp below has two).
    "deepseek_v3": dict(COMMON, model_type="deepseek_v3", architectures=["DeepseekV3ForCausalLM"],
                        num_key_value_heads=4, moe_intermediate_size=32, n_routed_experts=8, n_shared_experts=1,
                        num_experts_per_tok=2, n_group=4, topk_group=2, norm_topk_prob=True,
                        routed_scaling_factor=2.5, first_k_dense_replace=1, q_lora_rank=24, kv_lora_rank=16,
                        qk_nope_head_dim=8, qk_rope_head_dim=8, v_head_dim=12, rope_interleave=True,
                        aux_loss_alpha=0.0, num_mtp_layers=0,
                        rope_scaling={"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16,
                                      "beta_fast": 32.0, "beta_slow": 1.0, "mscale": 1.0, "mscale_all_dim": 0.8}),
    # DeepSeek-V3 with two chained multi-token prediction modules (num_nextn_predict_layers), which
    # transformers does not build: hf_mtp_model makes them of its own parts (mtp_forward).
    "deepseek_v3_mtp": None,  # filled in below, from deepseek_v3's
    # DeepSeek-V2: a plain q projection (no q latent), softmax routing limited to the best 2 of 4
    # groups by their best expert, scaled by 1.5, two shared experts.
    "deepseek_v2": dict(COMMON, model_type="deepseek_v2", architectures=["DeepseekV2ForCausalLM"],
                        num_key_value_heads=4, moe_intermediate_size=16, n_routed_experts=8, n_shared_experts=2,
                        num_experts_per_tok=2, topk_method="group_limited_greedy", n_group=4, topk_group=2,
                        routed_scaling_factor=1.5, first_k_dense_replace=1, q_lora_rank=None, kv_lora_rank=16,
                        qk_nope_head_dim=8, qk_rope_head_dim=8, v_head_dim=12, aux_loss_alpha=0.0),
    "gpt2": {"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"], "n_embd": 64, "n_layer": 2, "n_head": 4,
             "n_inner": 256, "vocab_size": 256, "n_positions": 64, "activation_function": "gelu_new",
             "attn_pdrop": 0.0, "resid_pdrop": 0.0, "embd_pdrop": 0.0, "layer_norm_epsilon": 1e-5,
             "tie_word_embeddings": True},
}


CONFIGS["deepseek_v3_mtp"] = dict(CONFIGS["deepseek_v3"], num_mtp_layers=2)  # saved as num_nextn_predict_layers
MTP_LOSS_SCALE = 0.1  # dplan's default --mtp-loss-scale (Megatron's --mtp-loss-scaling-factor)


def fail(message):
    print(f"hf_parity: {message}", file=sys.stderr)
    sys.exit(2)


def run(cmd, log):
    with open(log, "w") as out:
        done = subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT)
    if done.returncode != 0:
        with open(log) as f:
            tail = f.read()[-3000:]
        fail(f"{' '.join(cmd)} exited {done.returncode}:\n{tail}")


def drawn_model(folder, attention):
    """transformers' model of folder/config.json, every parameter drawn from a fixed seed."""
    config = transformers.AutoConfig.from_pretrained(folder)
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation=attention, dtype=torch.float32)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 1 and ("norm" in name or "ln_" in name) and name.endswith("weight"):
                p.uniform_(0.5, 1.5)  # norm scales away from 1, so a missed one shows
            else:
                p.normal_(0.0, 0.05)
        for name, b in model.named_buffers():  # DeepSeek-V3's router correction bias: no gradient moves it
            if name.endswith("e_score_correction_bias"):
                b.normal_(0.0, 0.05)
    return model


def hf_model(family, folder):
    """The family's model from its tiny config, every parameter drawn from a fixed seed, saved."""
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump(CONFIGS[family], f, indent=1)
    model = drawn_model(folder, "eager")
    model.save_pretrained(folder)
    model = transformers.AutoModelForCausalLM.from_pretrained(folder, attn_implementation="eager", dtype=torch.float32)
    # DPLAN_HF_PERTURB=NAME moves that parameter by 1e-3 on transformers' side only: the check must fail.
    perturbed = os.environ.get("DPLAN_HF_PERTURB")
    if perturbed:
        with torch.no_grad():
            dict(model.named_parameters())[perturbed].add_(1e-3)
    return model


def hf_mtp_model(family, folder):
    """DeepSeek-V3 with D multi-token prediction modules (arXiv 2412.19437, Sec. 2.2), of transformers'
    own parts: its model saved with L + D layers, module k's layer being transformers'
    DeepseekV3DecoderLayer number L + k - 1 (where DeepSeek's checkpoints put it), with each module's
    enorm, hnorm, eh_proj and shared_head.norm drawn beside them into the same file; config.json
    then says L layers and D modules, as dplan reads it. Returns (the model, the modules' tensors by
    checkpoint name, L, D). Runs with SDPA's causal attention (mtp_forward calls the layers itself)."""
    import safetensors.torch
    cfg = CONFIGS[family]
    layers, modules = cfg["num_hidden_layers"], cfg["num_mtp_layers"]
    whole = dict(cfg, num_hidden_layers=layers + modules, num_mtp_layers=0)
    saved = os.path.join(folder, "with-mtp-layers")
    os.makedirs(saved, exist_ok=True)
    with open(os.path.join(saved, "config.json"), "w") as f:
        json.dump(whole, f, indent=1)
    model = drawn_model(saved, "sdpa")
    model.save_pretrained(saved)
    model = transformers.AutoModelForCausalLM.from_pretrained(saved, attn_implementation="sdpa", dtype=torch.float32)
    h = cfg["hidden_size"]
    extras = {}
    for k in range(modules):
        p = f"model.layers.{layers + k}."
        for norm in ("enorm", "hnorm", "shared_head.norm"):
            extras[p + norm + ".weight"] = torch.empty(h).uniform_(0.5, 1.5)
        extras[p + "eh_proj.weight"] = torch.empty(h, 2 * h).normal_(0.0, 0.05)
    tensors = safetensors.torch.load_file(os.path.join(saved, "model.safetensors"))
    tensors.update(extras)
    safetensors.torch.save_file(tensors, os.path.join(folder, "model.safetensors"), metadata={"format": "pt"})
    with open(os.path.join(saved, "config.json")) as f:
        written = json.load(f)
    written.update(num_hidden_layers=layers, num_nextn_predict_layers=modules)
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump(written, f, indent=1)
    extras = {n: torch.nn.Parameter(t) for n, t in extras.items()}
    perturbed = os.environ.get("DPLAN_HF_PERTURB")
    if perturbed:
        with torch.no_grad():
            dict(model.named_parameters(), **extras)[perturbed].add_(1e-3)
    return model, extras, layers, modules


class WithMtp:
    """The model and the MTP modules' own tensors as one set of named parameters (checkpoint names)."""

    def __init__(self, model, extras):
        self.model, self.extras = model, extras

    def named_parameters(self):
        yield from self.model.named_parameters()
        yield from self.extras.items()

    def parameters(self):
        return [p for _, p in self.named_parameters()]


def mtp_forward(model, extras, layers, modules, eps, tokens):
    """(the objective, the token loss, its logits): the main model's L layers by hand, then module k
    (1..D): h = eh_proj [RMSNorm(embedding of token i + k); RMSNorm(h)] (Megatron-Core's order), its
    layer, its norm and the shared head predicting token i + k + 1, its loss the mean over the
    positions that have that token; the objective adds MTP_LOSS_SCALE / D times their sum."""
    inputs = tokens[:, :-1]
    s = inputs.size(1)
    m = model.model
    position = torch.arange(s).unsqueeze(0)

    def rms(x, weight):
        return weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))

    def layer(i, x):
        out = m.layers[i](x, attention_mask=None, position_ids=position, position_embeddings=rotary)
        return out[0] if isinstance(out, tuple) else out

    x = m.embed_tokens(inputs)
    rotary = m.rotary_emb(x, position)
    for i in range(layers):
        x = layer(i, x)
    logits = model.lm_head(m.norm(x))
    loss = F.cross_entropy(logits.reshape(-1, logits.size(-1)).float(), tokens[:, 1:].reshape(-1))
    h, mtp = x, 0.0
    for k in range(1, modules + 1):
        p = f"model.layers.{layers + k - 1}."
        ids = torch.zeros_like(inputs)
        ids[:, : s - k + 1] = tokens[:, k:]
        e = rms(m.embed_tokens(ids), extras[p + "enorm.weight"])
        h = F.linear(torch.cat([e, rms(h, extras[p + "hnorm.weight"])], -1), extras[p + "eh_proj.weight"])
        h = layer(layers + k - 1, h)
        out = model.lm_head(rms(h, extras[p + "shared_head.norm.weight"]))[:, : s - k]
        mtp = mtp + F.cross_entropy(out.reshape(-1, out.size(-1)).float(), tokens[:, k + 1 :].reshape(-1))
    return loss + MTP_LOSS_SCALE / modules * mtp, loss, logits


def decays(name, p):
    """The executor's weight-decay rule by what a tensor is: matrices and embeddings decay, norms,
    biases and sinks do not (gpt-oss stacks its experts' biases into matrices, which still do not)."""
    return p.dim() >= 2 and not name.endswith("bias")


def token_loss(model, tokens):
    """(the objective, the token loss, the logits) of transformers' own forward."""
    logits = model(input_ids=tokens[:, :-1]).logits
    loss = F.cross_entropy(logits.reshape(-1, logits.size(-1)).float(), tokens[:, 1:].reshape(-1))
    return loss, loss, logits


def hf_train(model, batches, opt, max_norm, forward=token_loss):
    """(losses, gradient norms, step 1's logits, step 1's gradients by name) of the steps, as the
    executor trains them; `forward(model, tokens)` gives the objective, the token loss reported and
    the logits."""
    optimizer = adamw(model, opt, decays)
    losses, norms, logits1, grads1 = [], [], None, None
    for tokens in batches:
        optimizer.zero_grad(set_to_none=True)
        objective, loss, logits = forward(model, tokens)
        objective.backward()
        if logits1 is None:
            logits1 = logits.detach().float().clone()
            grads1 = {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}
        norms.append(clip_global_norm(list(model.parameters()), max_norm, 1))
        optimizer.step()
        losses.append(float(loss.detach()))
    return losses, norms, logits1, grads1


def gradient_gaps(dplan_grads, hf_grads):
    """The largest relative gap ||d - h|| / ||h|| over the checkpoint tensors transformers holds
    under the same name (and that tensor's name), and the relative gap of the joint norm of the rest (transformers 5 holds
    Mixtral's and Qwen3-MoE's experts fused in memory, saving them per expert), with their counts."""
    matched = [n for n in dplan_grads if n in hf_grads]
    gaps = {n: float((dplan_grads[n] - hf_grads[n]).norm() / hf_grads[n].norm().clamp_min(1e-30)) for n in matched}
    worst_name = max(gaps, key=gaps.get, default="")
    worst = gaps.get(worst_name, 0.0)
    rest_d = [g for n, g in dplan_grads.items() if n not in hf_grads]
    rest_h = [g for n, g in hf_grads.items() if n not in dplan_grads]
    joint = 0.0
    if rest_d or rest_h:
        nd = math.sqrt(sum(float(g.double().pow(2).sum()) for g in rest_d))
        nh = math.sqrt(sum(float(g.double().pow(2).sum()) for g in rest_h))
        joint = abs(nd - nh) / max(nh, 1e-30)
    return worst, worst_name, len(matched), joint, len(rest_d)


def rel(a, b):
    return abs(a - b) / max(abs(b), 1e-30)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("dplan")
    ap.add_argument("workdir")
    ap.add_argument("family", choices=sorted(CONFIGS))
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--layout", default="", help="dplan estimate's layout flags (default: one rank)")
    a = ap.parse_args()
    work = os.path.join(a.workdir, a.family + a.layout.replace(" ", "").replace("-", "_"))
    os.makedirs(work, exist_ok=True)
    torch.set_num_threads(1)
    forward = token_loss
    if CONFIGS[a.family].get("num_mtp_layers"):
        base, extras, layers, modules = hf_mtp_model(a.family, os.path.join(work, "hf"))
        model = WithMtp(base, extras)
        eps = CONFIGS[a.family]["rms_norm_eps"]

        def forward(m, tokens):
            return mtp_forward(base, extras, layers, modules, eps, tokens)
    else:
        model = hf_model(a.family, os.path.join(work, "hf"))

    layout = a.layout.split()
    world = 1  # tp x pp x dp x cp (ep and etp fold into those ranks)
    for flag in ("--tp", "--pp", "--dp", "--cp"):
        if flag in layout:
            world *= int(layout[layout.index(flag) + 1])
    plan, run_json, ref = (os.path.join(work, n) for n in ("plan.json", "run.json", "reference.safetensors"))
    run([a.dplan, "estimate", "--model", os.path.join(work, "hf", "config.json"), "--cluster", "local-cpu",
         "--gpus", str(world), "--global-batch", str(BATCH), "--seq", str(SEQ), "--precision", "fp32",
         *(layout or ["--tp", "1", "--pp", "1", "--dp", "1"]), "--force", "-o", plan], os.path.join(work, "estimate.log"))
    # The batches come from a one-rank run (--save-reference needs one); a layout's run trains the same ones.
    one_rank_plan = plan
    if layout:
        one_rank_plan = os.path.join(work, "plan1.json")
        run([a.dplan, "estimate", "--model", os.path.join(work, "hf", "config.json"), "--cluster", "local-cpu",
             "--gpus", "1", "--global-batch", str(BATCH), "--seq", str(SEQ), "--precision", "fp32",
             "--tp", "1", "--pp", "1", "--dp", "1", "--mbs", str(BATCH), "--force", "-o", one_rank_plan],
            os.path.join(work, "estimate1.log"))
    run([a.dplan, "run", one_rank_plan, "--init-from", os.path.join(work, "hf"), "--steps", str(a.steps),
         "--save-reference", ref, "--force", "--quiet", "-o", os.path.join(work, "run1.json")], os.path.join(work, "run1.log"))
    if layout:
        run([a.dplan, "run", plan, "--init-from", os.path.join(work, "hf"), "--steps", str(a.steps), "--force",
             "--quiet", "-o", run_json], os.path.join(work, "run.log"))
    else:
        run_json = os.path.join(work, "run1.json")
    with open(run_json) as f:
        steps = json.load(f)["steps"]
    dplan_losses = [s["loss"] for s in steps]
    dplan_norms = [s["grad_norm"] for s in steps]

    tensors, metadata = read_safetensors(ref)  # the batches and the optimizer's settings, as dplan ran them
    opt = json.loads(metadata["dplan"])["optimizer"]
    batches = [tensors[f"tokens.step{k}"] for k in range(a.steps)]
    hf_losses, hf_norms, hf_logits, hf_grads = hf_train(model, batches, opt, 1.0, forward)
    # Step 1's logits and per-tensor gradients, from the one-rank run's reference file.
    dplan_logits = tensors["logits.step0"]
    logits_rel = float((dplan_logits - hf_logits).abs().max() / hf_logits.abs().max())
    dplan_grads = {n[len("hf_grad."):]: t for n, t in tensors.items() if n.startswith("hf_grad.")}
    grad_rel, grad_worst, grads_matched, grad_rest_rel, grads_rest = gradient_gaps(dplan_grads, hf_grads)
    result = {"family": a.family, "layout": a.layout or "one rank", "transformers": transformers.__version__,
              "loss1_rel": rel(dplan_losses[0], hf_losses[0]), "grad_norm1_rel": rel(dplan_norms[0], hf_norms[0]),
              "loss_max_rel": max(rel(d, h) for d, h in zip(dplan_losses, hf_losses)),
              "logits1_rel": logits_rel, "grad1_max_rel": grad_rel, "grad1_worst": grad_worst,
              "grads_compared": grads_matched,
              "grad1_fused_norm_rel": grad_rest_rel, "grads_fused": grads_rest,
              "dplan_losses": dplan_losses, "hf_losses": hf_losses}
    print(json.dumps(result))
    checks = [("step 1's loss", result["loss1_rel"], 1e-5), ("step 1's gradient norm", result["grad_norm1_rel"], 1e-4),
              (f"the {a.steps} steps' losses", result["loss_max_rel"], 1e-4),
              ("step 1's logits (largest gap over the largest logit)", logits_rel, 1e-5),
              ("step 1's gradients (largest per-tensor gap)", grad_rel, 1e-4),
              ("step 1's gradients of transformers' fused tensors (their joint norm)", grad_rest_rel, 1e-4)]
    if grads_matched == 0:
        print(f"hf_parity: {a.family}: no gradient tensor compared", file=sys.stderr)
        sys.exit(1)
    bad = [f"{what}: {gap:.2e} relative > {bound:g}" for what, gap, bound in checks if not gap <= bound]
    if bad:
        print(f"hf_parity: {a.family} ({result['layout']}): " + "; ".join(bad), file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
