"""Random-weight benchmark models with the shapes of Llama-3.2-1B and Llama-3.1-8B, and
8 of the 48 layers of Qwen3-30B-A3B (a mixture of 128 experts, 8 chosen per token; bf16
safetensors), for scripts/bench-gpu. Weights are drawn on the GPU from a fixed seed and
written straight to safetensors; their values do not matter to speed. The tokenizer is
make_models.py's small BPE padded with plain added tokens to the models' 128256 entries,
so every id the model can produce decodes.

  python3 make_bench_models.py OUT_DIR [1b|8b|moe ...]
"""
import json
import os
import sys

import torch
from safetensors.torch import save_file

sys.path.insert(0, os.path.dirname(__file__))
import make_models  # noqa: E402

SHAPES = {
    "1b": dict(hidden_size=2048, intermediate_size=8192, num_hidden_layers=16,
               num_attention_heads=32, num_key_value_heads=8, head_dim=64,
               tie_word_embeddings=True, rope_theta=500000.0),
    "8b": dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
               num_attention_heads=32, num_key_value_heads=8, head_dim=128,
               tie_word_embeddings=False, rope_theta=500000.0),
    # Qwen3-30B-A3B's layer, 8 of its 48 layers: 10.7 GB, 0.33 GB read per token.
    "moe": dict(hidden_size=2048, intermediate_size=6144, moe_intermediate_size=768,
                num_experts=128, num_experts_per_tok=8, norm_topk_prob=True,
                decoder_sparse_step=1, mlp_only_layers=[], num_hidden_layers=8,
                num_attention_heads=32, num_key_value_heads=4, head_dim=128,
                tie_word_embeddings=False, rope_theta=1000000.0),
}
# Each shape's folder name, and the architecture its config.json names.
FOLDERS = {"1b": "llama-1b", "8b": "llama-8b", "moe": "qwen3-moe-a3b"}
VOCAB = 128256
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def tokenizer():
    tok = make_models.make_tokenizer(1024)
    base = tok.get_vocab_size()
    tok.add_tokens([f"<|t{i}|>" for i in range(base, VOCAB)])
    assert tok.get_vocab_size() == VOCAB, tok.get_vocab_size()
    return tok


def tensors(shape, gen):
    h, f = shape["hidden_size"], shape["intermediate_size"]
    hd, nq, nkv = shape["head_dim"], shape["num_attention_heads"], shape["num_key_value_heads"]

    def randn(*dims):
        return (0.02 * torch.randn(*dims, generator=gen, device=DEVICE)).to(torch.bfloat16)

    out = {"model.embed_tokens.weight": randn(VOCAB, h),
           "model.norm.weight": torch.ones(h, dtype=torch.bfloat16, device=DEVICE)}
    if not shape["tie_word_embeddings"]:
        out["lm_head.weight"] = randn(VOCAB, h)
    for i in range(shape["num_hidden_layers"]):
        p = f"model.layers.{i}."
        out[p + "input_layernorm.weight"] = torch.ones(h, dtype=torch.bfloat16, device=DEVICE)
        out[p + "post_attention_layernorm.weight"] = torch.ones(h, dtype=torch.bfloat16, device=DEVICE)
        out[p + "self_attn.q_proj.weight"] = randn(nq * hd, h)
        out[p + "self_attn.k_proj.weight"] = randn(nkv * hd, h)
        out[p + "self_attn.v_proj.weight"] = randn(nkv * hd, h)
        out[p + "self_attn.o_proj.weight"] = randn(h, nq * hd)
        if "num_experts" in shape:
            ones = torch.ones(hd, dtype=torch.bfloat16, device=DEVICE)
            out[p + "self_attn.q_norm.weight"] = ones
            out[p + "self_attn.k_norm.weight"] = ones.clone()
            out[p + "mlp.gate.weight"] = randn(shape["num_experts"], h)
            mi = shape["moe_intermediate_size"]
            for e in range(shape["num_experts"]):
                q = f"{p}mlp.experts.{e}."
                out[q + "gate_proj.weight"] = randn(mi, h)
                out[q + "up_proj.weight"] = randn(mi, h)
                out[q + "down_proj.weight"] = randn(h, mi)
            continue
        out[p + "mlp.gate_proj.weight"] = randn(f, h)
        out[p + "mlp.up_proj.weight"] = randn(f, h)
        out[p + "mlp.down_proj.weight"] = randn(h, f)
    return {k: v.cpu() for k, v in out.items()}


def main():
    out = sys.argv[1]
    which = sys.argv[2:] or list(SHAPES)
    tok = tokenizer()
    gen = torch.Generator(device=DEVICE).manual_seed(make_models.SEED)
    for name in which:
        shape = SHAPES[name]
        path = os.path.join(out, FOLDERS[name])
        os.makedirs(path, exist_ok=True)
        arch = (["Qwen3MoeForCausalLM"], "qwen3_moe") if "num_experts" in shape else (
            ["LlamaForCausalLM"], "llama")
        config = dict(shape, architectures=arch[0], model_type=arch[1],
                      vocab_size=VOCAB, rms_norm_eps=1e-5, max_position_embeddings=8192,
                      hidden_act="silu", torch_dtype="bfloat16", bos_token_id=None,
                      eos_token_id=tok.token_to_id("<|im_end|>"))
        with open(os.path.join(path, "config.json"), "w") as f:
            json.dump(config, f, indent=1)
        make_models.save_tokenizer(tok, path)
        weights = tensors(shape, gen)
        params = sum(t.numel() for t in weights.values())
        save_file(weights, os.path.join(path, "model.safetensors"), metadata={"format": "pt"})
        print(f"{path}: {params / 1e9:.2f}B parameters", file=sys.stderr)


if __name__ == "__main__":
    main()
