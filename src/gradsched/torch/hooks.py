"""A kept old path of :mod:`gradsched.integrations.hooks` (``from gradsched.torch.hooks import topk_hook``)."""

from gradsched.integrations.hooks import (  # noqa: F401 - re-exported
    Hook,
    TopKState,
    allreduce_hook,
    bf16_hook,
    bf16_wrapper,
    dtype_name,
    fp16_hook,
    fp16_wrapper,
    merged_topk_hook,
    register_hook,
    topk_hook,
)

__all__ = ["Hook", "TopKState", "allreduce_hook", "bf16_hook", "bf16_wrapper", "dtype_name", "fp16_hook", "fp16_wrapper",
           "merged_topk_hook", "register_hook", "topk_hook"]
