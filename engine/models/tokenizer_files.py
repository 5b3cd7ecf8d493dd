"""Write a real Hugging Face tokenizer folder (byte-level BPE) from text.

Used by the tests' fixture checkpoints and by the demo pair's recipe, so both
load through exactly the code path a user's model takes (mlx-lm -> transformers).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Iterable, Optional

EOS_TOKEN = "<|endoftext|>"
MASK_TOKEN = "<|mask|>"
CHAT_TOKENS = ["<|im_start|>", "<|im_end|>"]
SPECIAL_TOKENS = [EOS_TOKEN, MASK_TOKEN] + CHAT_TOKENS  # what train_bpe_tokenizer adds, in id order


def special_ids(tokenizer) -> dict[str, Optional[int]]:
    """SPECIAL_TOKENS' ids in a `tokenizers.Tokenizer` (None for one it lacks)."""
    return {name: tokenizer.token_to_id(name) for name in SPECIAL_TOKENS}

# A ChatML template, as Qwen uses; `add_generation_prompt` opens the assistant turn.
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


# Qwen2/Qwen3's pre-tokenizer split. Unlike GPT-2's, it never joins a newline to the indentation
# after it, so a prompt that ends in a newline ends in a token the model saw before indented lines.
QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|"
    r"\s+(?!\S)|\s+"
)


def train_bpe_tokenizer(
    texts: Iterable[str],
    out_dir: str | Path,
    vocab_size: int,
    chat_template: bool = True,
    split: str = "gpt2",
) -> dict[str, int]:
    """Train a byte-level BPE on `texts`, save it to `out_dir`; return the special ids.

    split: "gpt2" (ByteLevel's own regex) or "qwen2" (QWEN2_SPLIT, as Qwen's tokenizers)."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    if split == "qwen2":
        tokenizer.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(QWEN2_SPLIT), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ])
    elif split == "gpt2":
        tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    else:
        raise ValueError(f"split '{split}' is not one of: gpt2, qwen2")
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(texts, trainer=trainer)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(out / "tokenizer.json"))
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "eos_token": EOS_TOKEN,
        "pad_token": EOS_TOKEN,
        "model_max_length": 32768,
        "clean_up_tokenization_spaces": False,
    }
    if chat_template:
        config["chat_template"] = CHAT_TEMPLATE
    (out / "tokenizer_config.json").write_text(json.dumps(config, indent=2))
    return special_ids(tokenizer)
