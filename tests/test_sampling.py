"Sampling with filters: each group filter, and the filtered rollout_fn's counts, caps, group integrity and determinism."
import pytest
import torch

from rlnb.core import Batch, Generation, Rollout, create_training_config, set_seed
from rlnb.rollouts import create_prompt_loader, create_rollout_fn
from rlnb.sampling import (batch_groups, combine_filters, create_filtered_rollout_fn, create_prompt_source,
                           diversity_filter, length_filter, min_reward_filter, nonzero_std_filter)
from rlnb.tasks import get_task

torch.set_num_threads(1)
CFG = create_training_config(group_size=3, eval_every=0)


def rollout(reward=0.0, text="7", group=0, n_tokens=2, status="completed"):
    return Rollout("3+4=", Generation(text), token_ids=list(range(n_tokens)), rewards=reward, group_index=group,
                   status=status)


def fake_rollout_fn(model, tokenizer, prompts, config):
    "`config.group_size` rollouts per prompt: prompts named 'mixed...' get rewards 0, 1, 0, ...; others all 1."
    G = config.group_size
    return Batch([Rollout(p, Generation(f"{p}/{j}"), token_ids=[1],
                          rewards=float(j % 2) if p.startswith("mixed") else 1.0,
                          group_index=i, metadata={"prompt_index": i})
                  for i, p in enumerate(prompts) for j in range(G)],
                 {"group_size": G})


def groups_ok(batch, group_size):
    "Groups numbered 0..n-1 in order, each whole: group_size rollouts of one prompt."
    gs = batch_groups(batch)
    assert [r.group_index for r in batch.rollouts] == [i for i in range(len(gs)) for _ in range(group_size)]
    assert all(len(g) == group_size and len({r.prompt for r in g}) == 1 for g in gs)
    return gs


def test_nonzero_std_filter():
    assert nonzero_std_filter([rollout(1.0), rollout(0.0)])
    assert not nonzero_std_filter([rollout(0.0), rollout(0.0), rollout(0.0)])
    assert not nonzero_std_filter([rollout(1.0)])
    assert nonzero_std_filter([rollout((1.0, 0.0)), rollout((1.0, 1.0))])
    assert not nonzero_std_filter([rollout((1.0, 0.0)), rollout((1.0, 0.0))])


def test_min_reward_filter():
    g = [rollout(1.0), rollout(0.0), rollout(0.5)]
    assert min_reward_filter(0.5)(g) and not min_reward_filter(0.51)(g)
    assert min_reward_filter(1.0, "max")(g) and not min_reward_filter(0.1, "min")(g)
    with pytest.raises(ValueError, match="statistic"): min_reward_filter(0.5, "median")


def test_diversity_filter():
    g = [rollout(text="7"), rollout(text="7"), rollout(text="8")]
    assert diversity_filter(2)(g) and not diversity_filter(3)(g)
    assert not diversity_filter(2)(g[:2])
    with pytest.raises(ValueError, match="min_distinct"): diversity_filter(0)


def test_length_filter():
    g = [rollout(n_tokens=2), rollout(n_tokens=4)]
    assert length_filter(1, 4)(g) and not length_filter(3)(g) and not length_filter(1, 3)(g)
    assert not length_filter()(g + [rollout(status="truncated")])
    assert length_filter(drop_truncated=False)(g + [rollout(status="truncated")])
    assert not length_filter()([rollout(text="", n_tokens=0)])


def test_combine_filters():
    both = combine_filters(nonzero_std_filter, diversity_filter(2))
    assert both([rollout(1.0, "7"), rollout(0.0, "8")])
    assert not both([rollout(1.0, "7"), rollout(0.0, "7")])  # spread but no diversity
    assert not both([rollout(0.0, "8"), rollout(0.0, "9")])  # diversity but no spread
    assert combine_filters()([rollout()])
    with pytest.raises(TypeError, match="filter 0"): combine_filters(1)


def test_exactly_the_requested_groups_when_enough_pass():
    pool = [f"mixed-x{i}" for i in range(20)]
    fn = create_filtered_rollout_fn(fake_rollout_fn, nonzero_std_filter, prompt_source=pool)
    b = fn(None, None, ["solved-0", "mixed-0", "solved-1", "mixed-1", "solved-2"], CFG)
    gs = groups_ok(b, 3)
    assert len(gs) == 5 and [g[0].prompt for g in gs[:2]] == ["mixed-0", "mixed-1"]
    assert all(g[0].prompt in pool for g in gs[2:])
    assert [g[0].metadata["sampling_round"] for g in gs] == [0, 0, 1, 1, 1]
    assert [g[0].metadata["prompt_index"] for g in gs] == [0, 1, 2, 3, 4]
    m = b.batch_metadata
    assert (m["sampling/groups_requested"], m["sampling/groups_generated"], m["sampling/groups_passed"],
            m["sampling/groups_kept"], m["sampling/rounds"]) == (5, 8, 5, 5, 2)
    assert m["sampling/kept_frac"] == pytest.approx(5 / 8) and m["sampling/pass_frac"] == pytest.approx(5 / 8)
    assert (m["num_prompts"], m["group_size"]) == (5, 3)


def test_over_sampling_trims_the_surplus():
    fn = create_filtered_rollout_fn(fake_rollout_fn, lambda g: True, over_sampling_factor=2.0,
                                    prompt_source=["mixed-a", "mixed-b"])
    b = fn(None, None, ["solved-0", "mixed-0"], CFG)
    assert [g[0].prompt for g in groups_ok(b, 3)] == ["solved-0", "mixed-0"]  # own prompts first, extras trimmed
    assert (b.batch_metadata["sampling/groups_generated"], b.batch_metadata["sampling/groups_passed"]) == (4, 4)
    assert b.batch_metadata["sampling/kept_frac"] == 0.5
    fn = create_filtered_rollout_fn(fake_rollout_fn, lambda g: True, over_sampling_factor=1.1)
    assert fn(None, None, [f"p{i}" for i in range(10)], CFG).batch_metadata["sampling/groups_generated"] == 11  # not 12


def test_fewer_groups_after_max_rounds():
    calls = []
    def counting(model, tok, prompts, config):
        calls.append(list(prompts))
        return fake_rollout_fn(model, tok, prompts, config)
    fn = create_filtered_rollout_fn(counting, nonzero_std_filter, max_rounds=2)  # no source: cycles the given prompts
    b = fn(None, None, ["solved-0", "mixed-0", "solved-1"], CFG)
    assert calls == [["solved-0", "mixed-0", "solved-1"], ["solved-0", "mixed-0"]]
    assert [g[0].prompt for g in groups_ok(b, 3)] == ["mixed-0", "mixed-0"]
    assert (b.batch_metadata["sampling/rounds"], b.batch_metadata["sampling/groups_kept"],
            b.batch_metadata["num_prompts"]) == (2, 2, 2)
    none = create_filtered_rollout_fn(fake_rollout_fn, lambda g: False, max_rounds=3)(None, None, ["mixed-0"], CFG)
    assert (len(none) == 0 and none.batch_metadata["sampling/groups_generated"] == 3
            and none.batch_metadata["sampling/kept_frac"] == 0)


def test_deterministic_extra_prompts_for_the_same_iteration_and_seed():
    task = get_task("addition")
    loader = create_prompt_loader(task, 4, seed=0)
    seen = []
    def recording(model, tok, prompts, config):
        seen.append([p.prompt for p in prompts])
        return fake_rollout_fn(model, tok, ["solved"] * len(prompts), config)  # nothing passes: every round runs
    fn = create_filtered_rollout_fn(recording, nonzero_std_filter, max_rounds=3, prompt_source=task)
    fn(None, None, loader(5), CFG); first = seen[:]; seen.clear()
    fn(None, None, loader(5), CFG); assert seen == first  # same iteration, same seed: same rounds of prompts
    seen.clear(); fn(None, None, loader(6), CFG); assert seen[1] != first[1]  # another iteration: other extras
    seen.clear(); fn(None, None, loader(5), CFG._replace(seed=1)); assert seen[1] != first[1]  # another seed
    assert first[0] == [p.prompt for p in loader(5)] and first[1] != first[2]


def test_tiny_model_rounds_reproduce():
    from rlnb.tiny import load_tiny_model
    task = get_task("addition")
    model, tok = load_tiny_model("addition")
    cfg = create_training_config(prompts_per_step=6, group_size=4, max_new_tokens=6, eval_every=0)
    fn = create_filtered_rollout_fn(create_rollout_fn(task.reward_fn), nonzero_std_filter, 1.5, 3, prompt_source=task)
    prompts = create_prompt_loader(task, 6, seed=0)(2)
    out = []
    for _ in range(2):
        set_seed(2)
        b = fn(model, tok, prompts, cfg)
        out.append(([(r.prompt, r.generation.text, r.rewards, r.group_index) for r in b.rollouts],
                    b.batch_metadata["sampling/groups_generated"]))
    assert out[0] == out[1]
    gs = groups_ok(b, 4)
    assert len(gs) <= 6 and all(nonzero_std_filter(g) for g in gs)


def test_prompt_source_and_bad_arguments():
    src = create_prompt_source(["a", "b", "c"])
    assert sorted(src(3, 1)) == ["a", "b", "c"] and src(7, 1) == src(7, 1)
    with pytest.raises(ValueError, match="over_sampling_factor"):
        create_filtered_rollout_fn(fake_rollout_fn, nonzero_std_filter, 0.9)
    with pytest.raises(ValueError, match="max_rounds"):
        create_filtered_rollout_fn(fake_rollout_fn, nonzero_std_filter, max_rounds=0)
    with pytest.raises(ValueError, match="prompt_source` returned 1"):
        create_filtered_rollout_fn(fake_rollout_fn, lambda g: False,
                                   prompt_source=lambda n, seed: ["x"])(None, None, ["p", "q"], CFG)
    with pytest.raises(TypeError, match="must return a Batch"):
        create_filtered_rollout_fn(lambda *a: [], nonzero_std_filter)(None, None, ["p"], CFG)


@pytest.mark.slow
def test_dynamic_sampling_in_a_training_run():
    "`train` takes the wrapped rollout_fn as it is; its sampling counts reach the logged metrics."
    from rlnb.training import train
    task, rows = get_task("addition"), []
    dapo_sampling = create_filtered_rollout_fn(create_rollout_fn(task.reward_fn), nonzero_std_filter, max_rounds=3,
                                               prompt_source=task)
    state = train(create_training_config(num_iterations=3, eval_every=0), rollout_fn=dapo_sampling, progress=False,
                  logger=lambda s, st: rows.append(dict(st.custom_metrics)))
    assert state.iteration == 3 and len(rows) == 3
    assert all(0 < r["sampling/groups_kept"] <= 16 and r["sampling/rounds"] >= 1 and "reward/mean" in r for r in rows)


def test_sampling_settings_with_the_catalogues_dapo_defaults():
    from rlnb.catalogue import DAPO_DEFAULTS
    from rlnb.core import TrainingConfig
    from rlnb.sampling import sampling_settings
    got = sampling_settings(TrainingConfig(), DAPO_DEFAULTS)
    assert {k: v for k, v in got.items() if k != "overlong_penalty"} == dict(
        dynamic_sampling=True, over_sampling_factor=3, max_sampling_rounds=3, overlong_buffer=4)
    assert sampling_settings(TrainingConfig(overlong_buffer=0), DAPO_DEFAULTS)["overlong_buffer"] == 0  # config wins
