"""Imported first by ``radixchat.engine``, for one side effect: MKL's vector math initialised on one thread.

torch's CPU build computes cos, sin, exp, log, tanh... over a tensor (``at::vml``) with MKL's VML, which
initialises itself at its first call in a process. When two threads make that first call at once (any such op
over more than 2,048 values, as RoPE's cos at a prompt's first prefill), one of them can compute its half at
about 12 bits: errors of 1.5e-4 where 4e-8 is right, in ~15% of processes (2-core Xeon, torch 2.13). The engine's
first forward then differed between processes, and so did a deterministic reply. One small call on one
thread, here, before anything runs in parallel, initialises it (``tests/engine/test_mkl_first_call.py``).
"""

import torch

torch.ones(8).cos()  # under the parallel grain: one thread
