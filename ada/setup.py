"""Deprecated, kept for one release: the old home of a run's pieces, re-exported from where
they live now. New code imports them from there:

  ada.data.task        Task, load_task, load_reward, reward_spec, parse_mix
  ada.data.encode      encode_records, too_long_message, unknown_tokens_message
  ada.sampling.backends  make_engine (the table of KV-cache backends)
  ada.run.policy       load_tokenizer_for, model_config_for, check_context_window,
                       initial_params, initial_policy, cache_dir
  ada.run.passrates    pass_rate_settings, filter_by_pass_rate, PASS_RATE_SEED
  ada.run.saved        load_run, LoadedRun
  ada.run.build        build, Setup (the composition root)
"""

from ada.data.encode import encode_records, too_long_message, unknown_tokens_message  # noqa: F401
from ada.data.task import Task, load_reward, load_task, parse_mix, reward_spec  # noqa: F401
from ada.run.build import Setup, build  # noqa: F401
from ada.run.passrates import PASS_RATE_SEED, filter_by_pass_rate, pass_rate_settings  # noqa: F401
from ada.run.policy import (  # noqa: F401
    cache_dir,
    check_context_window,
    initial_params,
    initial_policy,
    load_tokenizer_for,
    model_config_for,
)
from ada.run.saved import LoadedRun, load_run  # noqa: F401
from ada.sampling.backends import make_engine  # noqa: F401
