"""The random Qwen3-MoE that scripts/bench-moe times, made by transformers from a fixed
seed: hidden 512, 4 layers, 8 query / 4 KV heads of 64 with per-head q/k norms, 16
experts of 256 columns in every layer (top 4, renormalised), vocabulary 10000, untied
head. Written twice: an f32 safetensors folder, and a GGUF of the same weights in the
mix of types the test fixture uses (attention and head Q8_0, experts' gate and up Q4_1,
down Q5_0; embeddings, norms and routers f32).

    python bench-moe-model.py OUT_DIR     # writes OUT_DIR/qwen3-moe/ and OUT_DIR/qwen3-moe.gguf
"""
import os
import sys

import torch
from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(here, "..", "tests", "fixtures", "models"))
import make_qwen3_moe_quantized as quantized  # noqa: E402
import make_tiny_models as tiny  # noqa: E402

SEED = 20261124


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    out = sys.argv[1]
    torch.set_num_threads(2)
    config = Qwen3MoeConfig(
        vocab_size=10000, hidden_size=512, num_attention_heads=8, num_key_value_heads=4,
        head_dim=64, intermediate_size=1024, moe_intermediate_size=256, num_experts=16,
        num_experts_per_tok=4, norm_topk_prob=True, decoder_sparse_step=1,
        mlp_only_layers=[], num_hidden_layers=4, rms_norm_eps=1e-6, rope_theta=1000000.0,
        max_position_embeddings=4096, tie_word_embeddings=False, attention_bias=False,
        use_sliding_window=False, hidden_act="silu", bos_token_id=1, eos_token_id=2)
    path, model = tiny.build(out, "qwen3-moe", Qwen3MoeForCausalLM, config, SEED)
    tiny.init_routers(model, SEED + 1)
    model.save_pretrained(path, safe_serialization=True)
    tiny.write_gguf(path, config, "qwen3moe", os.path.join(out, "qwen3-moe.gguf"),
                    quant=quantized.quant_type)
    print(path)


if __name__ == "__main__":
    main()
