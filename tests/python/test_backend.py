"""select_backend on real models' config fields."""

import copy

import pytest

import mxmoe
from mxmoe import ActivationType

# Kimi-K3: compressed-tensors MXFP4 routed experts (group 32), SiTU, fields under text_config
# (SPEC sections 4 and 5); attention, shared experts and the dense layers stay bf16.
KIMI_K3 = {
    "architectures": ["KimiK3ForConditionalGeneration"],
    "model_type": "kimi_k3",
    "torch_dtype": "bfloat16",
    "text_config": {
        "model_type": "kimi_k3_text",
        "hidden_size": 7168,
        "routed_expert_hidden_size": 3584,
        "moe_intermediate_size": 3072,
        "num_experts": 896,
        "num_experts_per_token": 16,
        "num_shared_experts": 1,
        "hidden_act": "situ",
        "activation_situ_beta": 4.0,
        "activation_situ_linear_beta": 25.0,
        "scoring_func": "sigmoid",
        "routed_scaling_factor": 1.0,
        "topk_method": "noaux_tc",
    },
    "quantization_config": {
        "quant_method": "compressed-tensors",
        "format": "mxfp4-pack-quantized",
        "quantization_status": "compressed",
        "config_groups": {
            "group_0": {
                "targets": ["Linear"],
                "format": "mxfp4-pack-quantized",
                "weights": {"num_bits": 4, "type": "float", "strategy": "group", "group_size": 32,
                            "symmetric": True, "dynamic": False, "scale_dtype": "torch.uint8"},
                "input_activations": None,
                "output_activations": None,
            }
        },
        "ignore": ["lm_head", "re:.*self_attn.*", "re:.*shared_experts.*", "re:.*block_sparse_moe\\.gate$",
                   "re:vision_tower.*", "re:.*mlp\\.(gate|up|down)_proj$"],
    },
}

# The same with the fields at the top level (a text-only export).
KIMI_K3_FLAT = {k: v for k, v in KIMI_K3.items() if k != "text_config"}
KIMI_K3_FLAT.update(KIMI_K3["text_config"])
KIMI_K3_FLAT["model_type"] = "kimi_k3"

GPT_OSS_120B = {
    "architectures": ["GptOssForCausalLM"],
    "model_type": "gpt_oss",
    "hidden_size": 2880,
    "intermediate_size": 2880,
    "num_hidden_layers": 36,
    "num_local_experts": 128,
    "num_experts_per_tok": 4,
    "experts_per_token": 4,
    "hidden_act": "silu",
    "swiglu_limit": 7.0,
    "router_aux_loss_coef": 0.9,
    "quantization_config": {
        "quant_method": "mxfp4",
        "modules_to_not_convert": ["model.layers.*.self_attn", "model.layers.*.mlp.router",
                                   "model.embed_tokens", "lm_head"],
    },
}

DEEPSEEK_V3 = {
    "architectures": ["DeepseekV3ForCausalLM"],
    "model_type": "deepseek_v3",
    "hidden_size": 7168,
    "moe_intermediate_size": 2048,
    "n_routed_experts": 256,
    "n_shared_experts": 1,
    "num_experts_per_tok": 8,
    "n_group": 8,
    "topk_group": 4,
    "hidden_act": "silu",
    "scoring_func": "sigmoid",
    "topk_method": "noaux_tc",
    "routed_scaling_factor": 2.5,
    "quantization_config": {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8",
                            "weight_block_size": [128, 128]},
}

DEEPSEEK_V4 = copy.deepcopy(DEEPSEEK_V3)
DEEPSEEK_V4.update({"architectures": ["DeepseekV4ForCausalLM"], "model_type": "deepseek_v4", "n_routed_experts": 384})

QWEN2_MOE = {
    "architectures": ["Qwen2MoeForCausalLM"],
    "model_type": "qwen2_moe",
    "hidden_size": 2048,
    "intermediate_size": 5632,
    "moe_intermediate_size": 1408,
    "shared_expert_intermediate_size": 5632,
    "num_experts": 60,
    "num_experts_per_tok": 4,
    "norm_topk_prob": False,
    "hidden_act": "silu",
    "torch_dtype": "bfloat16",
}

QWEN3_MOE = {
    "architectures": ["Qwen3MoeForCausalLM"],
    "model_type": "qwen3_moe",
    "hidden_size": 2048,
    "moe_intermediate_size": 768,
    "num_experts": 128,
    "num_experts_per_tok": 8,
    "norm_topk_prob": True,
    "hidden_act": "silu",
    "torch_dtype": "bfloat16",
}

LLAMA_DENSE = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 4096,
               "intermediate_size": 14336, "hidden_act": "silu"}

# Kimi-K3's experts left out of the MXFP4 group: nothing for mxmoe.
KIMI_K3_EXPERTS_IGNORED = copy.deepcopy(KIMI_K3)
KIMI_K3_EXPERTS_IGNORED["quantization_config"]["ignore"].append("re:.*block_sparse_moe\\.experts.*")

# NVFP4 (group 16, fp8 scales) is not MXFP4.
KIMI_K3_NVFP4 = copy.deepcopy(KIMI_K3)
KIMI_K3_NVFP4["quantization_config"]["format"] = "nvfp4-pack-quantized"
KIMI_K3_NVFP4["quantization_config"]["config_groups"]["group_0"].update(
    {"format": "nvfp4-pack-quantized", "weights": {"num_bits": 4, "type": "float", "strategy": "tensor_group",
                                                   "group_size": 16}})

KIMI_K3_BF16 = copy.deepcopy(KIMI_K3)
del KIMI_K3_BF16["quantization_config"]

UNKNOWN_ACT = copy.deepcopy(KIMI_K3)
UNKNOWN_ACT["text_config"]["hidden_act"] = "xielu"

SM120, SM90, SM100, SM80 = (12, 0), (9, 0), (10, 0), (8, 0)

CASES = [
    # config, capability, use_mxmoe, words the reason must hold
    (KIMI_K3, SM120, True, ["MXFP4", "Situ", "SM120"]),
    (KIMI_K3, SM90, True, ["SM90"]),
    (KIMI_K3, (12, 1), True, ["SM120"]),
    (KIMI_K3, (9, 0), True, ["only mxmoe"]),
    (KIMI_K3_FLAT, SM120, True, ["Situ"]),
    (KIMI_K3, SM100, False, ["compute capability 10.0"]),
    (KIMI_K3, SM80, False, ["compute capability 8.0"]),
    (GPT_OSS_120B, SM90, False, ["gpt_oss", "SwigluBias", "engine"]),
    (GPT_OSS_120B, SM120, False, ["MXFP4", "engine"]),
    (DEEPSEEK_V3, SM90, False, ["deepseek_v3", "fp8", "not MXFP4"]),
    (DEEPSEEK_V4, SM120, False, ["deepseek_v4", "fp8"]),
    (QWEN2_MOE, SM90, False, ["qwen2_moe", "unquantized"]),
    (QWEN3_MOE, SM120, False, ["qwen3_moe", "unquantized"]),
    (LLAMA_DENSE, SM90, False, ["not a mixture-of-experts"]),
    ({}, SM90, False, ["not a mixture-of-experts"]),
    (KIMI_K3_EXPERTS_IGNORED, SM120, False, ["not MXFP4"]),
    (KIMI_K3_NVFP4, SM120, False, ["nvfp4"]),
    (KIMI_K3_BF16, SM120, False, ["unquantized"]),
    (UNKNOWN_ACT, SM120, False, ["xielu"]),
]


@pytest.mark.parametrize("config,capability,use,words", CASES)
def test_table(config, capability, use, words):
    choice = mxmoe.select_backend(config, capability)
    assert isinstance(choice, mxmoe.BackendChoice)
    assert choice.use_mxmoe is use, choice.reason
    for word in words:
        assert word in choice.reason, (word, choice.reason)


def test_activation_reported():
    assert mxmoe.select_backend(KIMI_K3, SM120).activation is ActivationType.Situ
    assert mxmoe.select_backend(GPT_OSS_120B, SM90).activation is ActivationType.SwigluBias
    assert mxmoe.select_backend(DEEPSEEK_V3, SM90).activation is ActivationType.Swiglu


def test_only_situ_is_mxmoe_only():
    from mxmoe.backend import MXMOE_ONLY_ACTIVATIONS
    assert MXMOE_ONLY_ACTIVATIONS == {ActivationType.Situ}


def test_bad_arguments():
    with pytest.raises(ValueError, match="device_capability"):
        mxmoe.select_backend(KIMI_K3, "sm_120")
    with pytest.raises(ValueError, match="model_config"):
        mxmoe.select_backend("config.json", SM120)
