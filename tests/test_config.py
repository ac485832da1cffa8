"""Config loading, overrides and validation: every bad input gives one line naming it."""

import os
import stat
import subprocess
import sys

import pytest

from ada import config as C

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT = os.path.join(ROOT, "configs", "default.py")
PAPER = ("qwen25_math_1p5b", "qwen25_math_7b", "llama32_3b", "qwen3_4b")


def test_default_loads_and_validates(tmp_path):
    cfg = C.load_config(DEFAULT)
    C.validate(cfg, str(tmp_path / "run"))
    assert cfg.model.path == ""


@pytest.mark.parametrize("name", PAPER)
@pytest.mark.parametrize("method", ["grpo", "ada_pos", "ada_balance"])
def test_paper_configs(name, method):
    cfg = C.load_config(os.path.join(ROOT, "configs", f"{name}.py:{method}"))
    assert cfg.method == method
    assert (cfg.data.prompts_per_step, cfg.adaptive.n, cfg.adaptive.samples_per_round,
            cfg.adaptive.max_rounds) == (512, 4, 8, 4)
    assert (cfg.optim.lr, cfg.optim.warmup_steps, cfg.optim.entropy_coef) == (1e-6, 10, 1e-4)
    assert (cfg.optim.clip_low, cfg.optim.clip_high) == (0.2, 0.28)
    assert (cfg.train.steps, cfg.sampling.max_new_tokens, cfg.sampling.temperature) == (600, 2048, 1.0)
    assert cfg.adaptive.normalize_std is None  # the method's own: ada.methods
    # the weights are not here: validation names the model path
    with pytest.raises(C.ConfigError, match="model path .* does not exist"):
        C.validate(cfg)


def test_overrides_typed(tmp_path):
    cfg = C.build_config(DEFAULT, [("adaptive.n", "8"), ("optim.lr", "3e-4"), ("method", "grpo"),
                                   ("log.tensorboard", "false"), ("eval.pass_k", "(1,2)")])
    assert cfg.adaptive.n == 8 and isinstance(cfg.adaptive.n, int)
    assert cfg.optim.lr == 3e-4
    assert cfg.method == "grpo" and cfg.log.tensorboard is False
    assert tuple(cfg.eval.pass_k) == (1, 2)
    ov, rest = C.parse_override_args(["--config.adaptive.n=2", "--workdir", "x", "--config.seed", "3"])
    assert ov == [("adaptive.n", "2"), ("seed", "3")] and rest == ["--workdir", "x"]


def test_unknown_key_names_closest():
    cfg = C.load_config(DEFAULT)
    with pytest.raises(C.ConfigError) as e:
        C.apply_override(cfg, "adaptive.samples_per_rnd", "4")
    msg = str(e.value)
    assert "\n" not in msg and "adaptive.samples_per_rnd" in msg and "adaptive.samples_per_round" in msg
    with pytest.raises(C.ConfigError, match="optim.lr"):
        C.apply_override(cfg, "lr", "1")
    with pytest.raises(C.ConfigError, match="expected an integer"):
        C.apply_override(cfg, "adaptive.n", "four")


def test_syntax_error_names_file_and_line(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("def get_config(arg=None):\n    x = 1\n    return (\n\n")
    with pytest.raises(C.ConfigError) as e:
        C.load_config(str(bad))
    assert str(bad) in str(e.value) and "line" in str(e.value) and "\n" not in str(e.value)
    bad.write_text("import ml_collections\n\ndef get_config(arg=None):\n    return 1 / 0\n")
    with pytest.raises(C.ConfigError, match=r"line 4 raised ZeroDivisionError"):
        C.load_config(str(bad))


def test_validation_messages(tmp_path):
    cfg = C.load_config(DEFAULT)
    cfg.adaptive.n = 1
    with pytest.raises(C.ConfigError, match="adaptive.n=1"):
        C.validate(cfg)
    cfg = C.load_config(DEFAULT)
    cfg.adaptive.positive_threshold = 1.5
    with pytest.raises(C.ConfigError, match="positive_threshold"):
        C.validate(cfg)
    cfg = C.load_config(DEFAULT)
    cfg.sampling.num_windows = 0
    with pytest.raises(C.ConfigError, match=r"sampling.num_windows=0 .*1 = attend to the whole"):
        C.validate(cfg)
    cfg = C.load_config(DEFAULT)
    cfg.model.path = str(tmp_path / "nope")
    with pytest.raises(C.ConfigError, match="model path .*nope.* does not exist"):
        C.validate(cfg)


@pytest.mark.skipif(os.geteuid() == 0, reason="root can write anywhere")
def test_unwritable_workdir(tmp_path):
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(stat.S_IRUSR | stat.S_IXUSR)
    with pytest.raises(C.ConfigError, match="not writable"):
        C.check_workdir(str(ro / "run"))


def test_unwritable_workdir_even_as_root():
    with pytest.raises(C.ConfigError, match="'/proc/ada_run' is not writable"):
        C.check_workdir("/proc/ada_run")


def test_workdir_is_a_file(tmp_path):
    f = tmp_path / "f"
    f.write_text("x")
    with pytest.raises(C.ConfigError, match="not a directory"):
        C.check_workdir(str(f))
    with pytest.raises(C.ConfigError, match="not writable|not a directory"):
        C.check_workdir(str(f / "sub"))


def test_cli_one_line_errors(tmp_path):
    """The runner's CLI stops before any compile with exit code 2 and one line."""
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    cases = [
        ([DEFAULT, "--config.adaptive.nn=3"], "adaptive.n"),
        ([DEFAULT, "--config.model.path=/does/not/exist"], "/does/not/exist"),
    ]
    for cfg_args, needle in cases:
        r = subprocess.run([sys.executable, "-m", "ada.runner", "--config", *cfg_args, "--workdir",
                            str(tmp_path / "w")], capture_output=True, text=True, env=env, timeout=120)
        assert r.returncode == 2, r.stderr
        lines = [ln for ln in r.stderr.strip().splitlines() if ln.strip()]
        assert len(lines) == 1 and needle in lines[0], r.stderr


def test_method_override_equals_the_config_argument():
    """--config.method=grpo (what sweeps pass) must equal the :grpo config argument; the
    advantage normalisation is the method's own unless adaptive.normalize_std is set."""
    by_arg = C.build_config(DEFAULT + ":grpo")
    by_override = C.build_config(DEFAULT, [("method", "grpo")])
    assert by_override.to_dict() == by_arg.to_dict()
    assert by_arg.adaptive.normalize_std is None
    kept = C.build_config(DEFAULT, [("method", "grpo"), ("adaptive.normalize_std", "false")])
    assert kept.adaptive.normalize_std is False
    C.validate(kept)


@pytest.mark.parametrize("threshold, ok", [(0.0, True), (0.5, True), (0.999, True), (1.0, False),
                                           (-0.1, False)])
def test_threshold_range_agrees_with_the_collector(threshold, ok):
    """The run config and CollectConfig accept the same thresholds: positive iff r > thr,
    so thr may equal the reward range's low end but not its high end."""
    from ada import setup

    cfg = C.build_config(DEFAULT, [("adaptive.positive_threshold", str(threshold))])
    if ok:
        C.validate(cfg)
        assert setup.collect_config(cfg).threshold == threshold
    else:
        with pytest.raises(C.ConfigError, match="positive_threshold"):
            C.validate(cfg)
        with pytest.raises(ValueError, match="threshold"):
            setup.collect_config(cfg)


def test_methods_are_defined_once():
    """ada/methods.py is the only table of methods: no other module lists them."""
    import re

    from ada import methods

    hits = []
    for folder in ("ada", "configs", "experiments", "benchmarks"):
        for dirpath, _, files in os.walk(os.path.join(ROOT, folder)):
            for f in files:
                path = os.path.join(dirpath, f)
                if f.endswith(".py") and path != methods.__file__:
                    text = open(path).read()
                    if re.search(r"^\s*METHODS\s*=", text, re.M):
                        hits.append(path)
    assert not hits, hits


def test_sweep_prints_one_validated_command_per_point(tmp_path, capsys):
    from ada.cli import train_main

    sweep = os.path.join(ROOT, "configs", "sweep_methods.py")
    assert train_main(["--sweep", sweep, "--workdir", str(tmp_path), "--print"]) == 0
    cmds = capsys.readouterr().out.strip().splitlines()
    assert len(cmds) == 9  # 3 methods x 3 seeds
    assert all("--config.method=" in c and "--config.seed=" in c for c in cmds)
    assert len({c.split("--workdir ")[1] for c in cmds}) == 9


def test_prompt_plus_response_past_the_context_window_is_one_line():
    from ada import setup
    from ada.models import preset

    model_cfg = preset("tiny", vocab_size=96)  # 4096 positions, as Qwen2.5-Math
    ok = C.build_config(DEFAULT, [("data.max_prompt_len", "1024"),
                                  ("sampling.max_new_tokens", "2048")])
    setup.check_context_window(ok, model_cfg)
    bad = C.build_config(DEFAULT, [("data.max_prompt_len", "1024"),
                                   ("sampling.max_new_tokens", "4096")])
    with pytest.raises(C.ConfigError, match=r"1024 \+ 4096 = 5120 .* 4096 positions"):
        setup.check_context_window(bad, model_cfg)


@pytest.mark.parametrize("name", PAPER)
def test_paper_configs_fit_their_models_context(name):
    from ada import setup
    from ada.models import known

    cfg = C.load_config(os.path.join(ROOT, "configs", f"{name}.py"))
    model_cfg = {"qwen25_math_1p5b": known.QWEN25_MATH_1_5B, "qwen25_math_7b": known.QWEN25_MATH_7B,
                 "llama32_3b": known.LLAMA32_3B, "qwen3_4b": known.QWEN3_4B}[name]
    setup.check_context_window(cfg, model_cfg)


@pytest.mark.parametrize("key, value", [("sampling.num_slots", "0"), ("sampling.chunk_size", "0"),
                                        ("data.pass_rate_range", "(0.5, 0.25)"),
                                        ("data.pass_rate_samples", "0")])
def test_sampler_and_prompt_set_settings_are_validated(key, value):
    c = C.build_config(DEFAULT, [(key, value)])
    with pytest.raises(C.ConfigError, match=key.split(".")[1]):
        C.validate(c)
