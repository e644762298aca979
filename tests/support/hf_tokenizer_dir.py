"""A Hugging Face tokenizer directory built here, for the local tokenizer's tests: a small
byte-level BPE trained on a fixed text with `tokenizers` (the tokenizer extra), a ChatML
template in tokenizer_config.json, its eos token stored as transformers stores an
AddedToken. Nothing is downloaded."""

from __future__ import annotations

import json
from pathlib import Path

CHATML = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CORPUS = [
    "The blacksmith of Northwatch speaks briefly and remembers every traveler.",
    "Where is the old forge? Nobody knows, and the harbor is frozen this winter.",
    "Quest: bring three iron bars to Maren before the snow falls on the pass.",
] * 20


def build(directory: Path, template: str | None = CHATML) -> Path:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    directory.mkdir(parents=True, exist_ok=True)
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400,
        special_tokens=SPECIALS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(CORPUS, trainer=trainer)
    tok.save(str(directory / "tokenizer.json"))
    config: dict[str, object] = {
        "eos_token": {"content": "<|im_end|>", "special": True},
        "pad_token": "<|endoftext|>",
        "bos_token": None,
    }
    if template is not None:
        config["chat_template"] = template
    (directory / "tokenizer_config.json").write_text(json.dumps(config))
    return directory


def whole_ids(directory: Path, text: str, *, special: bool) -> list[int]:
    """`text` encoded whole by the directory's tokenizer (`special`: with its post-processor's
    special tokens): what the gateway's local tokenizer must reproduce."""
    from tokenizers import Tokenizer

    ids: list[int] = (
        Tokenizer.from_file(str(directory / "tokenizer.json"))
        .encode(text, add_special_tokens=special)
        .ids
    )
    return ids
