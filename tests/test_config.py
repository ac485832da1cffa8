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
    assert (cfg.optim.lr, cfg.optim.warmup_steps, cfg.loss.entropy_coef) == (1e-6, 10, 1e-4)
    assert (cfg.loss.clip_low, cfg.loss.clip_high, cfg.loss.dual_clip) == (0.2, 0.28, 10.0)
    assert (cfg.loss.loss_agg, cfg.loss.kl_coef, cfg.optim.grad_clip) == ("token-mean", 0.0, 1.0)
    assert (cfg.train.mini_batches, cfg.adaptive.positive_threshold) == (4, 0.7)
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
    from ada.config import collect_config

    cfg = C.build_config(DEFAULT, [("adaptive.positive_threshold", str(threshold))])
    if ok:
        C.validate(cfg)
        assert collect_config(cfg).positive_threshold == threshold
    else:
        with pytest.raises(C.ConfigError, match="positive_threshold"):
            C.validate(cfg)
        with pytest.raises(ValueError, match="threshold"):
            collect_config(cfg)


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
    from ada.cli.train import main as train_main

    sweep = os.path.join(ROOT, "configs", "sweep_methods.py")
    assert train_main(["--sweep", sweep, "--workdir", str(tmp_path), "--print"]) == 0
    cmds = capsys.readouterr().out.strip().splitlines()
    assert len(cmds) == 9  # 3 methods x 3 seeds
    assert all("--config.method=" in c and "--config.seed=" in c for c in cmds)
    assert len({c.split("--workdir ")[1] for c in cmds}) == 9


def test_prompt_plus_response_past_the_context_window_is_one_line():
    from ada.models import preset
    from ada.run.policy import check_context_window

    model_cfg = preset("tiny", vocab_size=96)  # 4096 positions, as Qwen2.5-Math
    ok = C.build_config(DEFAULT, [("data.max_prompt_len", "1024"),
                                  ("sampling.max_new_tokens", "2048")])
    check_context_window(ok, model_cfg)
    bad = C.build_config(DEFAULT, [("data.max_prompt_len", "1024"),
                                   ("sampling.max_new_tokens", "4096")])
    with pytest.raises(C.ConfigError, match=r"1024 \+ 4096 = 5120 .* 4096 positions"):
        check_context_window(bad, model_cfg)


@pytest.mark.parametrize("name", PAPER)
def test_paper_configs_fit_their_models_context(name):
    from ada.models import known
    from ada.run.policy import check_context_window

    cfg = C.load_config(os.path.join(ROOT, "configs", f"{name}.py"))
    model_cfg = {"qwen25_math_1p5b": known.QWEN25_MATH_1_5B, "qwen25_math_7b": known.QWEN25_MATH_7B,
                 "llama32_3b": known.LLAMA32_3B, "qwen3_4b": known.QWEN3_4B}[name]
    check_context_window(cfg, model_cfg)


@pytest.mark.parametrize("key, value", [("sampling.num_slots", "0"), ("sampling.chunk_size", "0"),
                                        ("data.pass_rate_range", "(0.5, 0.25)"),
                                        ("data.pass_rate_samples", "0")])
def test_sampler_and_prompt_set_settings_are_validated(key, value):
    c = C.build_config(DEFAULT, [(key, value)])
    with pytest.raises(C.ConfigError, match=key.split(".")[1]):
        C.validate(c)


# ----------------------------------------------------------------------------- one name per knob


def test_a_run_config_saved_before_the_renames_still_loads(tmp_path, caplog):
    """config.json of an older run (optim.clip_low, optim.mini_batches, data.difficulty, ...;
    no sampling.num_windows yet) loads as today's config with the same values."""
    import json
    import logging

    from ada.knobs import RENAMED

    want = C.build_config(DEFAULT).to_dict()
    old = json.loads(json.dumps(want))  # as the run wrote it: tuples are lists
    for old_key, new_key in RENAMED.items():
        section, leaf = new_key.split(".")
        old_section, old_leaf = old_key.split(".")
        old[old_section][old_leaf] = old[section].pop(leaf)
    del old["loss"]  # a section that did not exist
    del old["sampling"]["num_windows"]  # a knob added since: its default
    old["sampling"]["max_inflight"] = 3  # a knob removed since: dropped with a warning
    (tmp_path / "config.json").write_text(json.dumps(old))
    with caplog.at_level(logging.WARNING, logger="ada.config"):
        got = C.load_run_config(str(tmp_path))
    assert got.to_dict() == want
    assert "sampling.max_inflight" in caplog.text
    C.validate(got)
    old["optim"]["dual_clip"] = 1.0  # the old convention's "off" is today's 0
    (tmp_path / "config.json").write_text(json.dumps(old))
    assert C.load_run_config(str(tmp_path)).loss.dual_clip == 0.0


def test_an_old_key_on_the_command_line_names_the_new_one():
    with pytest.raises(C.ConfigError, match=r"'optim.clip_low' is now 'loss.clip_low'"):
        C.build_config(DEFAULT, [("optim.clip_low", "0.1")])


def test_describe_prints_one_plain_line_per_knob():
    cfg = C.load_config(os.path.join(ROOT, "configs", "qwen25_math_7b.py"))
    text = C.describe(cfg)
    lines = text.splitlines()
    assert len(lines) == len(C.flat_keys(cfg))
    assert "!!" not in text and "&id" not in text and "*id" not in text
    for line in lines:  # key = value  # description (every knob of base() has one)
        key, _, rest = line.partition(" = ")
        value, sep, note = rest.partition("  # ")
        assert key in C.flat_keys(cfg) and sep and note.strip(), line
    assert "sampling.mesh = (1, 4)  # " in text
    assert "data.pass_rate_range = (0.0, 1.0)  # " in text


def test_describe_diff_lists_only_the_knobs_that_differ_from_base():
    from ada.knobs import base_config

    cfg = C.build_config(DEFAULT, [("optim.lr", "0.001")])
    base = dict(C.leaves(base_config()))
    differ = {k for k, v in C.leaves(cfg) if v != base[k]}
    lines = C.describe(cfg, diff=True).splitlines()
    assert {ln.split(" = ")[0] for ln in lines} == differ
    assert "optim.lr = 0.001  # learning rate" in lines[[ln.split(" = ")[0] for ln in lines].index("optim.lr")]
    assert "data.level_mix = '2:1'" in C.describe(cfg, diff=True)
    assert C.describe(base_config(), diff=True) == ""


@pytest.mark.parametrize("key, value, needle", [
    ("loss.clip_low", "1.5", r"loss.clip_low=1.5 must be in \[0, 1\)"),
    ("loss.dual_clip", "0.5", r"loss.dual_clip=0.5 must be > 1 \(or 0 to disable\)"),
    ("loss.loss_agg", "mean", "loss.loss_agg='mean' is not one of"),
    ("optim.grad_clip", "-1", "optim.grad_clip=-1.0 must be >= 0"),
    ("optim.lr", "0", "optim.lr=0.0 must be > 0"),
    ("train.epochs", "0", "train.epochs=0 must be >= 1"),
    ("train.mini_batches", "3", "train.mini_batches=3 does not divide the 128 prompts"),
    ("train.micro_batches", "3", r"train.mini_batches x micro_batches = 1 x 3 does not divide"),
    ("sampling.top_p", "0", r"sampling.top_p=0.0 must be in \(0, 1\]"),
    ("adaptive.n", "40", r"adaptive.samples_per_round \* max_rounds = 8 x 4 = 32 < n=40"),
    ("adaptive.scheduler", "fifo", "adaptive.scheduler='fifo' is not one of"),
])
def test_a_dataclass_check_names_its_knob(key, value, needle):
    """The dataclasses check their own fields; validate reports their errors as one line
    naming the knob (section.field)."""
    cfg = C.build_config(DEFAULT, [(key, value)])
    with pytest.raises(C.ConfigError, match=needle) as e:
        C.validate(cfg)
    assert "\n" not in str(e.value) and "invalid" not in str(e.value)


def test_sections_build_their_dataclasses_field_for_field():
    """loss, optim and adaptive hold exactly the fields of the dataclasses they build (one
    name per knob); train holds TrainConfig's epochs / mini_batches / micro_batches."""
    import dataclasses

    from ada.adaptive.allocation import AllocConfig
    from ada.adaptive.collect import CollectConfig
    from ada.adaptive.success import HALF_LIFE
    from ada.knobs import base_config
    from ada.rl.losses import LossConfig
    from ada.rl.optimizer import OptimConfig
    from ada.rl.train import TrainConfig

    cfg = base_config()
    names = lambda cls: {f.name for f in dataclasses.fields(cls)}
    assert set(cfg.loss) == names(LossConfig)
    assert set(cfg.optim) == names(OptimConfig) - {"b1", "b2", "eps"}
    # the budget split's knobs build AllocConfig; half_life is the success memory's
    assert set(cfg.adaptive) - {"normalize_std", "half_life"} <= (names(CollectConfig)
                                                                  | names(AllocConfig))
    assert cfg.adaptive.half_life == HALF_LIFE
    assert {"epochs", "mini_batches", "micro_batches"} <= set(cfg.train) & names(TrainConfig)
    # one default per knob: the dataclasses' own defaults are base()'s
    for section, obj in (("loss", LossConfig()), ("optim", OptimConfig()),
                         ("adaptive", CollectConfig()), ("adaptive", AllocConfig()),
                         ("train", TrainConfig())):
        for k, v in cfg[section].items():
            if k in names(type(obj)):  # (CollectConfig.budget, a property, is M x N)
                assert getattr(obj, k) == v, f"{section}.{k}"
