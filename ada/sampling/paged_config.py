"""The sampler's KV-cache knobs checked (sampling.kv_cache, page_size, num_pages,
paged_attention; ada.config's `validate` calls `kv_cache_problems`): one line each, naming
the knob and the fix, before anything compiles. ada.sampling.backends.make_engine builds the engine
they describe."""

from __future__ import annotations

from ada.models.paged_attention import kernel_fits
from ada.sampling.pages import min_pool_pages

KV_CACHES = ("dense", "paged")
PAGED_ATTENTION = ("auto", "kernel", "gather")


def kv_cache_problems(config) -> list[str]:
    """What is wrong with a run config's KV-cache knobs (empty when nothing is)."""
    s = config.sampling
    if s.kv_cache not in KV_CACHES:
        return [f"sampling.kv_cache={s.kv_cache!r} is not one of {', '.join(KV_CACHES)}: "
                "pass --config.sampling.kv_cache=dense or paged"]
    if not 0 <= s.mean_response_len <= s.max_new_tokens:
        return [f"sampling.mean_response_len={s.mean_response_len} is not in [0, "
                f"sampling.max_new_tokens={s.max_new_tokens}]: pass a mean response length in "
                "tokens, or 0 for half of max_new_tokens"]
    if s.paged_attention not in PAGED_ATTENTION:
        return [f"sampling.paged_attention={s.paged_attention!r} is not one of "
                f"{', '.join(PAGED_ATTENTION)}: pass --config.sampling.paged_attention=auto"]
    if s.kv_cache == "dense":
        return []
    if s.page_size < 1 or s.num_pages < 0:
        return [f"sampling.page_size={s.page_size} must be >= 1 and sampling.num_pages="
                f"{s.num_pages} >= 0: pass --config.sampling.num_pages=0 (every slot's worst case)"]
    problems = []
    prompt_len = 1 << max(0, (config.data.max_prompt_len - 1).bit_length())  # its bucket
    new = max(s.max_new_tokens, config.eval.max_new_tokens)
    # each data shard of sampling.mesh holds its share (DATA -1, all devices: counted once
    # here, make_engine checks again once it knows them)
    data = max(int(s.mesh[0]), 1)
    need = data * (1 + min_pool_pages(prompt_len, new, s.page_size, lookahead=s.chunk_size))
    if 0 < s.num_pages < need:
        problems.append(f"sampling.num_pages={s.num_pages} cannot hold one request of "
                        f"{prompt_len} prompt + {new} new tokens in pages of {s.page_size}"
                        + (f" in each of sampling.mesh's {data} data shards" if data > 1 else "")
                        + f"; pass --config.sampling.num_pages={need} or more (0 = every slot's "
                        "worst case)")
    return problems


def auto_attention(platform: str, model_cfg) -> str:
    """TPU: the ragged kernel where the model fits it; else gather, the path that runs anywhere."""
    # not JAX's Pallas GPU paged kernel: it reads separate head-major key and value pages and
    # has no sliding window, not the pool and contract of ada.models.paged_attention
    return "kernel" if platform == "tpu" and kernel_fits(model_cfg) else "gather"


def kernel_problem(paged_attention: str, platform: str, model_cfg) -> str | None:
    """Why sampling.paged_attention='kernel' cannot run on these devices (one line), or None
    (ada.sampling.backends.make_engine asks, once it knows the sampler's devices and the model)."""
    if paged_attention != "kernel":
        return None
    if platform != "tpu":
        why = f"TPU devices (the Pallas kernel does not run on {platform})"
    elif not kernel_fits(model_cfg):
        why = f"head_dim a multiple of 128 (this model's is {model_cfg.head_dim})"
    else:
        return None
    return (f"sampling.paged_attention='kernel' needs {why}; pass "
            "--config.sampling.paged_attention=auto or gather")
