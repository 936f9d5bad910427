"""Random-weight test models for scripts/test-gpu, made where the GPU is (it has torch
and transformers but no network): a byte-level BPE tokenizer trained on a fixed text, and
from a fixed seed

  llama/       LlamaForCausalLM, bf16: 6 query heads / 2 KV heads of dimension 64 (GQA;
               4 ranks replicate KV heads and split 6 heads unevenly), tied embeddings
  qwen2/       Qwen2ForCausalLM, bf16: 4 query heads / 2 KV heads of dimension 128, QKV
               bias, untied LM head
  mistral/     MistralForCausalLM, bf16: every layer attends to its last 48 positions
               (sliding_window; the prompts are longer), 8 query heads / 2 KV heads of 64
  qwen3/       Qwen3ForCausalLM, bf16: per-head query/key RMSNorm, 6 query heads / 2 KV
               heads of dimension 128 (not hidden / heads), no QKV bias, untied LM head
  llama-hd32/  a one-layer llama with head dimension 32, which CUDA ranks must refuse
  qwen3-moe/   Qwen3MoeForCausalLM, bf16: 3 layers, each a mixture of 8 experts of 256
               columns (top 2, renormalised; router weights N(0, 0.5) so that choices are
               not near ties), 8 query / 2 KV heads of 64, untied LM head
  gemma3/      Gemma3ForCausalLM, bf16: two sliding-window layers (window 48, RoPE base
               10000) then a global one (1e6, scaled linearly by 8), GELU MLP, norms around attention and the
               MLP, per-head q/k norms, scaled embeddings, 4 query heads / 1 KV head of
               256 (replicated under TP), untied LM head (a tied one repeats the last
               token of these random weights)
  phi3/        Phi3ForCausalLM, bf16: query/key/value rows fused in qkv_proj and gate/up
               rows in gate_up_proj, 6 query heads / 2 KV heads of 64, untied LM head
  smollm3/     SmolLM3ForCausalLM, bf16: 4 layers, the fourth without RoPE, 8 query heads
               / 2 KV heads of 64, untied LM head
  gemma2/      Gemma2ForCausalLM, bf16: a window of 48 in every other layer, attention
               scores capped at 5 (low enough to bend) and logits at 30 (as shipped), 6
               query heads / 2 KV heads of 64, untied LM head
  phi4-mini/   Phi3ForCausalLM, bf16, Phi-4-mini's RoPE: 4 query heads / 2 KV heads of 128
               of which the first 96 dimensions rotate (partial_rotary_factor 0.75), with
               LongRoPE factors for those 48 pairs and an attention factor of 1.2; the
               pretraining context is the whole context (2048), so transformers and
               Tessera both run the short factors whatever the prompt's length; untied LM
               head
  granite/     GraniteForCausalLM, bf16: 5 layers, embeddings times 2, attention scores
               times 1/64, each layer half's output times 0.5 before the residual add,
               logits divided by 0.5 (Granite ships 8 or 16; dividing random logits by more
               leaves the greedy checks near ties); 6 query heads / 2 KV heads of 64,
               untied LM head
  glm4/        Glm4ForCausalLM, bf16: 4 query heads / 2 KV heads of 128 of which the first
               64 dimensions rotate in neighbouring pairs (partial_rotary_factor 0.5),
               query/key/value biases, gate and up rows fused in gate_up_proj, norms after
               attention and the MLP, untied LM head
  olmo2/       Olmo2ForCausalLM, bf16: no input norms, norms after attention and the MLP,
               query and key norms across all heads (8 query heads / 2 KV heads of 64, so
               TP = 3 and 4 replicate KV heads), untied LM head
  olmo3/       Olmo3ForCausalLM, bf16: OLMo 2's layer with a window of 48 in three layers
               of four and YaRN (factor 4) on the fourth only, 8 query heads / 2 KV heads
               of 64, untied LM head
  gpt-oss/     GptOssForCausalLM, bf16: 3 layers, a window of 48 in the first and third,
               one sink logit N(0, 1) per query head, biases on every projection, YaRN
               (factor 4, untruncated), in every layer 8 experts of 256 columns (top 2 of
               a biased router) with biases and the clamped gate (swiglu_limit 0.75, low
               enough that these weights' pre-activations clamp), 8 query heads / 2 KV
               heads of 64, untied LM head
  glm4-moe/    Glm4MoeForCausalLM, bf16: 3 layers, the first dense, then 8 routed experts
               of 256 columns and a shared one; the sigmoid router chooses 2 by its scores
               plus correction biases N(0, 0.3) in the better of 2 groups, weights
               renormalised and times 2.5; 8 query heads / 2 KV heads of 128 of which the
               first 64 dimensions rotate (in halves), q/k norms and q/k/v biases, untied
               LM head
  gpt-oss-mxfp4/  gpt-oss/ with every layer's experts in MXFP4 as OpenAI's checkpoints
               ship them (`*_blocks`, `*_scales`, quantization_config mxfp4; quantized by
               tests/fixtures/models/make_gpt_oss.py's mxfp4_quantize); its reference is
               transformers in float32 with the experts' dequantized values

  minimax-m2/  MiniMaxM2ForCausalLM, bf16: 3 layers, each a mixture of 8 experts of 256
               chosen 2 at a time by a sigmoid router with correction biases (N(0, 0.3)),
               query/key norms across all heads, half of each head of 128 rotating
               (rotary_dim 64), 8 query / 2 KV heads, untied LM head (needs transformers 5)

each with tokenizer.json, tokenizer_config.json (ChatML template) and reference.json: the
last-position logits transformers computes in float32 from the saved bf16 weights.
Weights are drawn large enough that logits are spread (greedy choices are not ties).

  python3 make_models.py OUT_DIR
"""
import json
import os
import shutil
import sys
import traceback

import torch
import transformers
from safetensors.torch import load_file, save_file
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import (Gemma2Config, Gemma2ForCausalLM, Gemma3ForCausalLM, Gemma3TextConfig,
                          Glm4Config, Glm4ForCausalLM, Glm4MoeConfig, Glm4MoeForCausalLM,
                          GptOssConfig, GptOssForCausalLM,
                          GraniteConfig, GraniteForCausalLM,
                          LlamaConfig, LlamaForCausalLM, Olmo2Config, Olmo2ForCausalLM,
                          Olmo3Config, Olmo3ForCausalLM,
                          MistralConfig, MistralForCausalLM, Phi3Config, Phi3ForCausalLM,
                          Qwen2Config, Qwen2ForCausalLM, Qwen3Config, Qwen3ForCausalLM,
                          Qwen3MoeConfig, Qwen3MoeForCausalLM, SmolLM3Config,
                          SmolLM3ForCausalLM)

# MiniMax-M2 came to transformers in 5.x: without it, only minimax-m2/ is not made.
MiniMaxM2Config = getattr(transformers, "MiniMaxM2Config", None)
MiniMaxM2ForCausalLM = getattr(transformers, "MiniMaxM2ForCausalLM", None)

SEED = 20261123
LINEAR_GAIN = float(os.environ.get("LINEAR_GAIN", "0.5"))
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CHATML = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + "
    "message['content'] + '<|im_end|>' + '\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
CORPUS = """
The capital of France is Paris, a city on the river Seine. Paris is known for its museums,
its cafes and the tower built for the world fair of 1889. Rome is the capital of Italy and
Madrid the capital of Spain. Berlin lies on the Spree, Vienna on the Danube, and London on
the Thames. A server that answers many clients at once batches their requests together,
keeps the keys and values of every sequence in blocks of memory, and frees the blocks when
a request ends. Tensor parallelism splits every weight matrix across devices; the partial
results are added together by an all-reduce. The quick brown fox jumps over the lazy dog.
Numbers: one two three four five six seven eight nine ten eleven twelve thirteen fourteen.
Colours: red orange yellow green blue indigo violet black white grey brown pink purple.
""".strip().splitlines()


def make_tokenizer(vocab_size):
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIALS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(CORPUS * 4, trainer)
    return tok


def save_tokenizer(tok, path):
    tok.save(os.path.join(path, "tokenizer.json"))
    config = {
        "chat_template": CHATML,
        "bos_token": None,
        "eos_token": "<|im_end|>",
        "add_bos_token": False,
        "clean_up_tokenization_spaces": False,
        "model_max_length": 2048,
    }
    with open(os.path.join(path, "tokenizer_config.json"), "w") as f:
        json.dump(config, f, indent=1)


def init_weights(model, seed):
    """Linears N(0, 1/sqrt(fan_in)), embeddings N(0, 0.25), norms 1 + N(0, 0.1), biases
    N(0, 0.1), sinks N(0, 1). Stacked experts ([experts, in, out]) take their input's fan-in,
    which is their second dimension like a linear's."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in sorted(model.named_parameters()):
            if name.endswith("norm.weight"):
                p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=gen))
            elif name.endswith("self_attn.sinks"):
                p.copy_(torch.randn(p.shape, generator=gen))
            elif name.endswith(".bias") or name.endswith("_bias"):
                p.copy_(0.1 * torch.randn(p.shape, generator=gen))
            elif "embed_tokens" in name or name == "lm_head.weight":
                p.copy_(0.25 * torch.randn(p.shape, generator=gen))
            else:
                p.copy_(LINEAR_GAIN * torch.randn(p.shape, generator=gen) / p.shape[1] ** 0.5)


def prompts(tok):
    texts = ["The capital of France is", CORPUS[4] + CORPUS[5], " ".join(CORPUS[:6])]
    return [tok.encode(t).ids for t in texts]


def reference(path, cls, tok):
    write_reference(path, cls.from_pretrained(path, attn_implementation="eager").float().eval(),
                    tok, "transformers float32 from the saved bf16 weights, eager attention")


def as_configured(model):
    """transformers before 5.2x runs gpt-oss's clamped gate at 7.0 and 1.702 whatever the
    config says; the modules take the config's swiglu_limit (and alpha) here, so that every
    version computes what config.json asks for."""
    limit = getattr(model.config, "swiglu_limit", None)
    for module in model.modules():
        if limit is not None and hasattr(module, "limit") and hasattr(module, "alpha"):
            module.limit = limit
            module.alpha = getattr(model.config, "swiglu_alpha", module.alpha)
    return model


@torch.no_grad()
def write_reference(path, model, tok, what):
    model = as_configured(model)
    cases = []
    for ids in prompts(tok):
        logits = model(input_ids=torch.tensor([ids]), use_cache=False).logits[0, -1]
        top = torch.topk(logits, 2).values
        cases.append({
            "input_ids": ids,
            "last_logits": [float(x) for x in logits],
            "last_top2_gap": float(top[0] - top[1]),
        })
    doc = {
        "generator": "scripts/gpu/make_models.py",
        "seed": SEED,
        "reference": what,
        "versions": {"torch": torch.__version__, "transformers": transformers.__version__},
        "cases": cases,
    }
    with open(os.path.join(path, "reference.json"), "w") as f:
        json.dump(doc, f)
    gaps = ", ".join(f"{c['last_top2_gap']:.3f}" for c in cases)
    print(f"{path}: prompts of {[len(c['input_ids']) for c in cases]} tokens, top-2 gaps {gaps}",
          file=sys.stderr)


def init_routers(model, seed):
    """Router weights N(0, 0.5); a sigmoid router's correction biases (buffers) N(0, 0.3),
    so that they change the choice."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in sorted(model.named_parameters()):
            if name.endswith("mlp.gate.weight") or name.endswith("mlp.router.weight"):
                p.copy_(0.5 * torch.randn(p.shape, generator=gen))
        for name, b in sorted(model.named_buffers()):
            if name.endswith("e_score_correction_bias"):
                b.copy_(0.3 * torch.randn(b.shape, generator=gen))


# The models to make (python3 make_models.py OUT [NAME...]); all when none are named.
ONLY = set(sys.argv[2:])


# Models whose making failed: the others are still made (one GPU run checks them), and the
# script exits non-zero naming these.
FAILED = []


def each_model(make):
    """`make` for one model (when ONLY names it or is empty), its failure recorded (with
    the traceback) rather than raised."""
    def run(out, name, *args, **kwargs):
        if ONLY and name not in ONLY:
            return
        try:
            make(out, name, *args, **kwargs)
        except Exception:
            traceback.print_exc()
            print(f"error: {name} was not made", file=sys.stderr)
            FAILED.append(name)
    return run


@each_model
def build(out, name, cls, config, tok, with_reference=True):
    path = os.path.join(out, name)
    shutil.rmtree(path, ignore_errors=True)
    os.makedirs(path)
    torch.manual_seed(SEED)
    model = cls(config).to(torch.float32)
    init_weights(model, SEED)
    init_routers(model, SEED + 1)
    model.to(torch.bfloat16).save_pretrained(path, safe_serialization=True)
    save_tokenizer(tok, path)
    if with_reference:
        reference(path, cls, tok)


@each_model
def build_gpt_oss_mxfp4(out, name, tok):
    """gpt-oss-mxfp4/ (`name`) from gpt-oss/ (made first)."""
    here = os.path.dirname(os.path.abspath(__file__))
    sys.path.insert(0, os.path.join(here, "..", "..", "tests", "fixtures", "models"))
    from make_gpt_oss import EXPERT_NAMES, QUANTIZATION_CONFIG, mxfp4_quantize

    src, path = os.path.join(out, "gpt-oss"), os.path.join(out, name)
    shutil.rmtree(path, ignore_errors=True)
    os.makedirs(path)
    tensors = load_file(os.path.join(src, "model.safetensors"))
    stored, dequantized = {}, {}
    for name, t in tensors.items():
        if not name.endswith(tuple("mlp.experts." + e for e in EXPERT_NAMES)):
            stored[name] = t
            continue
        # transformers holds [E, in, out]; the checkpoint stores [E, out, in / 32, 16].
        blocks, scales, deq = mxfp4_quantize(t.float().transpose(1, 2))
        stored[name + "_blocks"], stored[name + "_scales"] = blocks, scales
        dequantized[name] = deq.transpose(1, 2).contiguous()
    save_file(stored, os.path.join(path, "model.safetensors"), metadata={"format": "pt"})
    with open(os.path.join(src, "config.json")) as f:
        config = json.load(f)
    config["quantization_config"] = QUANTIZATION_CONFIG
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(config, f, indent=2)
    save_tokenizer(tok, path)
    # The reference: the bf16 model in float32 with its experts replaced by the
    # dequantized values.
    model = GptOssForCausalLM.from_pretrained(src, attn_implementation="eager").float().eval()
    state = model.state_dict()
    for name, t in dequantized.items():
        state[name] = t
    model.load_state_dict(state, strict=True)
    write_reference(path, model, tok, "transformers float32 from gpt-oss/'s bf16 weights, the "
                    "experts' replaced by their MXFP4 values, eager attention")


def main():
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    tok = make_tokenizer(1024)
    vocab = tok.get_vocab_size()
    eos = tok.token_to_id("<|im_end|>")
    common = dict(vocab_size=vocab, rms_norm_eps=1e-5, max_position_embeddings=2048,
                  bos_token_id=None, eos_token_id=eos, hidden_act="silu")
    build(out, "llama", LlamaForCausalLM, LlamaConfig(
        hidden_size=384, intermediate_size=1024, num_hidden_layers=4,
        num_attention_heads=6, num_key_value_heads=2, head_dim=64, rope_theta=10000.0,
        tie_word_embeddings=False, attention_bias=False, mlp_bias=False, **common), tok)
    build(out, "qwen2", Qwen2ForCausalLM, Qwen2Config(
        hidden_size=512, intermediate_size=1376, num_hidden_layers=3,
        num_attention_heads=4, num_key_value_heads=2, rope_theta=1000000.0,
        tie_word_embeddings=False, use_sliding_window=False, **common), tok)
    build(out, "mistral", MistralForCausalLM, MistralConfig(
        hidden_size=512, intermediate_size=1024, num_hidden_layers=3,
        num_attention_heads=8, num_key_value_heads=2, head_dim=64, rope_theta=10000.0,
        sliding_window=48, tie_word_embeddings=False, **common), tok)
    build(out, "qwen3", Qwen3ForCausalLM, Qwen3Config(
        hidden_size=512, intermediate_size=1024, num_hidden_layers=3,
        num_attention_heads=6, num_key_value_heads=2, head_dim=128, rope_theta=1000000.0,
        tie_word_embeddings=False, attention_bias=False, use_sliding_window=False, **common),
        tok)
    build(out, "llama-hd32", LlamaForCausalLM, LlamaConfig(
        hidden_size=128, intermediate_size=256, num_hidden_layers=1,
        num_attention_heads=4, num_key_value_heads=2, head_dim=32,
        tie_word_embeddings=True, **common), tok, with_reference=False)
    build(out, "qwen3-moe", Qwen3MoeForCausalLM, Qwen3MoeConfig(
        hidden_size=512, intermediate_size=1024, moe_intermediate_size=256, num_experts=8,
        num_experts_per_tok=2, norm_topk_prob=True, decoder_sparse_step=1, mlp_only_layers=[],
        num_hidden_layers=3, num_attention_heads=8, num_key_value_heads=2, head_dim=64,
        rope_theta=1000000.0, tie_word_embeddings=False, attention_bias=False,
        use_sliding_window=False, **common), tok)
    build(out, "gemma3", Gemma3ForCausalLM, Gemma3TextConfig(
        hidden_size=256, intermediate_size=768, num_hidden_layers=3,
        num_attention_heads=4, num_key_value_heads=1, head_dim=256, sliding_window=48,
        layer_types=["sliding_attention", "sliding_attention", "full_attention"],
        # Gemma 3 4B-27B scale their global layers' RoPE linearly (factor 8).
        rope_parameters={"full_attention": {"rope_type": "linear", "factor": 8.0,
                                            "rope_theta": 1000000.0},
                         "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0}},
        query_pre_attn_scalar=256, tie_word_embeddings=False, vocab_size=vocab, rms_norm_eps=1e-6,
        max_position_embeddings=2048, bos_token_id=None, eos_token_id=eos), tok)
    build(out, "phi3", Phi3ForCausalLM, Phi3Config(
        hidden_size=384, intermediate_size=1024, num_hidden_layers=4,
        num_attention_heads=6, num_key_value_heads=2, sliding_window=None,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        tie_word_embeddings=False, pad_token_id=None, **common), tok)
    build(out, "gemma2", Gemma2ForCausalLM, Gemma2Config(
        hidden_size=384, intermediate_size=1024, num_hidden_layers=4,
        num_attention_heads=6, num_key_value_heads=2, head_dim=64, sliding_window=48,
        query_pre_attn_scalar=64, attn_logit_softcapping=5.0, final_logit_softcapping=30.0,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        tie_word_embeddings=False, vocab_size=vocab, rms_norm_eps=1e-6,
        max_position_embeddings=2048, bos_token_id=None, eos_token_id=eos, pad_token_id=None),
        tok)
    pairs = 48
    build(out, "phi4-mini", Phi3ForCausalLM, Phi3Config(
        hidden_size=512, intermediate_size=1024, num_hidden_layers=4,
        num_attention_heads=4, num_key_value_heads=2, sliding_window=None,
        partial_rotary_factor=0.75, original_max_position_embeddings=2048,
        rope_parameters={"rope_type": "longrope", "rope_theta": 10000.0,
                         "partial_rotary_factor": 0.75, "attention_factor": 1.2,
                         "original_max_position_embeddings": 2048,
                         "short_factor": [1.0 + 2.0 * (i / pairs) ** 2 for i in range(pairs)],
                         "long_factor": [1.0 + 30.0 * (i / pairs) ** 2 for i in range(pairs)]},
        tie_word_embeddings=False, pad_token_id=None, **common), tok)
    build(out, "granite", GraniteForCausalLM, GraniteConfig(
        hidden_size=384, intermediate_size=1024, num_hidden_layers=5,
        num_attention_heads=6, num_key_value_heads=2, rope_theta=10000.0,
        embedding_multiplier=2.0, attention_multiplier=1.0 / 64, residual_multiplier=0.5,
        logits_scaling=0.5, tie_word_embeddings=False, attention_bias=False, mlp_bias=False,
        pad_token_id=None, **common), tok)
    build(out, "glm4", Glm4ForCausalLM, Glm4Config(
        hidden_size=512, intermediate_size=1024, num_hidden_layers=4,
        num_attention_heads=4, num_key_value_heads=2, head_dim=128, partial_rotary_factor=0.5,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        attention_bias=True, tie_word_embeddings=False, pad_token_id=None, **common), tok)
    build(out, "olmo2", Olmo2ForCausalLM, Olmo2Config(
        hidden_size=512, intermediate_size=1024, num_hidden_layers=4,
        num_attention_heads=8, num_key_value_heads=2,
        rope_parameters={"rope_type": "default", "rope_theta": 500000.0},
        attention_bias=False, tie_word_embeddings=False, pad_token_id=None, **common), tok)
    build(out, "gpt-oss", GptOssForCausalLM, GptOssConfig(
        hidden_size=512, intermediate_size=256, num_local_experts=8, num_experts_per_tok=2,
        num_hidden_layers=3, num_attention_heads=8, num_key_value_heads=2, head_dim=64,
        sliding_window=48,
        layer_types=["sliding_attention", "full_attention", "sliding_attention"],
        rope_parameters={"rope_type": "yarn", "rope_theta": 150000.0, "factor": 4.0,
                         "original_max_position_embeddings": 512, "beta_fast": 32.0,
                         "beta_slow": 1.0, "truncate": False},
        swiglu_limit=0.75, attention_bias=True, tie_word_embeddings=False, pad_token_id=None,
        **common), tok)
    build_gpt_oss_mxfp4(out, "gpt-oss-mxfp4", tok)
    build(out, "glm4-moe", Glm4MoeForCausalLM, Glm4MoeConfig(
        hidden_size=512, intermediate_size=1024, moe_intermediate_size=256,
        n_routed_experts=8, n_shared_experts=1, num_experts_per_tok=2, first_k_dense_replace=1,
        n_group=2, topk_group=1, norm_topk_prob=True, routed_scaling_factor=2.5,
        num_hidden_layers=3, num_attention_heads=8, num_key_value_heads=2, head_dim=128,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0,
                         "partial_rotary_factor": 0.5},
        use_qk_norm=True, attention_bias=True, tie_word_embeddings=False, pad_token_id=None,
        **common), tok)
    build(out, "olmo3", Olmo3ForCausalLM, Olmo3Config(
        hidden_size=512, intermediate_size=1024, num_hidden_layers=4,
        num_attention_heads=8, num_key_value_heads=2, sliding_window=48,
        layer_types=["sliding_attention"] * 3 + ["full_attention"],
        rope_parameters={
            "sliding_attention": {"rope_type": "default", "rope_theta": 500000.0},
            "full_attention": {"rope_type": "yarn", "rope_theta": 500000.0, "factor": 4.0,
                               "original_max_position_embeddings": 512, "beta_fast": 32.0,
                               "beta_slow": 1.0}},
        attention_bias=False, tie_word_embeddings=False, pad_token_id=None, **common), tok)
    if MiniMaxM2Config is None:
        print(f"transformers {transformers.__version__} has no MiniMaxM2ForCausalLM: "
              "minimax-m2/ is not made", file=sys.stderr)
    else:
        build(out, "minimax-m2", MiniMaxM2ForCausalLM, MiniMaxM2Config(
            hidden_size=512, intermediate_size=256, num_local_experts=8, num_experts_per_tok=2,
            num_hidden_layers=3, num_attention_heads=8, num_key_value_heads=2, head_dim=128,
            # transformers before 5.2x ignores `rotary_dim` (MiniMax's own field) and rotates
            # every dimension; the factor in the RoPE parameters says the same to every
            # version, and config.json keeps both.
            rotary_dim=64, rope_parameters={"rope_type": "default", "rope_theta": 10000.0,
                                            "partial_rotary_factor": 0.5},
            tie_word_embeddings=False, pad_token_id=None, **common), tok)
    build(out, "smollm3", SmolLM3ForCausalLM, SmolLM3Config(
        hidden_size=512, intermediate_size=1024, num_hidden_layers=4,
        num_attention_heads=8, num_key_value_heads=2, no_rope_layer_interval=4,
        rope_parameters={"rope_type": "default", "rope_theta": 5000000.0},
        tie_word_embeddings=False, pad_token_id=None, **common), tok)


if __name__ == "__main__":
    main()
    if FAILED:
        sys.exit(f"not made: {', '.join(FAILED)}")
