"rlnb.environments: tools, the text / verification / conversation environments and users, through multi-turn rollouts."
import pytest
import torch

from rlnb.core import Conversation, Generation, GenerationConfig, Message
from rlnb.environments import (ConversationState, count_letters, create_conversation_environment, create_model_user,
                               create_text_environment, create_verification_environment, create_verifier_tool,
                               scripted_user, swap_roles)
from rlnb.multiturn import create_multiturn_rollout, parse_tool_calls
from rlnb.tasks import get_task
from rlnb.tiny import create_tiny_tokenizer, load_tiny_model
from rlnb.tools import calculator, execute_tools

torch.set_num_threads(1)
exact = lambda text, answer: text.strip() == str(answer)


@pytest.fixture(scope="module")
def tiny():
    return load_tiny_model("addition", progress=False)


def scripted(*replies):
    "A `generator` that writes replies[t] at turn t in every episode (ending with EOS)."
    turn = [0]
    def generator(model, tokenizer, prompts, config):
        text = replies[min(turn[0], len(replies) - 1)]; turn[0] += 1
        ids = tokenizer(text, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
        return [Generation(text, token_ids=ids, finish_reason="stop")] * (len(prompts) * config.num_return_sequences)
    return generator


def play(env, *replies, max_turns=6, answer="42"):
    "One scripted episode of `env` on 'What is 6*7?'."
    batch = create_multiturn_rollout(None, create_tiny_tokenizer(), ["What is 6*7?"],
                                     GenerationConfig(max_new_tokens=64), env=env, answers=[answer],
                                     generator=scripted(*replies), max_turns=max_turns)
    return batch.rollouts[0]


def call(name, arg): return f'<tool name="{name}">{arg}</tool>'


def chat(*texts):
    return Conversation(tuple(Message(("user", "assistant")[k % 2], t) for k, t in enumerate(texts)))


# ------------------------------------------------------------------------------------------------------------ tools
def test_count_letters_runs_as_a_tool_under_the_timeout():
    calls = parse_tool_calls(call("count_letters", '{"text": "Strawberry", "letter": "R"}')
                             + call("count_letters", '{"text": "' + "a" * 10_001 + '", "letter": "a"}')
                             + call("calculator", "2**10"))
    results = execute_tools(calls, tools={"count_letters": count_letters, "calculator": calculator}, timeout_s=5.0)
    assert results[0]["content"] == "3" and results[0]["error"] is None
    assert "longer than 10000" in results[1]["error"]
    assert results[2]["error"]  # ** is not in the calculator's grammar: never evaluated by Python
    with pytest.raises(TypeError, match="`letter` must be a str"): count_letters("abc", None)


def test_verifier_tool():
    verify = create_verifier_tool(exact, "42")
    assert (verify("42"), verify("41")) == ("correct", "incorrect")
    with pytest.raises(TypeError, match="`check` must be a function"): create_verifier_tool("exact", "42")


# ----------------------------------------------------------------------------------------------------- text env
def test_text_environment_reward_is_the_check(tiny):
    model, tokenizer = tiny
    task = get_task("addition")
    prompts = task.sample(16, seed=1)
    batch = create_multiturn_rollout(model, tokenizer, prompts, GenerationConfig(max_new_tokens=8, do_sample=False),
                                     env=create_text_environment(task.check), max_turns=3)
    expected = [float(task.check(r.generation.text, p.answer)) for r, p in zip(batch.rollouts, prompts)]
    assert [r.rewards for r in batch.rollouts] == expected
    assert 0 < sum(expected) < 16  # both outcomes occur, so the comparison means something
    assert all(r.metadata["num_turns"] == 1 and r.metadata["finish_reason"] == "stop" for r in batch.rollouts)
    assert create_text_environment().step(None, chat("?", "x")).reward == 0.0  # no check: reward 0


# ---------------------------------------------------------------------------------------------- verification env
def test_verification_reward_is_score_minus_cost():
    env = create_verification_environment(exact, tool_budget=2, tool_cost=0.25, timeout_s=None)
    r = play(env, call("calculator", "6*7"), call("verify", "42"), "42")
    assert r.rewards == pytest.approx(1.0 - 2 * 0.25)
    assert [x["content"] for x in r.tool_results] == ["42", "correct"]
    assert r.metadata["turns"][-1]["score"] == 1.0 and r.metadata["turns"][-1]["tool_cost"] == pytest.approx(0.5)
    wrong = play(env, call("verify", "41"), "41")  # verified, told it is wrong, answered it anyway
    assert wrong.rewards == pytest.approx(0.0 - 0.25) and wrong.tool_results[0]["content"] == "incorrect"


def test_budget_ends_the_episode_with_score_zero():
    env = create_verification_environment(exact, tool_budget=1, tool_cost=0.25, timeout_s=None)
    r = play(env, call("calculator", "6*7"), call("verify", "42"), "42")  # the second call goes over
    assert (r.metadata["num_turns"], len(r.tool_calls), r.metadata["finish_reason"]) == (2, 1, "stop")
    assert r.metadata["turns"][-1]["over_budget"] == 1
    assert r.rewards == pytest.approx(0.0 - 0.25)  # no answer scored, one call paid
    both = play(env, call("calculator", "6*7") + call("verify", "42"), "42")  # two calls in one turn: none run
    assert (both.metadata["num_turns"], len(both.tool_calls), both.rewards) == (1, 0, 0.0)
    free = play(create_verification_environment(exact, tool_budget=0, tool_cost=0.25, timeout_s=None), "42")
    assert free.rewards == 1.0  # a budget of 0 still lets the model answer


def test_verifier_works_in_a_child_process():
    "The default timeout runs each call in a forked child; the per-episode verifier must survive that."
    env = create_verification_environment(exact, tool_budget=3, tool_cost=0.1, timeout_s=5.0)
    r = play(env, call("verify", "42"), "42")
    assert r.tool_results[0]["content"] == "correct" and r.rewards == pytest.approx(0.9)


def test_verification_bad_inputs():
    with pytest.raises(TypeError, match="`check` must be a function"): create_verification_environment(None)
    with pytest.raises(ValueError, match="`tool_budget` must be an int >= 0"):
        create_verification_environment(exact, tool_budget=1.5)
    with pytest.raises(ValueError, match="`tool_cost` must be a finite number >= 0"):
        create_verification_environment(exact, tool_cost=-1)
    with pytest.raises(TypeError, match="`tools` must be a dict"):
        create_verification_environment(exact, tools=[calculator])
    with pytest.raises(ValueError, match="named 'verify'"):
        create_verification_environment(exact, tools={"verify": calculator})
    env = create_verification_environment(exact)
    with pytest.raises(ValueError, match="no reference answer"): env.reset(chat("?"), None)
    bad = create_verification_environment(lambda text, answer: float("nan"), timeout_s=None)
    with pytest.raises(ValueError, match="`check` returned nan"): bad.step(bad.reset(chat("?"), "1"), chat("?", "1"))


# ---------------------------------------------------------------------------------------------- conversation env
def test_conversation_ends_when_the_user_leaves():
    seen = []
    def user_fn(state, conversation):
        seen.append((state.turn, state.answer, len(conversation.messages)))
        return "Are you sure?" if state.turn < 2 else None
    env = create_conversation_environment(user_fn, turn_reward=lambda s, c: 0.5,
                                          final_reward=lambda s, c: float(c.messages[-1].content == s.answer))
    r = play(env, "41", "42", "43", max_turns=5)
    assert (r.metadata["num_turns"], r.metadata["finish_reason"]) == (2, "stop")  # left before the rollout's cap
    assert [m.content for m in r.conversation.messages] == ["What is 6*7?", "41", "Are you sure?", "42"]
    assert seen == [(1, "42", 2), (2, "42", 4)]
    assert r.rewards == pytest.approx(0.5 + 0.5 + 1.0)  # two turn rewards, then the final answer's
    assert r.loss_mask.count(0) > 0 and "Are you sure?" not in create_tiny_tokenizer().decode(
        [t for t, m in zip(r.token_ids, r.loss_mask) if m])  # the user's turn is in the stream, not trained


def test_scripted_user_and_env_max_turns():
    env = create_conversation_environment(scripted_user(["Again?", "Once more?", "Last?"]), max_turns=2,
                                          final_reward=lambda s, c: 3.0)
    r = play(env, "1", "2", "3", max_turns=5)
    assert r.metadata["num_turns"] == 2 and r.rewards == 3.0  # the env's cap ends it and gives the final reward
    assert [m.content for m in r.conversation.messages[2::2]] == ["Again?"]
    user = scripted_user(["a", "b"])
    assert [user(ConversationState(turn=t), chat()) for t in (1, 2, 3)] == ["a", "b", None]


def test_model_user_runs(tiny):
    model, tokenizer = tiny
    user = create_model_user(model, tokenizer, GenerationConfig(max_new_tokens=6, do_sample=False),
                             system_prompt="Check.")
    env = create_conversation_environment(user, max_turns=3)
    prompts = get_task("addition").sample(4, seed=2)
    batch = create_multiturn_rollout(model, tokenizer, prompts, GenerationConfig(max_new_tokens=8, do_sample=False),
                                     env=env, max_turns=3)
    for r in batch.rollouts:
        roles = [m.role for m in r.conversation.messages]
        assert roles == ["user", "assistant"] * r.metadata["num_turns"], roles
        assert all(m.content for m in r.conversation.messages)  # the model's user wrote something each time
    assert max(r.metadata["num_turns"] for r in batch.rollouts) > 1  # the model user replied rather than leaving
    assert swap_roles(chat("q", "a"), "Check.").messages == (Message("system", "Check."), Message("assistant", "q"),
                                                             Message("user", "a"))


def test_conversation_bad_inputs(tiny):
    model, tokenizer = tiny
    with pytest.raises(TypeError, match="`user_fn` must be a function"): create_conversation_environment("hello")
    with pytest.raises(TypeError, match="`final_reward` must be a function"):
        create_conversation_environment(scripted_user(["a"]), final_reward=1.0)
    with pytest.raises(ValueError, match="`max_turns` must be an int >= 1"):
        create_conversation_environment(scripted_user(["a"]), max_turns=0)
    env = create_conversation_environment(lambda s, c: ["not", "a", "str"])
    with pytest.raises(TypeError, match="`user_fn` returned a list"):
        env.step(env.reset(chat("?"), None), chat("?", "1"))
    env = create_conversation_environment(scripted_user(["a"]), turn_reward=lambda s, c: "good")
    with pytest.raises(ValueError, match="`turn_reward` returned 'good'"): env.step(ConversationState(), chat("?", "1"))
    with pytest.raises(TypeError, match="`lines` must be a list of str"): scripted_user(["a", 2])
    with pytest.raises(TypeError, match="`gen_config` must be a GenerationConfig"):
        create_model_user(model, tokenizer, {})
    with pytest.raises(TypeError, match="`check` must be a function"): create_text_environment(check=1)
