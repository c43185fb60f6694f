"""Tiny seeded random models of every supported family, built from HF configs (no downloads).

For tests, examples and benchmarks: ``tiny_model("llama")`` gives a 2-layer, width-64 model with a small
word-level tokenizer and a chat template, wrapped as an :class:`~interp.models.Model`.
"""

from __future__ import annotations

from typing import Any

import torch

from interp.models import Model, from_hf

FAMILIES = ("llama", "mistral", "qwen2", "qwen3", "gemma2", "gemma3_text", "phi3", "gpt2", "gpt_neox", "olmo2",
            "mixtral", "qwen2_moe", "qwen3_moe", "olmoe")
MOE_FAMILIES = ("mixtral", "qwen2_moe", "qwen3_moe", "olmoe")

_WORDS = ("the a an of to and in is it you that he she was for on are with as i his they be at one have this "
          "from or had by word but what some we can out other were all there when up use your how said each "
          "which do their time if will way about many then them write would like so these her long make thing "
          "see him two has look more day could go come did number sound no most people my over know water "
          "than call first who may down side been now find any new work part take get place made live where "
          "after back little only round man year came show every good me give our under name very through just "
          "form sentence great think say help low line differ turn cause much mean before move right boy old "
          "too same tell does set three want air well also play small end put home read hand port large spell "
          "add even land here must big high such follow act why ask men change went light kind off need house "
          "picture try us again animal point mother world near build self earth father").split()
SPECIALS = ["<pad>", "<bos>", "<eos>", "<unk>", "<|user|>", "<|assistant|>", "<|end|>"]
CHAT_TEMPLATE = ("{{ bos_token }}{% for m in messages %}{% if m['role'] == 'user' %}<|user|> {{ m['content'] }} <|end|>"
                 "{% elif m['role'] == 'system' %}{{ m['content'] }} {% else %}<|assistant|> {{ m['content'] }} <|end|>"
                 "{% endif %}{% endfor %}{% if add_generation_prompt %}<|assistant|>{% endif %}")


def tiny_tokenizer(vocab_size: int = 256) -> Any:
    """A word-level tokenizer of ``vocab_size`` entries (specials, common words, ``.,?!`` and digits)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = list(dict.fromkeys(SPECIALS + list(".,?!:;'\"-0123456789") + _WORDS))[:vocab_size]
    vocab = {w: i for i, w in enumerate(words)}
    tk = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tk.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.WhitespaceSplit(), pre_tokenizers.Punctuation()])
    tok = PreTrainedTokenizerFast(tokenizer_object=tk, pad_token="<pad>", bos_token="<bos>", eos_token="<eos>",
                                  unk_token="<unk>", additional_special_tokens=SPECIALS[4:])
    tok.chat_template = CHAT_TEMPLATE
    tok.padding_side = "left"
    return tok


def tiny_config(family: str, vocab_size: int = 256, d_model: int = 64, n_layers: int = 2, **overrides: Any) -> Any:
    """An HF config of ``family`` small enough to run in milliseconds."""
    import transformers as T

    ids = dict(pad_token_id=0, bos_token_id=1, eos_token_id=2)
    common = dict(vocab_size=vocab_size, hidden_size=d_model, intermediate_size=2 * d_model, num_hidden_layers=n_layers,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128, **ids)
    moe = dict(num_experts_per_tok=2)
    table: dict[str, Any] = {
        "llama": lambda: T.LlamaConfig(**common),
        "mistral": lambda: T.MistralConfig(**common, sliding_window=None),
        "qwen2": lambda: T.Qwen2Config(**common),
        "qwen3": lambda: T.Qwen3Config(**common, head_dim=d_model // 4),
        "gemma2": lambda: T.Gemma2Config(**common, head_dim=d_model // 4, query_pre_attn_scalar=d_model // 4),
        "gemma3_text": lambda: T.Gemma3TextConfig(**common, head_dim=d_model // 4, query_pre_attn_scalar=d_model // 4),
        "phi3": lambda: T.Phi3Config(**common),
        "olmo2": lambda: T.Olmo2Config(**common),
        "gpt2": lambda: T.GPT2Config(vocab_size=vocab_size, n_embd=d_model, n_layer=n_layers, n_head=4, n_positions=128,
                                     **ids),
        "gpt_neox": lambda: T.GPTNeoXConfig(vocab_size=vocab_size, hidden_size=d_model, num_hidden_layers=n_layers,
                                            num_attention_heads=4, intermediate_size=2 * d_model,
                                            max_position_embeddings=128, **ids),
        "mixtral": lambda: T.MixtralConfig(**common, num_local_experts=4, **moe),
        "qwen2_moe": lambda: T.Qwen2MoeConfig(**common, num_experts=4, moe_intermediate_size=d_model,
                                              shared_expert_intermediate_size=2 * d_model, **moe),
        "qwen3_moe": lambda: T.Qwen3MoeConfig(**common, num_experts=4, moe_intermediate_size=d_model,
                                              head_dim=d_model // 4, **moe),
        "olmoe": lambda: T.OlmoeConfig(**common, num_experts=4, **moe),
    }
    if family not in table:
        raise ValueError(f"unknown tiny family {family!r}; choose from {FAMILIES}")
    cfg = table[family]()
    for k, v in overrides.items():
        setattr(cfg, k, v)
    return cfg


def tiny_model(family: str = "llama", seed: int = 0, dtype: torch.dtype = torch.float32,
               attn_implementation: str | None = None, **overrides: Any) -> Model:
    """A seeded random ``family`` model with :func:`tiny_tokenizer`, in eval mode."""
    from transformers import AutoModelForCausalLM

    cfg = tiny_config(family, **overrides)
    torch.manual_seed(seed)
    kw = {"attn_implementation": attn_implementation} if attn_implementation else {}
    hf = AutoModelForCausalLM.from_config(cfg, dtype=dtype, **kw)
    with torch.no_grad():  # random init of norms is all-ones; perturb so norm placement bugs show up
        for name, p in hf.named_parameters():
            if p.dim() == 1 and ("norm" in name or ".ln_" in name):
                p.add_(0.1 * torch.randn_like(p))
    return from_hf(hf.eval(), tiny_tokenizer(cfg.vocab_size), name=f"tiny-{family}")
