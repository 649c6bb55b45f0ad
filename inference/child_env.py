"""What a child process inherits from the supervisor's environment: an allow-list.

The supervisor (and the console, node agents and ``python -m inference.launch``) hold secrets
in their environment: PDSERVE_SECRET_KEY, from which every router's admin token, the console's
inference key and every worker's key derive, DATABASE_URL, REDIS_URL, mail passwords. A vLLM
worker can be made to read its own environment (``--chat-template=/proc/self/environ`` and
``/tokenize`` did), so a child gets only the variables below, plus what its spec names
explicitly (a worker's key, a router's admin token and REDIS_URL).
"""

from __future__ import annotations

import os
from collections.abc import Mapping

# Exact names, one group a line with why the children need them.
ALLOWED_NAMES = frozenset({
    # Finding programs and libraries; the user's home (caches default under it).
    "PATH", "HOME", "USER", "LOGNAME", "SHELL", "LD_LIBRARY_PATH",
    # vLLM's CPU guide preloads tcmalloc and Intel's OpenMP this way.
    "LD_PRELOAD",
    # Locale and time zone: text decoding and log timestamps.
    "LANG", "LANGUAGE", "TZ",
    # Temporary files (torch.compile, tokenizers, the quantization builder).
    "TMPDIR", "TEMP", "TMP",
    # The Python environment the child runs in.
    "VIRTUAL_ENV", "PYTHONPATH", "PYTHONUNBUFFERED", "PYTHONHASHSEED",
    "PYTHONDONTWRITEBYTECODE", "PYTHONWARNINGS", "PYTHONFAULTHANDLER",
    # Inductor's C++ compiler on CPU.
    "CC", "CXX",
    # Cache roots (XDG: torch, triton, huggingface under it).
    "XDG_CACHE_HOME",
    # TLS roots, should a child ever fetch (workers run offline).
    "SSL_CERT_FILE", "SSL_CERT_DIR", "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE",
})

# Name prefixes, likewise.
ALLOWED_PREFIXES = (
    "LC_",                                   # locale categories
    "VLLM_",                                 # vLLM's own settings (VLLM_API_KEY is set per child, below)
    "TORCH", "PYTORCH_",                     # torch, TORCHINDUCTOR_*, TORCH_*
    "TRITON_",                               # triton's cache and options
    "OMP_", "KMP_", "GOMP_",                 # OpenMP threads and binding
    "MKL_", "OPENBLAS_", "ONEDNN_", "DNNL_",  # BLAS and oneDNN kernels
    "CUDA_", "NVIDIA_", "NCCL_", "CUBLAS_", "CUDNN_",  # CUDA devices and collectives
    "ROCM_", "HIP_", "HSA_", "ROCR_",        # ROCm devices
    "UCX_", "NIXL_",                         # the NIXL KV channel's transport
    "RAY_",                                  # Ray, for pipeline stages on several machines
    "HF_", "TRANSFORMERS_", "TOKENIZERS_",   # Hugging Face: offline flags, cache dirs
)

# A name that matches the lists above but holds a credential (HF_TOKEN, NCCL_..._KEY,
# VLLM_API_KEY of the supervisor's own environment) is never inherited.
SECRET_NAME_PARTS = ("TOKEN", "SECRET", "PASSWORD", "PASSWD", "CREDENTIAL", "KEY")


def inherited(name: str) -> bool:
    """Whether a child inherits ``name`` from its parent's environment."""
    upper = name.upper()
    if any(part in upper for part in SECRET_NAME_PARTS):
        return False
    return name in ALLOWED_NAMES or name.startswith(ALLOWED_PREFIXES)


def child_environment(extra: Mapping[str, str],
                      parent: Mapping[str, str] | None = None) -> dict[str, str]:
    """A child's whole environment: the allowed part of ``parent`` (this process's when not
    given), then ``extra``, which its spec names and which wins."""
    source = os.environ if parent is None else parent
    return {**{name: value for name, value in source.items() if inherited(name)}, **extra}
