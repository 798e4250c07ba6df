"""Bad inputs, round three: train's hooks. Their signatures are checked when a run starts, their results where they
come back (each error names the hook and what was expected), rewards must fit in float32, `kl_fn` may not return NaN,
rollouts are all grouped or none, and hooks a run never calls (or iterations with nothing to train) are warned about.

Like tests/test_bad_inputs_2.py: each case is one bad input that must raise an exception of the right type whose message
names the hook; the plain tests below check the behaviour that goes with the fixes."""
import warnings

import numpy as np
import pytest
import torch

from bad_inputs import check_bad_input, model, run, small, tok

from rlnb import algorithms, core, kl, rewards, tiny, train_checks, training
from rlnb.core import Batch, Generation, Rollout, TrainingState, create_training_config

torch.set_num_threads(1)
nan = float("nan")


def own_prompts(**kw):
    "A run on prompts of its own (prompts_per_step then stays at its default)."
    return run(config=create_training_config(num_iterations=1, group_size=2, max_new_tokens=2, eval_every=0, lora_r=0),
               reward_fn=lambda r: 0.0, **kw)
def n_gens(prompts, cfg): return len(prompts) * cfg.num_return_sequences


CASES = []


def case(name, exc, contains, fn):
    CASES.append(pytest.param(fn, exc, (contains,) if isinstance(contains, str) else tuple(contains), id=name))


# --- 1. every hook's signature, checked once when train starts --------------------------------------------------------
case("sig/kl_fn takes one argument", TypeError,
     ["train: `kl_fn` must accept 2 arguments, (logprobs, ref_logprobs) -> (B, C); `<lambda>(lp)` does not"],
     lambda t: run(config=small(beta=0.1), kl_fn=lambda lp: lp))
case("sig/optimizer_step_fn takes one argument", TypeError,
     ["`optimizer_step_fn` must accept 2 arguments, (state, max_grad_norm) -> grad norm", "`<lambda>(s)` does not"],
     lambda t: run(optimizer_step_fn=lambda s: 0.0))
case("sig/prompt_loader takes none", TypeError, ["`prompt_loader` must accept 1 argument, iteration -> prompts"],
     lambda t: own_prompts(prompt_loader=lambda: ["1+1="]))
case("sig/logger in a list", TypeError, ["`logger` must accept 2 arguments, (state, stats) -> None"],
     lambda t: run(logger=[lambda s, st: None, lambda s: None]))
case("sig/algorithm_config function of nothing", TypeError, ["`algorithm_config` must accept 1 argument"],
     lambda t: run(algorithm_config=lambda: algorithms.create_algorithm_config("grpo")))
case("sig/ref_model_update_fn of one argument", TypeError, ["`ref_model_update_fn` must accept 3 or 2 arguments"],
     lambda t: run(config=small(beta=0.1), ref_model_update_fn=lambda ref: ref))
case("sig/keyword-only argument", TypeError, ["`stop_fn` must accept 2 arguments", "(s, *, metrics)"],
     lambda t: run(stop_fn=lambda s, *, metrics: False))
for _name in train_checks.HOOK_SIGNATURES:  # each hook train takes: a function of six required arguments is refused
    case(f"sig/{_name} of six arguments", TypeError, f"`{_name}` must accept",
         lambda t, n=_name: run(**{n: lambda a, b, c, d, e, f: None}))

# --- 2. results checked where they come back ------------------------------------------------------------------------
case("result/reward_transform None", TypeError, ["`reward_transform` returned None", "expected (4,) numbers"],
     lambda t: run(reward_transform=lambda r, g, ro: None))
case("result/reward_transform strings", TypeError, ["`reward_transform` returned ['a', 'a', 'a', 'a']", "not numbers"],
     lambda t: run(reward_transform=lambda r, g, ro: ["a"] * len(r)))
case("result/reward_transform dict", TypeError, ["`reward_transform` returned {'a': 1}", "expected (4,) numbers"],
     lambda t: run(reward_transform=lambda r, g, ro: {"a": 1}))
case("result/reward_transform complex", TypeError, ["`reward_transform` returned torch.complex64 values", "real"],
     lambda t: run(reward_transform=lambda r, g, ro: r.to(torch.complex64)))
case("result/template_fn blank", ValueError, ["`template_fn` returned a blank prompt ('')"],
     lambda t: run(template_fn=lambda conv, tk: ""))
case("result/prompt_loader empty", ValueError, ["`prompt_loader` returned no prompts at iteration 0"],
     lambda t: own_prompts(prompt_loader=lambda it: []))
case("result/generator None", TypeError, ["`generator` returned None; expected a list of Generation"],
     lambda t: run(generator=lambda m, tk, p, c: None))
case("result/generator empty token ids", ValueError, ["`generator` returned a Generation with no token ids (result 0)"],
     lambda t: run(generator=lambda m, tk, p, c: [Generation("", token_ids=[])] * n_gens(p, c)))
case("result/generator past max_new_tokens", ValueError,
     ["`generator` returned 500 token ids for result 0, more than max_new_tokens=2"],
     lambda t: run(generator=lambda m, tk, p, c: [Generation("1", token_ids=[5] * 500)] * n_gens(p, c)))
case("result/iteration_hook rollouts without tokens", ValueError,
     ["`iteration_hook` returned 4 rollout(s) without completion tokens"],
     lambda t: run(iteration_hook=lambda s, b: Batch([r._replace(token_ids=[]) for r in b.rollouts])))
case("result/ref_model_update_fn str", TypeError,
     ["`ref_model_update_fn` returned 'x' (a str)", "expected the reference model", "or None"],
     lambda t: run(config=small(beta=0.1), ref_model_update_fn=lambda ref, pol, step: "x"))
case("result/stop_fn 'no'", TypeError, ["`stop_fn` returned 'no' (a str); expected True or False"],
     lambda t: run(config=small(num_iterations=3), stop_fn=lambda s, m: "no"))
case("result/stop_fn array", TypeError, ["`stop_fn` returned", "(a ndarray); expected True or False"],
     lambda t: run(stop_fn=lambda s, m: np.array([True, False])))
case("result/loss_fn metrics key not a str", TypeError, ["`loss_fn` returned {1: 1.0} as its metrics", "str names"],
     lambda t: run(loss_fn=lambda b, lp, c: (-lp.mean(), {1: 1.0})))
case("result/eval_fn metrics key not a str", TypeError, ["`eval_fn` returned {1: 1.0}", "names to numbers"],
     lambda t: run(config=small(eval_every=1), eval_fn=lambda s: {1: 1.0}))

# --- 2. the objects train is handed ---------------------------------------------------------------------------------
case("object/initial_state model None", TypeError, ["`initial_state.model` must be a torch model", "got None"],
     lambda t: training.train(small(), initial_state=TrainingState(0, 0, None, None), tokenizer=tok(), progress=False))
case("object/initial_state optimizer None", TypeError, ["`initial_state.optimizer` must be a torch optimizer",
                                                       "got None", "create_training_state"],
     lambda t: training.train(small(), initial_state=TrainingState(0, 0, model(), None), tokenizer=tok(),
                              progress=False))
case("object/initial_state optimizer a str", TypeError,
     "`initial_state.optimizer` must be a torch optimizer, got 'adam'",
     lambda t: training.train(small(), initial_state=TrainingState(0, 0, model(), "adam"), tokenizer=tok(),
                              progress=False))
case("object/tokenizer a function", TypeError,
     ["`tokenizer` must be a tokenizer object", "got a function without pad_token_id, eos_token_id, decode"],
     lambda t: training.train(small(), model=model(), tokenizer=lambda *a, **k: None, progress=False))
case("object/system_prompt an int", TypeError, "`system_prompt` must be a str or None, got a int",
     lambda t: run(system_prompt=5))
case("object/algorithm_config empty", ValueError, ["`algorithm_config` has no 'name'", "create_algorithm_config"],
     lambda t: run(algorithm_config={}))
case("object/algorithm_config without a name", ValueError, "`algorithm_config` has no 'name' ({'clip_eps': 0.3})",
     lambda t: run(algorithm_config={"clip_eps": 0.3}))
case("object/algorithm_config function without a name", ValueError, "`algorithm_config` has no 'name'",
     lambda t: run(algorithm_config=lambda it: {"beta": 0.0}))
case("object/algorithm_config unknown name", ValueError, ["`algorithm_config` names 'grpoo', not one of",
                                                          "pass your own `loss_fn`"],
     lambda t: run(algorithm_config={"name": "grpoo"}))

# --- 3. rewards that do not fit in float32 --------------------------------------------------------------------------
def huge(rollout): return 1e308 if len(rollout.token_ids) % 2 else -1e308
def too_big_for_a_float(rollout): return 10**400
case("reward/1e308 in a run", ValueError, ["reward function `huge` returned", "e+308 for rollout 0", "float32"],
     lambda t: run(reward_fn=huge))
case("reward/10**400 in a run", ValueError,
     ["reward function `too_big_for_a_float` returned an int of 1329 bits for rollout 0, too large for a float"],
     lambda t: run(reward_fn=too_big_for_a_float))
case("reward/compute_scalar_reward 1e39", ValueError,
     ["compute_scalar_reward: reward function `<lambda>` returned 1e+39 for rollout 0",
      "largest magnitude is 3.403e+38"],
     lambda t: rewards.compute_scalar_reward(Rollout("x"), lambda r: 1e39, index=0))
case("reward/a vector component 1e308", ValueError,
     "compute_vector_reward: reward function `<lambda>` returned 1e+308 for rollout 0",
     lambda t: rewards.compute_batch_rewards([Rollout("x")] * 2, lambda r: [0.0, 1e308], is_vector=True))

# --- 4. kl_fn: NaN, and names ---------------------------------------------------------------------------------------
case("kl/kl_fn returns nan in a run", ValueError, ["kl_fn `<lambda>` returned nan at position",
                                                   "expected a finite KL value per token"],
     lambda t: run(config=small(beta=0.1), kl_fn=lambda lp, ref: lp * nan))
case("kl/compute_per_token_kl nan", ValueError,
     "compute_per_token_kl: kl_fn `<lambda>` returned nan at position (0, 0)",
     lambda t: kl.compute_per_token_kl(torch.zeros(1, 2), torch.zeros(1, 2), kl_fn=lambda a, b: a * nan))
case("kl/kl_fn an unknown name", ValueError,
     ["`kl_fn`='k9' is neither a function", "['abs', 'k1', 'k2', 'k3', 'k3+', 'k3_is']"],
     lambda t: run(config=small(algorithm_options={"kl_fn": "k9"})))
case("kl/kl_fn a number", TypeError, "`kl_fn`=3 is neither a function",
     lambda t: algorithms.create_algorithm_config("grpo", kl_fn=3))

# --- 5. grouped and ungrouped rollouts mixed ------------------------------------------------------------------------
def _loose_first(state, batch):
    return Batch([r._replace(group_index=None) if i == 0 else r for i, r in enumerate(batch.rollouts)])
case("groups/iteration_hook mixes", ValueError, ["compute_batch_advantages: 1 of 4 rollouts have no group",
                                                 "Give every rollout a group_index, or none"],
     lambda t: run(iteration_hook=_loose_first))
_rs = [Rollout("p", prompt_token_ids=[1], token_ids=[2], rewards=float(i), group_index=g)
       for i, g in enumerate([0, 0, None, None])]
case("groups/compute_batch_advantages mixes", ValueError, "compute_batch_advantages: 2 of 4 rollouts have no group",
     lambda t: algorithms.compute_batch_advantages(core.collate(_rs, pad_token_id=0),
                                                   algorithms.create_algorithm_config("grpo")))


@pytest.mark.parametrize("fn, exc, contains", CASES)
def test_bad_input(fn, exc, contains, tmp_path):
    check_bad_input(fn, exc, contains, tmp_path)


# --- what still works ----------------------------------------------------------------------------------------------
def test_hooks_without_a_signature_and_defaults_are_let_through():
    "A builtin without a signature (torch.sub: k1) runs; arguments with defaults are fine; 2-argument updates too."
    seen = []
    state = run(config=small(beta=0.1), kl_fn=torch.sub, stop_fn=lambda s, m, extra=None: False,
                ref_model_update_fn=lambda ref, policy: seen.append(1) or ref)
    assert state.iteration == 1 and seen == [1]


def test_stop_fn_numpy_and_torch_bools_and_none():
    assert run(config=small(num_iterations=3), stop_fn=lambda s, m: np.bool_(s.iteration >= 1)).iteration == 1
    assert run(config=small(num_iterations=3), stop_fn=lambda s, m: torch.tensor(s.iteration >= 2)).iteration == 2
    # a function that only says when to stop (`if ...: return True`) returns None otherwise: keep going
    assert run(config=small(num_iterations=2), stop_fn=lambda s, m: None).iteration == 2


def test_kl_fn_by_name():
    assert algorithms.create_algorithm_config("grpo", kl_fn="k2")["kl_fn"] is kl.kl_k2
    seen = []
    state = run(config=small(num_iterations=2, beta=0.1, algorithm_options={"kl_fn": "k1"}),
                logger=lambda s, st: seen.append(st.custom_metrics["loss/kl"]))
    assert state.iteration == 2 and len(seen) == 2


def test_rollouts_all_ungrouped_are_one_group():
    loose = core.collate([r._replace(group_index=None) for r in _rs], pad_token_id=0)
    out = algorithms.compute_batch_advantages(loose, algorithms.create_algorithm_config("grpo", scale="none"))
    torch.testing.assert_close(out.advantages, torch.tensor([-1.5, -0.5, 0.5, 1.5]))


def test_a_reward_at_float32s_edge_is_kept():
    assert rewards.compute_scalar_reward(Rollout("x"), lambda r: 3e38) == 3e38


# --- 6. warnings: hooks never called, iterations with nothing to train -----------------------------------------------
def _user_warnings(fn):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = fn()
    return out, [str(w.message) for w in caught if issubclass(w.category, UserWarning) and "train:" in str(w.message)]


def test_kl_fn_without_a_reference_is_warned_about():
    with pytest.warns(UserWarning, match="`kl_fn` is never called: the run has no reference model"):
        run(kl_fn=lambda lp, ref: (lp - ref) ** 2)
    _, said = _user_warnings(lambda: run(config=small(lora_r=4), kl_fn=lambda lp, ref: (lp - ref) ** 2))
    assert not [s for s in said if "never called" in s]  # under LoRA there is a reference: the KL is measured


def test_ref_model_update_fn_without_a_reference_is_warned_about():
    with pytest.warns(UserWarning, match="`ref_model_update_fn` is never called: the run has no reference model"):
        run(ref_model_update_fn=lambda r, p, s: r)


def test_iterations_with_nothing_to_train_are_said_once_then_counted():
    _, said = _user_warnings(lambda: run(config=small(num_iterations=4), iteration_hook=lambda s, b: Batch([])))
    skipped = [s for s in said if "nothing to train" in s]
    assert len(skipped) == 2, said
    assert "iteration 0 had nothing to train on: `rollout_fn` or `iteration_hook` returned an empty Batch" in skipped[0]
    assert "train: 4 iterations of this run had nothing to train on" in skipped[1]


def test_rollout_fn_returning_nothing_is_said():
    with pytest.warns(UserWarning, match="iteration 0 had nothing to train on: `rollout_fn` returned an empty Batch"):
        run(rollout_fn=lambda m, tk, p, c: Batch([]))


def test_dynamic_sampling_dropping_every_group_is_said():
    config = small(dynamic_sampling=True, max_sampling_rounds=1)
    with pytest.warns(UserWarning, match="dynamic sampling dropped every group"):
        state = run(config=config, reward_fn=lambda r: 0.0)
    assert state.stats_history[-1].custom_metrics["skipped"] == 1.0


def test_a_run_that_trains_says_nothing():
    _, said = _user_warnings(lambda: run(config=small(num_iterations=2)))
    assert not said, said


def test_a_generator_whose_text_is_not_its_tokens_is_warned_about_once():
    tokenizer = tiny.load_tiny_model(progress=False)[1]
    nine = tokenizer.convert_tokens_to_ids("9")
    def generator(model, tok, prompts, config):  # says "2", samples "9"
        return [Generation("2", token_ids=[nine])] * (len(prompts) * config.num_return_sequences)
    with pytest.warns(UserWarning, match="text '2' is not what its token ids decode to") as caught:
        run(config=small(num_iterations=2), generator=generator)
    assert sum("decode to" in str(w.message) for w in caught) == 1
