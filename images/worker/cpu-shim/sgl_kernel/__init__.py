"""Import-only stand-in for ``sgl_kernel`` on CPU hosts: every function raises when called.

SGLang 0.5.23's CPU mode (``SGLANG_USE_CPU_ENGINE=1``) imports a few names from ``sgl_kernel`` at
module load (speculative-decoding and KV-move helpers), and no CPU build of it is on the package
registries. On a CPU without AMX, SGLang serves with torch-native code and never calls them: it
looks for AMX kernels as ``torch.ops.sgl_kernel.convert_weight_packed``, which this module does not
register, so that check stays False. Nothing here computes: each attribute is a function that
raises ``NotImplementedError``, and when ``KVR_SGL_KERNEL_SHIM_CALLS`` names a file, first appends
the function's name to it, so a test can fail when serving called one. Only the CPU worker image
and the tests put this folder on ``PYTHONPATH``; the GPU image has the real ``sgl_kernel``.
"""

import os

CALLS_ENV = "KVR_SGL_KERNEL_SHIM_CALLS"
IS_KVRETENTION_SHIM = True


def __getattr__(name):
    if name.startswith("__"):
        raise AttributeError(name)

    def unavailable(*args, **kwargs):
        record = os.environ.get(CALLS_ENV)
        if record:
            with open(record, "a", encoding="utf-8") as f:
                f.write(name + "\n")
        raise NotImplementedError(
            f"sgl_kernel.{name}: the CPU sgl-kernel is not installed (kvretention's import shim)"
        )

    unavailable.__name__ = name
    return unavailable
