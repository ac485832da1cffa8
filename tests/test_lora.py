"""LoRA (ada/models/lora.py): step 0 is the base exactly, only the adapters train, the
reference is the base, the sampler's merged weights are the trainer's effective ones, and
rank 0 is the full fine-tune's program."""

import dataclasses
import functools
import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from test_train_step import CFG, make_batch, params0
from tolerances import logprob_tol, model_tol

from ada import config as C
from ada import sharding as shd
from ada.models import lora
from ada.models.lora import LoraConfig
from ada.models.transformer import forward
from ada.rl import train
from ada.rl.losses import LossConfig
from ada.rl.optimizer import OptimConfig
from ada.run.state import state_tree
from ada.sampling.driver import Driver, Request
from ada.sampling.engine import Engine, prefill_fn
from ada.sampling.samplers import SamplingConfig

# Off-policy with accumulation (2 mini-batches of 2 micro-batches) and a KL term.
LORA = train.TrainConfig(lora=LoraConfig(rank=4, alpha=32.0), loss=LossConfig(kl_coef=0.1),
                         optim=OptimConfig(lr=1e-2, warmup_steps=1), mini_batches=2,
                         micro_batches=2, logit_chunk=6)
B = 8


def logp(params, model_cfg, batch, config=train.TrainConfig(logit_chunk=6)):
    return jax.jit(functools.partial(train.compute_logp, model_cfg=model_cfg, config=config))(
        params, batch)


@pytest.mark.slow
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_step_zero_is_the_base_exactly(dtype):
    """B = 0: the adapted model's log-probs are the base's bit for bit, with the base stored
    in the compute dtype (bfloat16 too). Breaks if B started random, or if storing the
    base in the compute dtype rounded differently from the forward's own cast."""
    cfg = CFG.replace(dtype=dtype)
    fns = train.make_train_fns(cfg, dataclasses.replace(LORA, loss=LossConfig()))
    state = fns.init_state(params0())
    assert state.params["layers"]["q"].dtype == jnp.dtype(dtype)
    assert float(jnp.abs(state.params["layers"]["q_lora_a"]).max()) > 0
    batch = fns.shard_batch(make_batch(2, B=B))
    np.testing.assert_array_equal(logp(state.params, cfg, batch), logp(params0(), cfg, batch))


@pytest.mark.slow
def test_only_the_adapters_train_and_the_reference_is_the_base():
    """Two off-policy steps with KL: every base leaf is unchanged bit for bit, every adapter
    B has moved, Adam holds moments for the adapters alone, and ref_logp is the base's
    log-prob (adapters off) without a reference copy. Breaks if a base weight got a
    gradient or an Adam update (weight decay included), or the KL read the adapted model."""
    fns = train.make_train_fns(CFG, dataclasses.replace(
        LORA, optim=OptimConfig(lr=1e-2, weight_decay=0.1)))
    state = fns.init_state(params0())
    base0 = jax.tree.map(np.asarray, lora.base(state.params))
    for seed in range(2):
        batch = fns.add_logps(state, fns.shard_batch(make_batch(seed, B=B)))
        state, m = fns.train_step(state, batch)
        assert int(m["skipped"]) == 0 and np.isfinite(float(m["loss"]))
    jax.tree.map(np.testing.assert_array_equal, lora.base(state.params), base0)
    for name in LORA.lora.targets:
        assert float(jnp.abs(state.params["layers"][name + "_lora_b"]).max()) > 0, name
    moments = {shd.path_name(p).split("/")[-1] for p, _ in
               jax.tree_util.tree_flatten_with_path(state.opt_state)[0] if shd.path_name(p)}
    assert moments and all(lora.is_adapter(n) for n in moments), moments
    batch = fns.add_logps(state, fns.shard_batch(make_batch(5, B=B)))
    np.testing.assert_array_equal(batch["ref_logp"], logp(params0(), CFG, batch, LORA))
    assert np.abs(np.asarray(batch["old_logp"] - batch["ref_logp"])).max() > 1e-3


def trained():
    """Adapted params whose adapters are far from zero (B random), alpha / r = 8."""
    params = lora.attach(params0(), LORA.lora, CFG.compute_dtype)
    layers = dict(params["layers"])
    for i, name in enumerate(LORA.lora.targets):
        b = layers[name + "_lora_b"]
        layers[name + "_lora_b"] = 0.02 * jax.random.normal(jax.random.key(i), b.shape)
    return dict(params, layers=layers)


@pytest.mark.slow
@pytest.mark.numerics  # held to a float32 tolerance
def test_sampler_merged_weights_equal_the_trainers_effective_weights():
    """The engine's hand-off merges W + (alpha / r) B A; the sampler's prefill logits on them
    equal the trainer's forward with the adapters applied, within float32's model tolerance,
    and differ from the base's by far more. Breaks if the merge dropped the scale, a
    target, or transposed A B."""
    params = trained()
    engine = Engine(CFG, num_slots=2, max_prompt_len=16, max_new_tokens=4)
    prepared = engine.prepare_params(params)
    assert not any(lora.is_adapter(k) for layer in prepared["layers"] for k in layer)
    batch = make_batch(3, B=4)
    tokens, mask = jnp.asarray(batch["tokens"][:, :8]), jnp.asarray(batch["mask"][:, :8])
    sampler = prefill_fn(prepared, tokens, mask, config=CFG).logits
    want, _ = forward(params, CFG, tokens, jnp.asarray(batch["positions"][:, :8]), mask)
    want = want[:, -1]
    base, _ = forward(params0(), CFG, tokens, jnp.asarray(batch["positions"][:, :8]), mask)
    tol = model_tol(want, CFG)
    assert np.abs(np.asarray(sampler - want)).max() <= tol
    assert np.abs(np.asarray(base[:, -1] - want)).max() > 100 * tol


@pytest.mark.slow
@pytest.mark.numerics  # held to a float32 tolerance
def test_the_adapters_in_the_decode_step_sample_what_the_merged_weights_do():
    """benchmarks/lora_decode.py's other sampler form: the base in decode form with the
    adapters beside it, applied by layers.linear in every decode step, draws the merged
    weights' greedy tokens with their log-probs within float32's tolerance, so its A/B
    compares one computation. Breaks if the form dropped a layer's adapter or its scale."""
    import importlib.util

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    spec = importlib.util.spec_from_file_location(
        "lora_decode", os.path.join(root, "benchmarks", "lora_decode.py"))
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    params = trained()
    engine = Engine(CFG, num_slots=2, max_prompt_len=16, max_new_tokens=8, chunk_size=4,
                    sampling=SamplingConfig(temperature=0.0))
    forms = {"merged": engine.prepare_params(params), "adapters": bench.with_adapters(
        params, config=CFG, unembed_copy=engine.choices.unembed_copy)}
    assert any(lora.is_adapter(k) for k in forms["adapters"]["layers"][0])
    reqs = [Request(list(range(3 + i, 11 + i)), i, 0, 8) for i in range(2)]
    out = {k: Driver(engine, p, step_key=0).generate_all(reqs) for k, p in forms.items()}
    batch = make_batch(3, B=2)
    tol = logprob_tol(prefill_fn(forms["merged"], jnp.asarray(batch["tokens"][:, :8]),
                                 jnp.asarray(batch["mask"][:, :8]), config=CFG).logits, CFG)
    for m, a in zip(out["merged"], out["adapters"], strict=True):
        assert m.token_ids == a.token_ids and len(m.token_ids) == 8
        assert np.abs(np.subtract(m.logprobs, a.logprobs)).max() <= tol


@pytest.mark.slow
@pytest.mark.numerics  # held to a float32 tolerance
def test_sharded_lora_step_equals_single_device():
    """The adapters and their moments place by ada/sharding.py's rules (A as its weight's
    input, B as its output) and the sharded step matches one device's."""
    def run(mesh):
        fns = train.make_train_fns(CFG, dataclasses.replace(LORA, mini_batches=1), mesh)
        state = fns.init_state(params0())
        batch = fns.add_logps(state, fns.shard_batch(make_batch(7, B=B)))
        return jax.tree.map(np.asarray, fns.train_step(state, batch)[0].params)

    one, many = run(None), run(shd.make_mesh((2, 2, 2)))
    for name in LORA.lora.targets:
        a, b = many["layers"][name + "_lora_b"], one["layers"][name + "_lora_b"]
        assert np.linalg.norm(a - b) <= 1e-4 * np.linalg.norm(b), name


def test_rank_zero_is_the_full_fine_tune():
    """model.lora.rank=0 adds nothing: the same params object, and the train step traces to
    the very program of the default config's, whatever alpha and targets say (so its numbers
    are bit for bit the same; across commits, a step's state hashed equal to the tree's
    before LoRA). Breaks if rank 0 split the params or touched the gradient's path."""
    off = LoraConfig(rank=0, alpha=3.0, targets=("q",))
    assert lora.attach(params0(), off, jnp.bfloat16) is params0()
    assert lora.split(params0()) == (params0(), None)
    state0 = train.init_state(params0(), dataclasses.replace(LORA, lora=off))
    assert state_tree(state0, np.zeros(2, np.uint32))["params"] is state0.params  # unchanged
    plain = dataclasses.replace(LORA, lora=LoraConfig(), loss=LossConfig())
    state = train.init_state(params0(), plain)
    batch = train.make_train_fns(CFG, plain).add_logps(
        state, {k: jnp.asarray(v) for k, v in make_batch(4, B=B).items()})

    def program(config):
        return str(jax.make_jaxpr(functools.partial(
            train.train_step, model_cfg=CFG, config=config))(state, batch))

    assert program(dataclasses.replace(plain, lora=off)) == program(plain)


def test_the_base_fingerprint_is_its_content_on_any_placement():
    """lora.fingerprint (a LoRA checkpoint's reference to its base) is the same for host
    arrays, one device and a sharded mesh, and changes when one weight moves by one ulp.
    Breaks if it summed floats (order-dependent) or ignored a leaf or a position."""
    host = jax.tree.map(np.asarray, params0())
    sharded = jax.device_put(params0(), shd.param_shardings(params0(), shd.make_mesh((2, 2, 2))))
    want = lora.fingerprint(params0())
    assert lora.fingerprint(host) == lora.fingerprint(sharded) == want
    layers = dict(host["layers"])
    q = layers["q"].copy()
    q[1, 3, 5] = np.nextafter(q[1, 3, 5], np.inf)
    assert lora.fingerprint(dict(host, layers=dict(layers, q=q))) != want
    swapped = dict(layers, q=layers["q"][::-1].copy())  # same bits, other order
    assert lora.fingerprint(dict(host, layers=swapped)) != want


@pytest.mark.parametrize("key,value,match", [
    ("rank", -1, r"model.lora.rank=-1 must be an integer >= 0"),
    ("alpha", 0.0, r"model.lora.alpha=0.0 must be > 0"),
    ("targets", ("q", "embed"), r"model.lora.targets=\('q', 'embed'\) must be"),
])
def test_bad_lora_knobs_are_named(key, value, match):
    cfg = C.load_config(C.DEFAULT_CONFIG)
    cfg.model.lora[key] = value
    with pytest.raises(C.ConfigError, match=match):
        C.validate(cfg)
    cfg.model.lora[key] = LoraConfig.__dataclass_fields__[key].default
    assert C.train_config(cfg).lora == LoraConfig(seed=cfg.seed)


@pytest.mark.slow
def test_lora_run_resumes_exactly_and_refuses_another_rank_or_base(tmp_path):
    """A LoRA run stopped after step 1 and resumed ends bit for bit where the uninterrupted
    run does, metrics and checkpoint both: the checkpoint holds the adapters and their
    moments, not the frozen base, which the resume rebuilds. (No warm start: every reward is
    0, and the KL term's gradient, k1's grad log p, moves the adapters.) Resuming with
    another rank is refused in one line, and so is a forced resume on another base (another
    seed's init), before any array is restored; load_run (ada-serve's and ada.evaluate's
    loader) joins the adapters to the rebuilt base, and ada.evaluate runs on it. The
    uninterrupted run exports a PEFT adapter (checkpoint.export_format=peft). Breaks if the base were saved, or a
    checkpoint's adapters were joined to a base they were not trained on."""
    from test_runner import DEFAULT, _final_params, _strip_times, tiny_overrides

    from safetensors.numpy import load_file

    from ada.cli.eval import main as evaluate
    from ada.loop import train as run
    from ada.metrics import read_jsonl
    from ada.run.saved import load_run

    ov = [*tiny_overrides(str(tmp_path / "cache")), ("train.steps", "3"), ("eval.every", "3"),
          ("warmstart.enabled", "false"), ("model.lora.rank", "4"), ("loss.kl_coef", "0.05")]
    cfg = C.build_config(DEFAULT, ov)
    a, b = str(tmp_path / "a"), str(tmp_path / "b")
    run(C.build_config(DEFAULT, [*ov, ("checkpoint.export_hf", "true"),
                                 ("checkpoint.export_format", "peft")]), a)
    run(cfg, b, stop_after=1)
    run(cfg, b)
    assert _strip_times(read_jsonl(a + "/metrics.jsonl")) == _strip_times(
        read_jsonl(b + "/metrics.jsonl"))
    (pa, _), (pb, _) = _final_params(a), _final_params(b)
    jax.tree.map(np.testing.assert_array_equal, pa, pb)
    assert float(np.abs(pa["params"]["layers"]["q_lora_b"]).max()) > 0
    assert set(pa["params"]) == {"layers"} and all(map(lora.is_adapter, pa["params"]["layers"]))
    peft_b = load_file(a + "/hf/adapter_model.safetensors")[  # the run's PEFT export
        "base_model.model.model.layers.1.mlp.down_proj.lora_B.weight"]
    np.testing.assert_array_equal(peft_b, pa["params"]["layers"]["down_lora_b"][1].T)
    assert os.path.isfile(a + "/hf/base/model.safetensors")  # no model.path: the base beside
    loaded = load_run(b)
    jax.tree.map(np.testing.assert_array_equal, lora.split(loaded.params)[0], pa["params"])
    base = lora.base(loaded.params)
    assert base["layers"]["q"].dtype == jnp.dtype(loaded.model_cfg.compute_dtype)
    jax.tree.map(np.testing.assert_array_equal, base, jax.tree.map(
        lambda x: x.astype(loaded.model_cfg.compute_dtype), load_run(None, config=cfg).params))
    assert evaluate(["--workdir", b, "--limit", "4", "--json", str(tmp_path / "eval.json")]) == 0
    assert json.loads((tmp_path / "eval.json").read_text())["step"] == 3
    with pytest.raises(C.ConfigError, match="model.lora.rank=4; this command has "
                                            "model.lora.rank=8"):
        run(C.build_config(DEFAULT, [*ov, ("model.lora.rank", "8")]), b)
    with pytest.raises(C.ConfigError, match=r"^checkpoint 3 in \S+ holds LoRA adapters trained on "
                       r"the base random-init-\w+-seed\d+ \(hash \w{16}\), but this command's "
                       r"base is random-init-\w+-seed7 \(hash \w{16}\); resume with the run's"):
        run(C.build_config(DEFAULT, [*ov, ("seed", "7")]), b, force_config=True)


@pytest.mark.numerics  # held to a float32 tolerance
def test_export_writes_the_merged_model(tmp_path):
    """save_hf (ada.export's writer) merges the adapters: the exported model, loaded back,
    gives the adapted model's logits. (Before, a LoRA tree was refused as a wrong layout.)"""
    from ada.models.hf import load_hf, save_hf

    params = trained()
    save_hf(params, CFG, tmp_path, dtype="float32")
    loaded = load_hf(tmp_path)[0]
    batch = make_batch(6, B=2)
    args = [jnp.asarray(batch[k]) for k in ("tokens", "positions", "mask")]
    want = forward(params, CFG, *args)[0]
    assert np.abs(np.asarray(forward(loaded, CFG, *args)[0] - want)).max() <= model_tol(want, CFG)
