"""The MoE fields of the Llama family's MoE models (Mixtral, OLMoE, Qwen2-MoE) in config.json, each way."""
from .ourfile import number
from .fields import refuse, int_field, bool_field


def hf_config_moe(cfg, mt):
    """config.json's MoE fields of Mixtral, OLMoE or Qwen2-MoE (intermediate_size: Mixtral's and OLMoE's is an
    expert's width H, Qwen2-MoE's the dense layers' F); no router jitter, no sliding window, no clip_qkv"""
    E, k, H = cfg["E"], cfg["k"], cfg["H"]
    norm = bool(cfg["norm_topk"]) and k > 1   # (k = 1: our gate is the probability, either way)
    if mt == "mixtral":
        return dict(intermediate_size=H, num_local_experts=E, num_experts_per_tok=k, router_jitter_noise=0.0,
                    sliding_window=None, output_router_logits=False)
    if mt == "olmoe":
        return dict(intermediate_size=H, num_experts=E, num_experts_per_tok=k, norm_topk_prob=norm, clip_qkv=None,
                    attention_bias=False, output_router_logits=False)
    return dict(intermediate_size=cfg["F"], num_experts=E, num_experts_per_tok=k, norm_topk_prob=norm,
                moe_intermediate_size=H, shared_expert_intermediate_size=cfg["S"] * H, decoder_sparse_step=cfg["every"],
                mlp_only_layers=[], use_sliding_window=False, sliding_window=None, max_window_layers=cfg["L"],
                output_router_logits=False)


MOE_TYPES = ("mixtral", "olmoe", "qwen2_moe")


def moe_config(hc, path, mt, d, cfg):
    """The MoE fields of a Mixtral, OLMoE or Qwen2-MoE config (moe_llama_spec.md): softmax routing, top k, the
    gates renormalised (norm_topk) always in Mixtral, by norm_topk_prob in the others; OLMoE's QK-norm;
    Qwen2-MoE's gated shared expert (S H wide), q/k/v biases and dense layers (decoder_sparse_step = our every).
    Mixtral's and OLMoE's intermediate_size is an expert's width H (our F, unused, is set to it)"""
    E = int_field(hc, path, "num_local_experts" if mt == "mixtral" else "num_experts",
                  d["num_local_experts" if mt == "mixtral" else "num_experts"], hi=256)
    k = int_field(hc, path, "num_experts_per_tok", d["num_experts_per_tok"], hi=E, why=f" (E = {E})")
    norm = True if mt == "mixtral" else bool_field(hc, path, "norm_topk_prob", d["norm_topk_prob"])
    if k == 1 and norm:   # transformers' one renormalised gate is 1; ours (k = 1) is the probability
        refuse(hc, path, "num_experts_per_tok", "expected at least 2 with renormalised gates (Mixtral, norm_topk_prob "
               "true): their one gate at k = 1 is 1, ours the probability")
    moe = dict(E=E, k=k, every=1, H=cfg["F"], norm_topk=int(norm), qknorm=int(mt == "olmoe"))
    if mt == "mixtral":
        jitter = number(hc.get("router_jitter_noise", 0.0))
        if jitter != 0:
            refuse(hc, path, "router_jitter_noise", "expected 0: our router adds no noise")
    if mt != "qwen2_moe":
        if moe["H"] > 65536:
            refuse(hc, path, "intermediate_size", "expected at most 65536 (an expert's width)")
        return moe
    H = int_field(hc, path, "moe_intermediate_size", d["moe_intermediate_size"], hi=65536)
    SH = int_field(hc, path, "shared_expert_intermediate_size", d["shared_expert_intermediate_size"], hi=64 * H,
                   why=f", a multiple of moe_intermediate_size {H} (our shared experts: S of width H, S <= 64)")
    if SH % H:
        refuse(hc, path, "shared_expert_intermediate_size", f"expected a multiple of moe_intermediate_size {H} (our "
               "shared experts: S of width H)")
    every = int_field(hc, path, "decoder_sparse_step", d["decoder_sparse_step"], hi=cfg["L"],
                      why=f" (num_hidden_layers {cfg['L']}: at least one MoE layer)")
    if hc.get("mlp_only_layers") not in (None, []):
        refuse(hc, path, "mlp_only_layers", "expected null or []: our MoE layers are every decoder_sparse_step-th")
    moe.update(H=H, S=SH // H, sgate=1, every=every)
    return moe
