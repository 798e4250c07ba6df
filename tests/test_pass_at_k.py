"""rlnb.passk: the pass@k evaluation (the estimator of rlnb.rollouts used per prompt, seeded, bad inputs) and pass@k
training (`grpo_passk`): equal to the enumeration of every k-subset, runs by name in `train`, switches mid-run, and its
micro-batches add up to the full batch."""
import itertools, math, statistics

import pytest
import torch

from rlnb.algorithms import ALGORITHMS, compute_grpo_advantages, create_algorithm_config
from rlnb.core import create_training_config
from rlnb.passk import PassAtK, compute_passk_advantages, evaluate_pass_at_k
from rlnb.rollouts import pass_at_k
from rlnb.tasks import get_task
from rlnb.tiny import load_tiny_model
from rlnb.training import train
from test_micro_batches import GROUP, accumulated_grads, setting  # noqa: F401  (`setting`: its fixture)

torch.set_num_threads(1)
TASK = get_task("addition")


@pytest.fixture(scope="module")
def tiny():
    return load_tiny_model("addition", progress=False)


def test_the_module_does_not_hide_the_estimator():
    "The package attribute `rlnb.pass_at_k` stays the estimator (a module of that name would replace it on import)."
    import rlnb, rlnb.passk, rlnb.rollouts
    assert rlnb.pass_at_k is rlnb.rollouts.pass_at_k and rlnb.evaluate_pass_at_k is evaluate_pass_at_k
    assert "grpo_passk" in rlnb.ALGORITHMS


def test_evaluation_uses_the_unbiased_estimator_per_prompt(tiny):
    model, tok = tiny
    res = evaluate_pass_at_k(model, tok, TASK, n=8, ks=(4, 1, 8, 4), size=12, seed=1)
    assert isinstance(res, PassAtK) and list(res.curve) == [1, 4, 8] and res.n == 8  # sorted, no repeats
    assert res.counts.shape == (12,) and len(res.examples) == 12 and 0 <= int(res.counts.min())
    assert [e.prompt for e in res.examples] == [e.prompt for e in TASK.sample(12, seed=987_654)]
    for k in (1, 4, 8):
        per_prompt = pass_at_k(8, res.counts, k)
        assert res.curve[k] == pytest.approx(per_prompt.mean().item(), abs=1e-12)
        assert res.stderr[k] == pytest.approx(per_prompt.std().item() / math.sqrt(12), abs=1e-12)
    assert res.curve[1] == pytest.approx(res.counts.sum().item() / 96, abs=1e-12)  # pass@1: the fraction right
    assert res.curve[8] == pytest.approx((res.counts > 0).double().mean().item(), abs=1e-12)  # pass@n: solved at all


def test_evaluation_counts_right_samples_with_the_task_check(tiny):
    "A task whose check accepts everything: every count is n; one that accepts nothing: every count is 0."
    model, tok = tiny
    always, never = TASK._replace(check=lambda text, answer: True), TASK._replace(check=lambda text, answer: False)
    assert evaluate_pass_at_k(model, tok, always, n=3, ks=(1, 3), size=4).counts.tolist() == [3] * 4
    res = evaluate_pass_at_k(model, tok, never, n=3, ks=(1, 3), size=4)
    assert res.counts.tolist() == [0] * 4 and res.curve == {1: 0.0, 3: 0.0}


def test_evaluation_is_seeded_and_leaves_the_callers_random_state(tiny):
    model, tok = tiny
    torch.manual_seed(123)
    state = torch.random.get_rng_state()
    a = evaluate_pass_at_k(model, tok, TASK, n=4, ks=(1, 4), size=16, seed=5)
    assert torch.equal(torch.random.get_rng_state(), state)
    b = evaluate_pass_at_k(model, tok, TASK, n=4, ks=(1, 4), size=16, seed=5)
    c = evaluate_pass_at_k(model, tok, TASK, n=4, ks=(1, 4), size=16, seed=6)
    assert torch.equal(a.counts, b.counts) and not torch.equal(a.counts, c.counts)


@pytest.mark.parametrize("kwargs,message", [
    (dict(n=4, ks=(1, 8)), "k=8 in `ks` is larger than `n`=4"),
    (dict(n=0, ks=(1,)), "`n` must be an int >= 1"),
    (dict(n=2.0, ks=(1,)), "`n` must be an int >= 1"),
    (dict(ks=()), "`ks` must be a non-empty list"),
    (dict(ks=4), "`ks` must be a non-empty list"),
    (dict(ks=(0, 1)), "`ks` must hold ints >= 1"),
    (dict(ks=(1.5,)), "`ks` must hold ints >= 1"),
    (dict(size=0), "`size` must be an int >= 1"),
    (dict(temperature=0.0), "pass@k needs sampling"),
    (dict(temperature=-1.0), "`temperature` must be a finite number >= 0"),
])
def test_evaluation_bad_inputs(tiny, kwargs, message):
    model, tok = tiny
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        evaluate_pass_at_k(model, tok, TASK, **kwargs)
    with pytest.raises(TypeError, match="`task` must be a Task"): evaluate_pass_at_k(model, tok, "addition")


def brute_force(correct: list[int], k: int) -> list[float]:
    "Every k-subset of the group: reward = its best member; advantage = mean (R - mean) / std over a rollout's subsets."
    subsets = list(itertools.combinations(range(len(correct)), k))
    reward = [max(correct[i] for i in s) for s in subsets]
    mean = statistics.fmean(reward)
    std = statistics.pstdev(reward)
    if std == 0: return [0.0] * len(correct)
    return [statistics.fmean((x - mean) / std for s, x in zip(subsets, reward) if i in s) for i in range(len(correct))]


@pytest.mark.parametrize("n", range(1, 10))
def test_advantages_equal_the_enumeration_of_every_k_subset(n):
    for c in range(n + 1):
        correct = [0] * (n - c) + [1] * c
        for k in range(1, n + 1):
            got = compute_passk_advantages(torch.tensor(correct, dtype=torch.float), k=k, eps=0.0)
            torch.testing.assert_close(got, torch.tensor(brute_force(correct, k), dtype=torch.float),
                                       atol=1e-5, rtol=1e-5, msg=lambda m: f"n={n} c={c} k={k}: {m}")


def test_advantages_by_hand_and_their_properties():
    # N=4, one right, k=2: R = 1 - 3/6 = 1/2, sigma = 1/2; pos (1/2)/(1/2) = 1; neg (1/2 - 2/3)/(1/2) = -1/3
    torch.testing.assert_close(compute_passk_advantages([1., 0, 0, 0], k=2, eps=0.0),
                               torch.tensor([1., -1 / 3, -1 / 3, -1 / 3]))
    # the authors' eps=1e-6 on the std: the same to 6 digits
    torch.testing.assert_close(compute_passk_advantages([1., 0, 0, 0], k=2), torch.tensor([1., -1 / 3, -1 / 3, -1 / 3]))
    # N=8, two right, k=4: R = 55/70, sigma = sqrt(33)/14: pos 3/sqrt(33), neg -1/sqrt(33)
    a = compute_passk_advantages([1., 1, 0, 0, 0, 0, 0, 0], k=4, eps=0.0)
    torch.testing.assert_close(a, torch.tensor([3.] * 2 + [-1.] * 6) / math.sqrt(33))
    # groups in any order and of different sizes; k=1 is GRPO with the population std
    r = torch.tensor([1., 0, 1, 0, 0, 1, 0, 1, 1])
    ids = torch.tensor([2, 0, 0, 1, 2, 1, 2, 2, 1])  # sizes 2, 3, 4
    size = torch.tensor([4, 2, 2, 3, 4, 3, 4, 4, 3.])
    torch.testing.assert_close(compute_passk_advantages(r, ids, k=1, eps=0.0),
                               compute_grpo_advantages(r, ids, eps=0.0) * (size / (size - 1)).sqrt())
    adv = compute_passk_advantages(r, ids, k=2)
    for g in range(3): assert adv[ids == g].sum().item() == pytest.approx(0.0, abs=1e-5)
    assert not adv.requires_grad and adv.dtype == torch.float32
    assert torch.equal(compute_passk_advantages(r * 0.5, ids, k=2, threshold=0.5), adv)  # right from the threshold on
    assert torch.equal(compute_passk_advantages(torch.tensor([1., 1, 1, 0]), group_size=4, k=2), torch.zeros(4))
    assert torch.equal(compute_passk_advantages(torch.zeros(4), group_size=4, k=2), torch.zeros(4))


@pytest.mark.parametrize("kwargs,message", [
    (dict(k=5), "`k`=5 is larger than a group of 4 rollouts"),
    (dict(k=0), "`k` must be an int >= 1"),
    (dict(k=2.0), "`k` must be an int >= 1"),
    (dict(k=True), "`k` must be an int >= 1"),
    (dict(threshold=float("inf")), "`threshold` must be a finite number"),
    (dict(threshold="1"), "`threshold` must be a finite number"),
    (dict(eps=-1e-6), "`eps` must be a finite number >= 0"),
    (dict(group_size=3), "not divisible by `group_size`=3"),
])
def test_advantages_bad_inputs(kwargs, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(")):
        compute_passk_advantages(torch.tensor([1., 0, 0, 0, 1, 1, 0, 0]), **{"group_size": 4, **kwargs})
    with pytest.raises(ValueError, match="NaN"): compute_passk_advantages(torch.tensor([1., float("nan")]), k=1)


SMALL = dict(num_iterations=2, prompts_per_step=2, group_size=4, max_new_tokens=6, eval_every=0)


def test_grpo_passk_is_registered_and_runs_by_name_in_train():
    assert ALGORITHMS["grpo_passk"].advantage_fn is compute_passk_advantages
    assert create_algorithm_config("grpo_passk")["k"] == 4
    seen = []
    state = train(create_training_config(**SMALL, algorithm="grpo_passk", algorithm_options={"k": 2}),
                  logger=lambda s, st: seen.append(st.custom_metrics["algorithm"]), progress=False)
    assert seen == ["grpo_passk"] * 2 and state.global_step == 2
    for k in (4, 8):  # refused before anything loads: at k = group size every advantage is 0
        with pytest.raises(ValueError, match=f"`k`={k} with group_size=4: every {k}-subset"):
            train(create_training_config(**SMALL, algorithm="grpo_passk", algorithm_options={"k": k}), progress=False)


def test_switching_from_grpo_to_grpo_passk_mid_run():
    seen = []
    configs = [create_algorithm_config("grpo"), create_algorithm_config("grpo_passk", k=2)]
    state = train(create_training_config(**SMALL), algorithm_config=lambda it: configs[it],
                  logger=lambda s, st: seen.append(st.custom_metrics["algorithm"]), progress=False)
    assert seen == ["grpo", "grpo_passk"] and state.global_step == 2


@pytest.mark.parametrize("options", [dict(k=2, threshold=0.5), dict(k=3, threshold=0.5, aggregation="token_mean")])
def test_micro_batches_give_the_full_batch_gradient(setting, options):
    "As tests/test_micro_batches.py checks every entry, with half of its random rewards counting as right."
    full = accumulated_grads(setting, "grpo_passk", options, None)
    micro = accumulated_grads(setting, "grpo_passk", options, GROUP)  # whole groups of 4
    assert full and full.keys() == micro.keys() and any(g.abs().sum() > 0 for g in full.values())  # not all-zero
    for key in full: torch.testing.assert_close(micro[key], full[key], rtol=1e-4, atol=1e-6)


def test_sampler_trainer_corrections_apply_token_by_token():
    "Its loss is grpo_loss: the rollout corrections of rlnb.rollout_corrections weight each token, as for grpo."
    assert ALGORITHMS["grpo_passk"].correction_level == ALGORITHMS["grpo"].correction_level == "token"
    state = train(create_training_config(**SMALL, algorithm="grpo_passk", algorithm_options={"k": 2},
                                         generator="hf_bf16", rollout_correction="tis_token"), progress=False)
    assert state.global_step == 2
