"""Build the small local model real engines serve: run with the ENGINE venv's python.

    .venv-vllm/bin/python gateway/launch/tiny_model_build.py OUT_DIR [--seed N]

A random-weight Qwen2 (hidden 768, intermediate 2048, 6 layers, 12 attention heads, 4 KV
heads, 32k positions, tied embeddings: 40.9M parameters) saved as float32 safetensors, and a
byte-level BPE tokenizer (4,096 tokens; specials <|endoftext|>, <|im_start|>, <|im_end|>;
a ChatML chat template) trained here on text this script generates from its seed. Nothing is
downloaded: the hub is switched off before transformers is imported.

Standalone on purpose: transformers, tokenizers and torch live only in the engine's virtual
environment, so this file imports nothing of warmgate's. `gateway/launch/models.py` is the
warmgate side (where the model is cached, building it once under a lock).

The same seed gives the same files (weights and tokenizer.json byte for byte): the corpus is
generated from a seeded `random.Random`, the tokenizer trainer runs on one thread and torch's
generator is seeded before the weights are drawn.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
from pathlib import Path

OFFLINE_ENV = {
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "HF_DATASETS_OFFLINE": "1",
    "HF_HUB_DISABLE_TELEMETRY": "1",
    "RAYON_NUM_THREADS": "1",  # the tokenizer trainer's pool: one thread, one order
    "TOKENIZERS_PARALLELISM": "false",
}

VOCAB_SIZE = 4096
MAX_POSITIONS = 32768
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
LAYERS = {
    "hidden_size": 768,
    "intermediate_size": 2048,
    "num_hidden_layers": 6,
    "num_attention_heads": 12,
    "num_key_value_heads": 4,
}
FORMAT = 2  # bump when the recipe changes: a cached build of another format is rebuilt
# Format 2: tokenizer.json carries Qwen2's own normalizer and pre-tokenizer. transformers 5
# builds a Qwen2 tokenizer with these whatever the file says (tokenization_qwen2.py), so the
# engine split " 1" into " ", "1" while the gateway's local tokenizer, reading the file's
# byte-level split, made one token of it: other tokens, other block hashes, prefetch hints
# that named no block the engine had. With these in the file both read the same rules.
# Format 1 builds are upgraded in place (`models.ensure_tiny_model`): same vocabulary.
QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}|"
    r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
QWEN2_NORMALIZER: dict[str, object] = {"type": "NFC"}
QWEN2_PRE_TOKENIZER: dict[str, object] = {
    "type": "Sequence",
    "pretokenizers": [
        {
            "type": "Split",
            "pattern": {"Regex": QWEN2_SPLIT},
            "behavior": "Isolated",
            "invert": False,
        },
        {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False},
    ],
}
SPEC: dict[str, object] = {
    "architecture": "Qwen2ForCausalLM",
    **LAYERS,
    "max_position_embeddings": MAX_POSITIONS,
    "vocab_size": VOCAB_SIZE,
    "dtype": "float32",
    "specials": SPECIALS,
    "format": FORMAT,
}

CHATML = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)

# A small English vocabulary plus code and numbers: prompts tokenize like ordinary text.
_WORDS = (
    "the of and to a in is it you that he was for on are with as his they be at one have "
    "this from or had by hot word but what some we can out other were all there when up use "
    "your how said an each she which do their time if will way about many then them write "
    "would like so these her long make thing see him two has look more day could go come did "
    "number sound no most people my over know water than call first who may down side been "
    "now find any new work part take get place made live where after back little only round "
    "man year came show every good me give our under name very through just form sentence "
    "great think say help low line differ turn cause much mean before move right boy old too "
    "same tell does set three want air well also play small end put home read hand port large "
    "spell add even land here must big high such follow act why ask men change went light "
    "kind off need house picture try us again animal point mother world near build self earth "
    "father head stand own page should country found answer school grow study still learn "
    "plant cover food sun four between state keep eye never last let thought city tree cross "
    "farm hard start might story saw far sea draw left late run while press close night real "
    "life few north open seem together next white children begin got walk example ease paper "
    "group always music those both mark often letter until mile river car feet care second "
    "book carry took science eat room friend began idea fish mountain stop once base hear "
    "horse cut sure watch color face wood main enough plain girl usual young ready above ever "
    "red list though feel talk bird soon body dog family direct pose leave song measure door "
    "product black short numeral class wind question happen complete ship area half rock "
    "order fire south problem piece told knew pass since top whole king space heard best hour "
    "better true during hundred five remember step early hold west ground interest reach fast "
    "verb sing listen six table travel less morning ten simple several vowel toward war lay "
    "against pattern slow center love person money serve appear road map rain rule govern "
    "pull cold notice voice unit power town fine certain fly fall lead cry dark machine note "
    "wait plan figure star box noun field rest correct able pound done beauty drive stood "
    "contain front teach week final gave green oh quick develop ocean warm free minute strong "
    "special mind behind clear tail produce fact street inch multiply nothing course stay "
    "wheel full force blue object decide surface deep moon island foot system busy test "
    "record boat common gold possible plane stead dry wonder laugh thousand ago ran check game "
    "shape equate miss brought heat snow tire bring yes distant fill east paint language among "
    "sword shield dragon quest tavern castle village merchant knight guard potion scroll "
    "user assistant system model request response token cache prefix engine gateway route"
)
_CODE = (
    "def return import class self None True False print if else elif for while in range len "
    "lambda yield async await try except finally with as from raise assert pass break "
    "continue {} [] () == != <= >= += -= -> : ; , . \" ' # // /* */ = + - * / % & | ^ ~"
)


def corpus(seed: int, chars: int = 1_500_000) -> list[str]:
    """Deterministic training text: sentences, chat turns, code lines and numbers."""
    rng = random.Random(seed)
    words = _WORDS.split()
    code = _CODE.split()
    lines: list[str] = []
    size = 0
    while size < chars:
        kind = rng.random()
        if kind < 0.6:
            n = rng.randint(5, 20)
            s = " ".join(rng.choice(words) for _ in range(n)).capitalize()
            line = s + rng.choice(".!?.,;")
        elif kind < 0.75:
            role = rng.choice(("user", "assistant", "system"))
            body = " ".join(rng.choice(words) for _ in range(rng.randint(3, 12)))
            line = f"<|im_start|>{role}\n{body}<|im_end|>"
        elif kind < 0.9:
            line = "    " * rng.randint(0, 3) + " ".join(
                rng.choice(code + words) for _ in range(rng.randint(2, 9))
            )
        else:
            line = " ".join(str(rng.randint(0, 10 ** rng.randint(1, 6))) for _ in range(5))
        lines.append(line)
        size += len(line) + 1
    return lines


def qwen2_rules(tokenizer_json: dict[str, object]) -> dict[str, object]:
    """A tokenizer.json with Qwen2's normalizer and pre-tokenizer (the vocabulary kept)."""
    return {**tokenizer_json, "normalizer": QWEN2_NORMALIZER, "pre_tokenizer": QWEN2_PRE_TOKENIZER}


def build_tokenizer(seed: int, out: Path) -> dict[str, int]:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=SPECIALS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus(seed), trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=None,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        unk_token=None,
        model_max_length=MAX_POSITIONS,
    )
    fast.chat_template = CHATML
    fast.save_pretrained(str(out))
    path = out / "tokenizer.json"  # trained on the byte-level split; served with Qwen2's
    path.write_text(json.dumps(qwen2_rules(json.loads(path.read_text())), ensure_ascii=False))
    ids: dict[str, int] = {}
    for s in SPECIALS:
        token_id = tok.token_to_id(s)
        if token_id is None:
            raise RuntimeError(f"the trained tokenizer lacks its special token {s!r}")
        ids[s] = token_id
    return ids


def build_model(seed: int, out: Path, ids: dict[str, int]) -> int:
    import torch
    from transformers import GenerationConfig, Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(seed)
    config = Qwen2Config(
        vocab_size=VOCAB_SIZE,
        max_position_embeddings=MAX_POSITIONS,
        **LAYERS,
        tie_word_embeddings=True,
        use_sliding_window=False,
        bos_token_id=ids["<|endoftext|>"],
        eos_token_id=ids["<|im_end|>"],
        pad_token_id=ids["<|endoftext|>"],
        dtype="float32",
    )
    model = Qwen2ForCausalLM(config).to(torch.float32)
    model.save_pretrained(str(out), safe_serialization=True)
    GenerationConfig(
        bos_token_id=ids["<|endoftext|>"],
        eos_token_id=ids["<|im_end|>"],
        pad_token_id=ids["<|endoftext|>"],
    ).save_pretrained(str(out))
    return int(sum(p.numel() for p in model.parameters()))


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("out", type=Path, help="directory to write (created; must not hold a model)")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    # Before the first hub-aware import: never reach the network, whatever our environment.
    os.environ.update(OFFLINE_ENV)
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    ids = build_tokenizer(args.seed, out)
    params = build_model(args.seed, out, ids)
    manifest = {**SPEC, "seed": args.seed, "parameters": params, "special_ids": ids}
    (out / "warmgate-model.json").write_text(json.dumps(manifest, indent=2) + "\n")
    print(json.dumps({"out": str(out), "parameters": params, "special_ids": ids}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
