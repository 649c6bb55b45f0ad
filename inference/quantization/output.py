"""Where a build writes, and the files a variant copies unchanged from its base model."""

from __future__ import annotations

import shutil
from pathlib import Path

PROVENANCE_FILE = ".pdserve-quantized.json"
# Copied byte for byte, so that the variant tokenizes and renders chats exactly as its base
# (the console's pre-flight checks compare their hashes) and serves on its own.
COPIED_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json",
                "merges.txt", "special_tokens_map.json", "added_tokens.json",
                "chat_template.jinja", "chat_template.json", "generation_config.json")


def partial_dir(out: Path) -> Path:
    """The temporary directory a build of ``out`` writes into before renaming it to ``out``.

    Fixed, not random, so that whoever kills a build (the console cancelling a job) can remove it.
    """
    return out.with_name(f".{out.name}.partial")


def copy_companions(model: Path, target: Path) -> list[str]:
    copied = []
    for name in COPIED_FILES:
        if (model / name).is_file():
            shutil.copy2(model / name, target / name)
            copied.append(name)
    return copied
