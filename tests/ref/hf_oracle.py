#!/usr/bin/env python3
"""hf_oracle.py: Hugging Face transformers as the oracle for `kiln convert hf` (tests/test_hf_oracle.c).

For each architecture kiln converts, the model is built with transformers from its real published config (the
dicts below, with the model id each came from), shrunk to a few layers of width 256 (4 heads, 2 KV heads,
head_dim 64, FFN 512, vocab 512) but keeping every feature flag, and a small original context (64) where the
model has RoPE scaling, so that the 80 positions of the test sequence go past it. Weights are random from a fixed
seed: the embedding and head with std 0.1 (logits of std ~1.5: a top-1 margin the comparison can see), the layers'
matrices with std 0.5/sqrt(fan_in) (so a layer's update does not swamp the residual and the network stays tame
enough for a 4-bit weight's error to stay small). Each folder gets
  config.json, model.safetensors (float32), the tokenizer (a byte-level BPE made with `tokenizers`, or a BPE
  SentencePiece model trained with sentencepiece as Llama's was: spm_model below),
  tokenizer_config.json, and
  oracle.json  {"tokens": the 80 input ids, "greedy": transformers' 8-token greedy continuation,
                "n_vocab": V, "text": a sample text, "text_ids": the tokenizer's ids of it (no specials)}
  logits.bin   transformers' float32 logits of the 80 tokens, [80][V] little-endian;
  unscaled/    where the config scales RoPE: the same folder with the scaling taken out of config.json.
Usage: hf_oracle.py OUT_DIR [NAME...]    (OUT_DIR is build/hf: generated at test time, never committed)
"""
import json
import os
import shutil
import sys

import numpy as np
import torch
import transformers
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

T_INPUT, N_GREEDY, V = 80, 8, 512
SMALL = dict(hidden_size=256, num_attention_heads=4, num_key_value_heads=2, head_dim=64, intermediate_size=512,
             vocab_size=V)
TEXT = "Hello world! The quick brown fox jumps over 12345 lazy dogs.\nIt's a test: don't panic, we'll see."
CORPUS = [TEXT, "Once upon a time there was a little girl who loved the sun and the sea.",
          "def main():\n    return 42  # the answer", "Numbers 0 1 2 3 4 5 6 7 8 9 10 100 1000 and more words."] * 50

# The published configs (config.json of each model id on the Hugging Face hub), as they are: the test shrinks them.
CONFIGS = {
    "llama3": ("meta-llama/Llama-3.2-1B", {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "attention_bias": False, "attention_dropout": 0.0,
        "bos_token_id": 128000, "eos_token_id": 128001, "head_dim": 64, "hidden_act": "silu", "hidden_size": 2048,
        "initializer_range": 0.02, "intermediate_size": 8192, "max_position_embeddings": 131072, "mlp_bias": False,
        "num_attention_heads": 32, "num_hidden_layers": 16, "num_key_value_heads": 8, "pretraining_tp": 1,
        "rms_norm_eps": 1e-05, "rope_theta": 500000.0, "tie_word_embeddings": True, "vocab_size": 128256,
        "rope_scaling": {"factor": 32.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                         "original_max_position_embeddings": 8192, "rope_type": "llama3"}}),
    "mistral": ("mistralai/Mistral-7B-v0.1", {
        "architectures": ["MistralForCausalLM"], "model_type": "mistral", "bos_token_id": 1, "eos_token_id": 2,
        "hidden_act": "silu", "hidden_size": 4096, "initializer_range": 0.02, "intermediate_size": 14336,
        "max_position_embeddings": 32768, "num_attention_heads": 32, "num_hidden_layers": 32,
        "num_key_value_heads": 8, "rms_norm_eps": 1e-05, "rope_theta": 10000.0, "sliding_window": 4096,
        "tie_word_embeddings": False, "vocab_size": 32000}),
    "qwen2": ("Qwen/Qwen2.5-0.5B", {
        "architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "attention_dropout": 0.0,
        "bos_token_id": 151643, "eos_token_id": 151643, "hidden_act": "silu", "hidden_size": 896,
        "initializer_range": 0.02, "intermediate_size": 4864, "max_position_embeddings": 32768,
        "max_window_layers": 24, "num_attention_heads": 14, "num_hidden_layers": 24, "num_key_value_heads": 2,
        "rms_norm_eps": 1e-06, "rope_theta": 1000000.0, "sliding_window": 32768, "tie_word_embeddings": True,
        "use_sliding_window": False, "vocab_size": 151936}),
    "qwen3": ("Qwen/Qwen3-0.6B", {
        "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "attention_bias": False,
        "attention_dropout": 0.0, "bos_token_id": 151643, "eos_token_id": 151645, "head_dim": 128,
        "hidden_act": "silu", "hidden_size": 1024, "initializer_range": 0.02, "intermediate_size": 3072,
        "max_position_embeddings": 40960, "max_window_layers": 28, "num_attention_heads": 16,
        "num_hidden_layers": 28, "num_key_value_heads": 8, "rms_norm_eps": 1e-06, "rope_scaling": None,
        "rope_theta": 1000000, "sliding_window": None, "tie_word_embeddings": True, "use_sliding_window": False,
        "vocab_size": 151936}),
    "phi3": ("microsoft/Phi-3-mini-128k-instruct", {
        "architectures": ["Phi3ForCausalLM"], "model_type": "phi3", "attention_bias": False,
        "attention_dropout": 0.0, "bos_token_id": 1, "embd_pdrop": 0.0, "eos_token_id": 32000, "hidden_act": "silu",
        "hidden_size": 3072, "initializer_range": 0.02, "intermediate_size": 8192, "max_position_embeddings": 131072,
        "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 32,
        "original_max_position_embeddings": 4096, "pad_token_id": 32000, "resid_pdrop": 0.0, "rms_norm_eps": 1e-05,
        # the 48 published factors per list do not fit head_dim 64 (32 entries): the shrink below makes its own
        "rope_scaling": {"long_factor": None, "short_factor": None, "type": "longrope"},
        "rope_theta": 10000.0, "sliding_window": 262144, "tie_word_embeddings": False, "vocab_size": 32064}),
    "gemma2": ("google/gemma-2-2b", {
        "architectures": ["Gemma2ForCausalLM"], "model_type": "gemma2", "attention_bias": False,
        "attention_dropout": 0.0, "attn_logit_softcapping": 50.0, "bos_token_id": 2, "eos_token_id": 1,
        "final_logit_softcapping": 30.0, "head_dim": 256, "hidden_act": "gelu_pytorch_tanh",
        "hidden_activation": "gelu_pytorch_tanh", "hidden_size": 2304, "initializer_range": 0.02,
        "intermediate_size": 9216, "max_position_embeddings": 8192, "num_attention_heads": 8,
        "num_hidden_layers": 26, "num_key_value_heads": 4, "pad_token_id": 0, "query_pre_attn_scalar": 256,
        "rms_norm_eps": 1e-06, "rope_theta": 10000.0, "sliding_window": 4096, "vocab_size": 256000}),
    "gemma3": ("google/gemma-3-270m", {
        "architectures": ["Gemma3ForCausalLM"], "model_type": "gemma3_text", "attention_bias": False,
        "attention_dropout": 0.0, "attn_logit_softcapping": None, "bos_token_id": 2, "eos_token_id": 1,
        "final_logit_softcapping": None, "head_dim": 256, "hidden_activation": "gelu_pytorch_tanh",
        "hidden_size": 640, "initializer_range": 0.02, "intermediate_size": 2048, "max_position_embeddings": 32768,
        "num_attention_heads": 4, "num_hidden_layers": 18, "num_key_value_heads": 1, "pad_token_id": 0,
        "query_pre_attn_scalar": 256, "rms_norm_eps": 1e-06, "rope_local_base_freq": 10000.0, "rope_scaling": None,
        "rope_theta": 1000000.0, "sliding_window": 512, "_sliding_window_pattern": 6,
        "use_bidirectional_attention": False, "vocab_size": 262144}),
    "smollm3": ("HuggingFaceTB/SmolLM3-3B", {
        "architectures": ["SmolLM3ForCausalLM"], "model_type": "smollm3", "attention_bias": False,
        "attention_dropout": 0.0, "bos_token_id": None, "eos_token_id": 128012, "hidden_act": "silu",
        "hidden_size": 2048, "initializer_range": 0.02, "intermediate_size": 11008, "max_position_embeddings": 65536,
        "max_window_layers": 28, "mlp_bias": False, "no_rope_layer_interval": 4, "num_attention_heads": 16,
        "num_hidden_layers": 36, "num_key_value_heads": 4, "pad_token_id": 128004, "pretraining_tp": 2,
        "rms_norm_eps": 1e-06, "rope_scaling": None, "rope_theta": 5000000.0, "sliding_window": None,
        "tie_word_embeddings": True, "use_sliding_window": False, "vocab_size": 128256}),
    "olmo2": ("allenai/OLMo-2-0425-1B", {
        "architectures": ["Olmo2ForCausalLM"], "model_type": "olmo2", "attention_bias": False,
        "attention_dropout": 0.0, "eos_token_id": 100257, "hidden_act": "silu", "hidden_size": 2048,
        "initializer_range": 0.02, "intermediate_size": 8192, "max_position_embeddings": 4096,
        "num_attention_heads": 16, "num_hidden_layers": 16, "num_key_value_heads": 16, "pad_token_id": 100277,
        "rms_norm_eps": 1e-06, "rope_scaling": None, "rope_theta": 500000, "tie_word_embeddings": False,
        "vocab_size": 100352}),
}

# Which tokenizer each gets: SentencePiece for the families that ship tokenizer.model, else a byte-level BPE with
# the family's pre-tokenizer ("gpt2": ByteLevel's own regex; "llama3", "qwen2": their Split regexes).
TOKENIZER = {"llama3": "llama3", "mistral": "spm", "qwen2": "qwen2", "qwen3": "qwen2", "phi3": "spm", "gemma2": "spm",
             "gemma3": "spm", "smollm3": "llama3", "olmo2": "gpt2"}
SPLIT = {
    "llama3": r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
    "qwen2": r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
}


def shrink(name, cfg):
    c = {k: v for k, v in cfg.items()}
    c.update(SMALL)
    c["num_hidden_layers"] = 6 if name == "gemma3" else 4  # gemma3: five sliding layers, then a global one
    c.pop("torch_dtype", None)
    c["bos_token_id"], c["eos_token_id"] = 1, 2
    if "pad_token_id" in c:
        c["pad_token_id"] = 0
    if name == "llama3":
        c["max_position_embeddings"] = 2048
        c["rope_scaling"] = dict(cfg["rope_scaling"], original_max_position_embeddings=64)
    if name == "phi3":  # keep 128k/4k = 32 as 2048/64, and make factors of the right length (short ~1, long rising)
        c["max_position_embeddings"], c["original_max_position_embeddings"] = 2048, 64
        half = c["head_dim"] // 2
        c.pop("head_dim")  # Phi-3 has none: hidden_size / heads
        c["num_key_value_heads"] = 2
        c["rope_scaling"] = {"type": "longrope", "short_factor": [1.0 + 0.01 * i for i in range(half)],
                             "long_factor": [1.0 + 1.5 * i for i in range(half)]}
        c["sliding_window"] = 2047
    if name in ("gemma2", "gemma3"):
        c["sliding_window"] = 16  # so that the 80 positions slide
        c["query_pre_attn_scalar"] = c["head_dim"]
        c["layer_types"] = (["sliding_attention", "full_attention"] * 2 if name == "gemma2"
                            else ["sliding_attention"] * 5 + ["full_attention"])
    if name == "smollm3":
        c["no_rope_layers"] = [1, 1, 1, 0]  # the fourth layer has no RoPE (no_rope_layer_interval 4)
    if name in ("qwen2",):
        c["max_window_layers"] = 4
    return c


def make_bpe(kind):
    tok = Tokenizer(models.BPE(ignore_merges=kind == "llama3"))
    if kind == "gpt2":
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    else:
        tok.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(pattern=__import__("tokenizers").Regex(SPLIT[kind]), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=V, special_tokens=["<unk>", "<s>", "</s>"], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(CORPUS, trainer)
    return tok


def spm_model(work):
    """A BPE SentencePiece model trained as Llama's and Mistral's were: identity normalization (no NFKC, newlines
    kept: they become byte tokens), a dummy prefix, whitespace kept, digits split, byte fallback. Trained here in
    every run, so CI (without ../shared) and a developer's machine check the same tokenizer; tests/test_hf_convert.c
    covers the real tok512.model."""
    import sentencepiece as spm
    path = os.path.join(work, "spm")
    with open(path + ".txt", "w") as f:
        f.write("\n".join(CORPUS))
    spm.SentencePieceTrainer.train(input=path + ".txt", model_prefix=path, vocab_size=V, byte_fallback=True,
                                   model_type="bpe", normalization_rule_name="identity", add_dummy_prefix=True,
                                   remove_extra_whitespaces=False, split_digits=True, minloglevel=2)
    return path + ".model"


def write_tokenizer(out, kind, work):
    tc = {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"}
    if kind == "spm":
        import sentencepiece as spm
        src = spm_model(work)
        shutil.copy(src, os.path.join(out, "tokenizer.model"))
        sp = spm.SentencePieceProcessor(model_file=src)
        ids = sp.encode(TEXT)
        n = sp.get_piece_size()
        tc["add_bos_token"], tc["tokenizer_class"] = True, "LlamaTokenizer"
    else:
        tok = make_bpe(kind)
        tok.save(os.path.join(out, "tokenizer.json"))
        ids = tok.encode(TEXT, add_special_tokens=False).ids
        n = tok.get_vocab_size()
        tc["add_bos_token"] = False
    with open(os.path.join(out, "tokenizer_config.json"), "w") as f:
        json.dump(tc, f)
    assert n <= V, (kind, n)
    return ids


def build(name, root):
    model_id, published = CONFIGS[name]
    cfg = shrink(name, published)
    out = os.path.join(root, name)
    shutil.rmtree(out, ignore_errors=True)
    os.makedirs(out)
    torch.manual_seed(1234)
    config = transformers.AutoConfig.for_model(cfg.pop("model_type"), **cfg)
    config.architectures = cfg["architectures"]
    model = transformers.AutoModelForCausalLM.from_config(config, torch_dtype=torch.float32).eval()
    gemma = name.startswith("gemma")
    with torch.no_grad():
        for pname, p in model.named_parameters():
            if p.dim() >= 2 and ("embed_tokens" in pname or "lm_head" in pname):
                p.normal_(0.0, 0.1)  # the head: logits of std ~1.5
            elif p.dim() >= 2:
                p.normal_(0.0, 0.5 / p.shape[1] ** 0.5)  # each layer's update about half the residual's size
            elif "norm" in pname:
                p.normal_(0.0, 0.1) if gemma else p.normal_(1.0, 0.1)  # Gemma's norms are 1 + w
            else:
                p.normal_(0.0, 0.1)
    model.save_pretrained(out, safe_serialization=True)
    text_ids = write_tokenizer(out, TOKENIZER[name], root)
    g = torch.Generator().manual_seed(99)
    tokens = torch.randint(3, V, (1, T_INPUT), generator=g)
    with torch.no_grad():
        logits = model(tokens).logits[0].float().numpy()
        seq = tokens
        greedy = []
        for _ in range(N_GREEDY):  # plain argmax steps, as kiln_session_eval_argmax
            nxt = int(model(seq).logits[0, -1].argmax())
            greedy.append(nxt)
            seq = torch.cat([seq, torch.tensor([[nxt]])], dim=1)
    np.ascontiguousarray(logits, dtype="<f4").tofile(os.path.join(out, "logits.bin"))
    with open(os.path.join(out, "oracle.json"), "w") as f:
        json.dump({"model_id": model_id, "tokens": tokens[0].tolist(), "greedy": greedy, "n_vocab": V,
                   "text": TEXT, "text_ids": text_ids, "transformers": transformers.__version__}, f)
    if "rope_scaling" in published and published["rope_scaling"]:
        # the same model without its RoPE scaling: the test tells a kiln that ignores the scaling by equal logits
        plain = os.path.join(out, "unscaled")
        os.makedirs(plain)
        for f in os.listdir(out):
            if f not in ("config.json", "unscaled"):
                os.symlink(os.path.join("..", f), os.path.join(plain, f))
        with open(os.path.join(out, "config.json")) as f:
            c = json.load(f)
        for k in ("rope_scaling", "rope_parameters"):
            if isinstance(c.get(k), dict):
                c[k] = {kk: vv for kk, vv in c[k].items() if kk == "rope_theta"} | {"rope_type": "default"}
        with open(os.path.join(plain, "config.json"), "w") as f:
            json.dump(c, f)
    print(f"{name}: {model_id} shrunk, logits std {logits.std():.3f}")


def main():
    root = sys.argv[1]
    names = sys.argv[2:] or list(CONFIGS)
    os.makedirs(root, exist_ok=True)
    for n in names:
        build(n, root)


if __name__ == "__main__":
    main()
