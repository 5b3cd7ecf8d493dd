"""The byte-level BPE tokenizers the demo recipe and the test fixtures train."""

import pytest
from transformers import AutoTokenizer

from fixtures.tiny_models import tokenizer_corpus
from engine.models.tokenizer_files import train_bpe_tokenizer


@pytest.mark.parametrize("split, consistent", [("qwen2", True), ("gpt2", False)])
def test_a_prompt_ending_in_a_newline_tokenizes_as_the_text_would(tmp_path, split, consistent):
    """With Qwen's split, 'def f(n):\\n' encodes as a prefix of the same text with the body after it,
    so the prompt ends in a token the model saw before indented lines. GPT-2's split joins the
    newline to the indentation, which a prompt cut at the newline never shows."""
    train_bpe_tokenizer(tokenizer_corpus(), tmp_path, 512, split=split)
    tok = AutoTokenizer.from_pretrained(str(tmp_path))
    prompt, full = "def main(args):\n", "def main(args):\n    return args\n"
    head = tok.encode(prompt)
    assert (tok.encode(full)[: len(head)] == head) is consistent
    assert tok.decode(tok.encode(full)) == full


def test_unknown_split_is_refused(tmp_path):
    with pytest.raises(ValueError, match="qwen2"):
        train_bpe_tokenizer(tokenizer_corpus(), tmp_path, 512, split="bert")
