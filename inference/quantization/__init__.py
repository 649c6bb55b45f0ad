"""Quantized variants of a model, written by llmcompressor as compressed-tensors checkpoints.

``python -m inference.quantize`` is the entry point. Only ``build`` imports torch and
llmcompressor (which live in ``.venv-quant``); the other modules are light, so the console and
``--help`` use them from the main environment.
"""
