#!/usr/bin/env python3
"""Checks reference.json (written by make_bpe_reference.js) against OpenAI's and Hugging
Face's GPT-2 tokenizers, with the same vocabulary files:

  python3 tests/data/bpe/check_bpe_reference.py VOCAB_DIR [FORTUNES_DIR]

VOCAB_DIR holds encoder.json and vocab.bpe (scripts/gpt2-vocab.sh). What is installed is used:
  - Python's `regex` (OpenAI's encoder.py pattern engine): every case's pieces;
  - transformers' GPT2Tokenizer (OpenAI's encoder.py algorithm) and GPT2TokenizerFast, and
    tokenizers' ByteLevel BPE (Hugging Face's Rust code): every case's ids, and with the end
    of text token special, ids_special.
Exit status 0 when every check that ran agrees and at least one ran; each disagreement is
printed with the case's name.
"""
import json
import os
import sys

PATTERN = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
EOT = "<|endoftext|>"


def split_fortunes(text):  # as normcore::models::split_fortunes
    fortunes, current = [], ""
    for line in text.split("\n")[: -1 if text.endswith("\n") else None]:
        if line == "%":
            if current.strip(" \t\r\n"):
                fortunes.append(current)
            current = ""
        else:
            current += line + "\n"
    if current.strip(" \t\r\n"):
        fortunes.append(current)
    return fortunes


def texts(reference, fortunes_dir):
    for case in reference["cases"]:
        if "fortune_file" in case:
            with open(os.path.join(fortunes_dir, case["fortune_file"]), "rb") as f:
                text = split_fortunes(f.read().decode("utf-8"))[case["fortune_index"]]
            assert len(text.encode("utf-8")) == case["bytes"], case["name"]
        else:
            text = case["text"]
        yield case, text


def encoders(vocab_dir):
    """(name, encode(text, special) -> ids) for each installed implementation."""
    encoder, merges = os.path.join(vocab_dir, "encoder.json"), os.path.join(vocab_dir, "vocab.bpe")
    found = []
    try:
        import shutil
        import tempfile
        from transformers import GPT2Tokenizer, GPT2TokenizerFast
        # from_pretrained on Hugging Face's file names: the constructor's file arguments
        # are not read by transformers 5 (whose GPT2TokenizerFast is GPT2Tokenizer).
        folder = tempfile.mkdtemp()
        shutil.copy(encoder, os.path.join(folder, "vocab.json"))
        shutil.copy(merges, os.path.join(folder, "merges.txt"))
        for cls in dict.fromkeys((GPT2Tokenizer, GPT2TokenizerFast)):
            tok = cls.from_pretrained(folder)
            name = f"transformers {cls.__name__}"
            if not tok.encode("Hello world"):
                print(f"{name} encodes 'Hello world' as nothing: skipped")
                continue
            found.append((name, lambda t, special, tok=tok: tok.encode(t, split_special_tokens=not special)))
    except ImportError:
        print("transformers is not installed: GPT2Tokenizer skipped")
    try:
        from tokenizers import Tokenizer, models, pre_tokenizers
        plain = Tokenizer(models.BPE.from_file(encoder, merges))
        plain.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        special = Tokenizer(models.BPE.from_file(encoder, merges))
        special.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        special.add_special_tokens([EOT])
        found.append(("tokenizers", lambda t, s: (special if s else plain).encode(t).ids))
    except ImportError:
        print("tokenizers is not installed: Hugging Face's BPE skipped")
    return found


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    vocab_dir = sys.argv[1]
    fortunes_dir = sys.argv[2] if len(sys.argv) > 2 else "/usr/share/games/fortunes"
    with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "reference.json"), encoding="utf-8") as f:
        reference = json.load(f)
    checks = failures = 0
    try:
        import regex
        for case, text in texts(reference, fortunes_dir):
            checks += 1
            if regex.findall(PATTERN, text) != case["pieces"]:
                failures += 1
                print(f"pieces differ (Python regex): {case['name']}: {regex.findall(PATTERN, text)}")
        print(f"regex {regex.__version__}: pieces checked")
    except ImportError:
        print("regex is not installed: pieces skipped")
    for name, encode in encoders(vocab_dir):
        for case, text in texts(reference, fortunes_dir):
            for key, special in (("ids", False), ("ids_special", True)):
                if key not in case:
                    continue
                checks += 1
                ids = encode(text, special)
                if ids != case[key]:
                    failures += 1
                    print(f"{key} differ ({name}): {case['name']}: {ids}")
        print(f"{name}: ids checked")
    print(f"{checks - failures} passed, {failures} failed")
    sys.exit(1 if failures or checks == 0 else 0)


if __name__ == "__main__":
    main()
