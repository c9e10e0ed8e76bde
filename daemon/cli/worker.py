"""``edgepilot worker <backend> <model> --fd N``: a model's worker process, started by the
daemon (``[backends.<backend>] isolation = "process"``), not by hand.

The model name is on the command line so that ``ps`` shows which worker serves what (a spare
llama.cpp worker, started before its model is known, shows ``(spare)`` and rewrites its
command line to the model's name when it is handed one); what to
load arrives over the connection on fd ``N`` (see :mod:`edgepilot.backends.llamacpp.worker`
for llama.cpp, :mod:`edgepilot.backends.workers.tensor_worker` for the tensor backends).
"""

from __future__ import annotations

import argparse
from typing import Any

from edgepilot.cli.common import setup_logging

BACKENDS = ("llamacpp", "onnxruntime", "tflite", "armnn")


def add_parser(sub: Any) -> None:
    worker = sub.add_parser("worker", help="(started by the daemon) serve one model in a "
                                           "worker process")
    worker.add_argument("backend", choices=BACKENDS, help="the runtime the worker hosts")
    worker.add_argument("model", help="the model's name (shown by ps; the daemon sends the "
                                      "file and options)")
    worker.add_argument("--fd", type=int, required=True,
                        help="the inherited connection to the daemon")
    worker.set_defaults(func=cmd_worker)


def cmd_worker(args: argparse.Namespace) -> int:
    setup_logging(args.log_level or "info")
    if args.backend != "llamacpp":
        from edgepilot.backends.workers import tensor_worker

        return tensor_worker.main(args.fd, args.backend)
    # imported here: only a worker loads llama-cpp-python this way
    from edgepilot.backends.llamacpp import worker as llamacpp_worker

    return llamacpp_worker.main(args.fd, args.model)
