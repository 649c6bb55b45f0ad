"""pdserve data plane: router, worker launch specs, KV channels, model preparation.

This package never imports Django; ``tests/test_layering.py`` holds it to that.
"""
