"The tool-use task (rlnb.tool_use): its pieces, and a short GRPO run from the SFT start that raises the reward."
import pytest
import torch

from rlnb.core import Generation, Rollout
from rlnb.quickstart import quick_start_training
from rlnb.tool_use import (create_tool_use_rollout_fn, evaluate_tool_use, load_tool_use_model,
                           create_tool_demonstrations, products_task, tool_demonstration, tool_use_config,
                           tool_use_stats)

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def sft_model():
    return load_tool_use_model()  # trained and cached on the first call (20-60 s), loaded afterwards


def test_task_and_demonstrations():
    task = products_task()
    examples = task.sample(50, seed=3)
    factors = [tuple(map(int, e.prompt[:-1].split("*"))) for e in examples]
    assert all(10 <= a <= 99 and 10 <= b <= 99 and a * b == int(e.answer) for (a, b), e in zip(factors, examples))
    demo = tool_demonstration(examples[0])
    assert [m.role for m in demo.messages] == ["system", "user", "assistant", "tool", "assistant"]
    assert demo.messages[2].content == f'<tool name="calculator">{examples[0].prompt[:-1]}</tool>'
    assert demo.messages[3].content == demo.messages[4].content == examples[0].answer
    assert [m.role for m in tool_demonstration(examples[0], system_prompt=None).messages][0] == "user"
    assert len(create_tool_demonstrations(task, 5, seed=1)) == 5


def test_bad_inputs_name_the_argument():
    with pytest.raises(ValueError, match="`digits`"): products_task(digits=0)
    with pytest.raises(ValueError, match="`n` must be an int >= 1"): create_tool_demonstrations(products_task(), 0)
    with pytest.raises(TypeError, match="`task` must be a Task"): create_tool_demonstrations("products", 3)
    with pytest.raises(TypeError, match="must have a .prompt"): tool_demonstration("37*48=")
    with pytest.raises(TypeError, match="`task` must be a Task"): create_tool_use_rollout_fn(task="products")
    with pytest.raises(ValueError, match="`rollouts` is empty"): tool_use_stats([])
    with pytest.raises(ValueError, match="num_iteration"): tool_use_config(num_iteration=3)


def test_stats_count_right_calls_and_copies():
    def episode(call, result, reply):
        calls = () if call is None else ({"name": "calculator", "arguments": call, "raw": ""},)
        results = () if result is None else ({"content": result, "error": None},)
        return Rollout("p", generation=Generation(reply), tool_calls=calls, tool_results=results,
                       metadata={"question": "12*34="})
    stats = tool_use_stats([episode("12*34", "408", "408"), episode("12*35", "420", "420"),
                            episode("12*34", "408", "407"), episode(None, None, "408")])
    assert stats == {"tool_use/right_call": 0.5, "tool_use/copied_result": 0.5, "tool_use/no_call": 0.25}


@pytest.mark.slow
def test_short_rl_run_raises_the_reward(sft_model):
    "30 GRPO iterations (64 episodes each) from the SFT start: the held-out reward rises by a clear margin."
    model, tokenizer = sft_model
    start = evaluate_tool_use(model, tokenizer, n=128)
    assert 0.03 < start["reward"] < 0.35 and start["calls_per_episode"] > 0.8, start
    # (above: the format is learned, the copying half-learned)
    task = products_task()
    state, metrics = quick_start_training(tool_use_config(num_iterations=30, seed=0), model=model, tokenizer=tokenizer,
                                          prompts=task.sample(2000, seed=0), rollout_fn=create_tool_use_rollout_fn(),
                                          progress=False)
    assert len(metrics) == 30
    assert {"tools/calls_per_episode", "tool_use/right_call", "tool_use/copied_result"} <= set(metrics.columns)
    end = evaluate_tool_use(state.model, tokenizer, n=128)
    # Measured when written (256 held-out episodes, start 0.098): +0.148, +0.082, +0.145 with seeds 0, 1, 2; from the
    # SFT start stopped on a measured reward (start 0.117 on 128 x 2 episodes), this test passes with seed 0. The two
    # evaluations share prompts and random stream, so an unchanged model scores the same; one changed at random moves
    # by about 0.03 (one standard error of a 256-episode share near 0.1).
    assert end["reward"] >= start["reward"] + 0.05, (start, end)
