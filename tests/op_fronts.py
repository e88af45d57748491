"""The numpy op front (mla_export.ops.kernels) bound to one runtime, for tests parametrized over the
runtimes available here (onnxruntime needs the custom-op library)."""

from __future__ import annotations

import functools
import types

from mla_export.ops import kernels


def front(runtime: str) -> types.SimpleNamespace:
    ops = {name: functools.partial(getattr(kernels, name), runtime=runtime)
           for name in ("cache_write", "paged_decode", "paged_attention")}
    return types.SimpleNamespace(runtime=runtime, **ops)


def available_fronts() -> list[tuple[str, types.SimpleNamespace]]:
    return [(rt, front(rt)) for rt in kernels.RUNTIMES if kernels.available(rt)]
