"""A tiny word-level tokenizer for the live tests, built with the `tokenizers` library and
saved as a Hugging Face folder (tokenizer.json + tokenizer_config.json), so that
`sglang.benchmark.serving --tokenizer DIR` and the stand-in server count the same tokens
without any download."""

from __future__ import annotations

import json
from pathlib import Path

VOCAB_WORDS = 2000


def build_tiny_tokenizer(folder: str | Path) -> Path:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    vocab = {"[UNK]": 0, "[EOS]": 1}
    for i in range(VOCAB_WORDS):
        vocab[f"w{i}"] = len(vocab)
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.decoder = decoders.WordPiece(prefix="##")  # joins words with spaces
    tok.add_special_tokens(["[UNK]", "[EOS]"])
    tok.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(
        json.dumps(
            {
                "tokenizer_class": "PreTrainedTokenizerFast",
                "model_max_length": 1000000,
                "unk_token": "[UNK]",
                "eos_token": "[EOS]",
                "chat_template": "{% for m in messages %}{{ m['content'] if m['content'] is string else '' }} {% endfor %}",
            }
        )
    )
    (folder / "config.json").write_text(json.dumps({"model_type": "standin", "vocab_size": len(vocab)}))
    return folder


if __name__ == "__main__":
    import sys

    print(build_tiny_tokenizer(sys.argv[1]))
