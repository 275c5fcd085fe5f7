"""The native kernels build and load wherever they can be built (Linux with a C++ compiler; every kernel has a
portable path beside its AVX-512 one). The kernel tests skip where the kernels cannot be built, so this one keeps
a compile error from passing as a machine without a compiler."""

from __future__ import annotations

import sys

import pytest

from radixchat.engine.kernels import _compiler, decode_step_ready, load_paged_attention, native_ready


def test_the_native_kernels_build_wherever_there_is_a_cpp_compiler():
    if sys.platform != "linux" or _compiler() is None:
        pytest.skip("the native kernels are built on Linux with a C++ compiler; this machine has neither")
    assert load_paged_attention() is None
    assert native_ready() and decode_step_ready()
