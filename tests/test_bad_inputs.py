"""Bad inputs across the public API: each gets an exception of the right type whose message names the argument (or the
file and what is wrong with it), never a raw IndexError / KeyError / JSONDecodeError / torch or safetensors
RuntimeError.

Each case is one bad input; `CASES` lists them, `test_bad_input` runs each.
Count: `pytest tests/test_bad_inputs.py -q`."""
import copy, functools, json, math

import pytest
import torch

from bad_inputs import check_bad_input

from rlnb import algorithms, chat, checkpoints, core, generation, kl, loggers, logprobs, models, quickstart, rewards
from rlnb import reward_transforms
from rlnb import rollouts, tasks, tiny, tools, training
from rlnb.sft import sft as run_sft_fn
from rlnb.core import (Conversation, GenerationConfig, Generation, Message, ModelConfig, Rollout, TrainingState,
                       create_training_config)

torch.set_num_threads(1)
nan, inf = float("nan"), float("inf")


@functools.cache
def _tiny():
    return tiny.load_tiny_model(progress=False)


def tok(): return _tiny()[1]
def model(): return copy.deepcopy(_tiny()[0])  # a fresh copy: LoRA and loading change a model in place
def ro(rewards=0.0, **kw):
    "A small valid rollout."
    return Rollout(prompt="1+1=", generation=Generation("2"), prompt_token_ids=[1, 2], token_ids=[3, 4],
                   rewards=rewards, **kw)
def small(**kw):
    "The smallest useful run config."
    return create_training_config(**{**dict(num_iterations=1, prompts_per_step=2, group_size=2, max_new_tokens=2,
                                            eval_every=0, lora_r=0), **kw})
def gen(**kw): return generation.batch_generate(model(), tok(), ["1+1="], GenerationConfig(max_new_tokens=2, **kw))
def lp(B=2, C=3, fill=-1.0): return torch.full((B, C), fill, requires_grad=True)
def mask(B=2, C=3): return torch.ones(B, C)


CASES = []


def case(name, exc, contains, fn):
    """Register one bad input: `fn(tmp_path)` must raise `exc` with every string of `contains` ({tmp}: tmp_path) in its
    message."""
    CASES.append(pytest.param(fn, exc, (contains,) if isinstance(contains, str) else tuple(contains), id=name))


# --- rlnb.generation: configs and arguments --------------------------------------------------------------------------
case("gen/top_p=0", ValueError, "config.top_p", lambda t: gen(top_p=0.0))
case("gen/top_p=nan", ValueError, "config.top_p", lambda t: gen(top_p=nan))
case("gen/temperature<0", ValueError, "config.temperature", lambda t: gen(temperature=-1.0))
case("gen/temperature=nan", ValueError, "config.temperature", lambda t: gen(temperature=nan))
case("gen/temperature=inf", ValueError, "config.temperature", lambda t: gen(temperature=inf))
case("gen/top_k<-1", ValueError, "config.top_k", lambda t: gen(top_k=-5))
case("gen/top_k=float", ValueError, "config.top_k", lambda t: gen(top_k=2.5))
case("gen/max_new_tokens=0", ValueError, "config.max_new_tokens",
     lambda t: generation.batch_generate(model(), tok(), ["1+1="], GenerationConfig(max_new_tokens=0)))
case("gen/num_return_sequences=0", ValueError, "config.num_return_sequences", lambda t: gen(num_return_sequences=0))
case("gen/stop_strings=str", ValueError, "config.stop_strings", lambda t: gen(stop_strings="</s>"))
case("gen/config=dict", TypeError, "config",
     lambda t: generation.batch_generate(model(), tok(), ["1+1="], {"top_p": 1}))
case("gen/prompts=str", TypeError, "prompts", lambda t: generation.batch_generate(model(), tok(), "1+1="))
case("gen/prompts=[]", ValueError, "prompts", lambda t: generation.batch_generate(model(), tok(), []))
case("gen/prompt empty", ValueError, "prompts[0]", lambda t: generation.batch_generate(model(), tok(), [""]))
case("gen/prompt float", TypeError, "prompts[1]", lambda t: generation.batch_generate(model(), tok(), ["1+1=", 3.5]))
case("gen/batch_size=0", ValueError, "batch_size",
     lambda t: generation.batch_generate(model(), tok(), ["1+1="], batch_size=0))
case("gen/generator wrong count", ValueError, "generator",
     lambda t: generation.batch_generate(None, tok(), ["a", "b"], generator=lambda m, k, p, c: [Generation("x")]))
case("generate/n=2", ValueError, "num_return_sequences",
     lambda t: generation.generate(model(), tok(), "1+1=", GenerationConfig(num_return_sequences=2)))
case("generate/list of prompts", TypeError, "prompt", lambda t: generation.generate(model(), tok(), ["1+1=", "2+2="]))
case("left_pad/empty sequence", ValueError, "sequences[1]", lambda t: generation.left_pad([[1, 2], []], 0))
case("left_pad/pad None", ValueError, "pad_token_id", lambda t: generation.left_pad([[1, 2]], None))

# --- rlnb.models ------------------------------------------------------------------------------------------------------
case("models/unknown dtype", ValueError, "dtype",
     lambda t: models.load_model(ModelConfig("tiny", device="cpu", dtype="float33")))
case("models/unknown device", ValueError, "device", lambda t: models.load_model(ModelConfig("tiny", device="gpu0")))
case("models/config=int", TypeError, "config", lambda t: models.load_model(3))
case("models/lora target matches nothing", ValueError, ["target_modules", "nope_proj"],
     lambda t: models.apply_lora(model(), target_modules=["nope_proj"]))
case("models/lora r=0", ValueError, "`r`", lambda t: models.apply_lora(model(), r=0))
case("models/lora dropout=1.5", ValueError, "dropout", lambda t: models.apply_lora(model(), dropout=1.5))
case("models/load_model lora_r=0", ValueError, "lora_r",
     lambda t: models.load_model(ModelConfig("tiny", device="cpu", use_lora=True, lora_r=0)))
case("models/padding_side", ValueError, "padding_side", lambda t: models.load_tokenizer("tiny", padding_side="middle"))
case("models/empty local folder", (OSError, ValueError), "{tmp}",  # transformers' own error names the folder
     lambda t: models.load_model(ModelConfig(str(t), device="cpu")))

# --- rlnb.chat --------------------------------------------------------------------------------------------------------
case("chat/message without content", TypeError, "conversation[0]",
     lambda t: chat.apply_chat_template([{"role": "user"}], tok()))
case("chat/conversation=int", TypeError, "conversation", lambda t: chat.apply_chat_template(42, tok()))
case("chat/format_prompt int", TypeError, "prompt_or_messages", lambda t: chat.format_prompt(123, tok()))
case("chat/parse_thinking ids without tokenizer", ValueError, "tokenizer", lambda t: chat.parse_thinking([1, 2, 3]))
case("chat/parse_thinking None", TypeError, "text_or_ids", lambda t: chat.parse_thinking(None))

# --- rlnb.rewards -----------------------------------------------------------------------------------------------------
case("rewards/NaN", ValueError, ["reward function", "rollout 1"],
     lambda t: rewards.compute_batch_rewards([ro(), ro(1.0)], lambda r: nan if r.rewards == 1.0 else 1.0))
case("rewards/inf", ValueError, ["reward function", "rollout 0", "inf"],
     lambda t: rewards.compute_batch_rewards([ro()], lambda r: inf))
case("rewards/string", ValueError, ["reward function", "str"],
     lambda t: rewards.compute_batch_rewards([ro()], lambda r: "1.0"))
case("rewards/None", ValueError, ["reward function", "NoneType"],
     lambda t: rewards.compute_batch_rewards([ro()], lambda r: None))
case("rewards/vector wrong length", ValueError, ["rollout 1", "components"],
     lambda t: rewards.compute_batch_rewards([ro(), ro(1.0)], lambda r: [1.0, 2.0] if r.rewards == 0 else [1.0],
                                             is_vector=True))
case("rewards/vector NaN", ValueError, ["reward function", "nan"],
     lambda t: rewards.compute_batch_rewards([ro()], lambda r: [1.0, nan], is_vector=True))
case("rewards/vector string", ValueError, ["reward function", "str"],
     lambda t: rewards.compute_batch_rewards([ro()], lambda r: "1.0,2.0", is_vector=True))
case("rewards/empty", ValueError, "rollouts", lambda t: rewards.compute_batch_rewards([], lambda r: 1.0))
case("rewards/not callable", TypeError, "reward_fn", lambda t: rewards.compute_batch_rewards([ro()], 1.0))
case("rewards/aggregate NaN", ValueError, "rewards",
     lambda t: reward_transforms.aggregate_vector_rewards(torch.tensor([[1.0, nan]])))
case("rewards/aggregate strings", ValueError, "rewards",
     lambda t: reward_transforms.aggregate_vector_rewards(["a", "b"]))
case("rewards/aggregator and weights", ValueError, ["aggregator", "weights"],
     lambda t: reward_transforms.aggregate_vector_rewards([1.0, 2.0], reward_transforms.mean_aggregator, [1.0, 1.0]))
case("rewards/weights empty", ValueError, "weights", lambda t: reward_transforms.weighted_sum_aggregator([]))
case("rewards/weights inf", ValueError, "weights", lambda t: reward_transforms.weighted_sum_aggregator([1.0, inf]))
case("rewards/weights wrong K", ValueError, "weights",
     lambda t: reward_transforms.weighted_sum_aggregator([1.0, 2.0])(torch.ones(2, 3)))
case("rewards/normalize method", ValueError, "method",
     lambda t: reward_transforms.normalize_rewards([1.0, 2.0], method="softmax"))
case("rewards/normalize group_ids", ValueError, "group_ids",
     lambda t: reward_transforms.normalize_rewards([1.0, 2.0], group_ids=[0, 0, 1]))
case("rewards/normalize NaN", ValueError, "rewards", lambda t: reward_transforms.normalize_rewards([1.0, nan]))
case("rewards/normalizer 3-d", ValueError, "rewards",
     lambda t: reward_transforms.zscore_normalizer(torch.ones(2, 2, 2)))
case("rewards/normalizer returns NaN", ValueError, "normalizer",
     lambda t: reward_transforms.normalize_rewards([1.0, 2.0], normalizer=lambda r: r * nan))
case("rewards/shaping base_rewards length", ValueError, "base_rewards",
     lambda t: reward_transforms.apply_reward_shaping([ro(), ro()], [1.0], lambda r, x: x))
case("rewards/shaping returns NaN", ValueError, "shaping function",
     lambda t: reward_transforms.apply_reward_shaping([ro()], [1.0], lambda r, x: nan))
case("rewards/shaping base NaN", ValueError, ["base reward", "rollout 0"],
     lambda t: reward_transforms.apply_reward_shaping([ro()], [nan], lambda r, x: x))
case("rewards/kl shaping without KL", ValueError, "kl_divergence",
     lambda t: reward_transforms.kl_penalty_shaping(0.1)(ro(), 1.0))
case("rewards/kl shaping coef NaN", ValueError, "beta", lambda t: reward_transforms.kl_penalty_shaping(nan))
case("rewards/format_reward pattern", ValueError, "pattern", lambda t: rewards.format_reward("(unclosed"))
case("rewards/length buffer<0", ValueError, "buffer_length", lambda t: rewards.length_penalty_reward(buffer_length=-1))
case("rewards/transform normalizer", ValueError, "normalizer",
     lambda t: reward_transforms.create_reward_transform(normalizer="softmax"))
case("rewards/exact_match no answer", ValueError, "answer", lambda t: rewards.exact_match_reward(ro()))

# --- rlnb.algorithms: advantages and losses ---------------------------------------------------------------------------
adv = algorithms.compute_grpo_advantages
case("adv/2-d rewards", ValueError, "rewards", lambda t: adv(torch.ones(4, 2), group_size=2))
case("adv/inf reward", ValueError, ["rewards", "finite"], lambda t: adv([1.0, inf, 0.0, 1.0], group_size=2))
case("adv/NaN reward", ValueError, ["rewards", "finite"], lambda t: adv([1.0, nan, 0.0, 1.0], group_size=2))
case("adv/string rewards", ValueError, "rewards", lambda t: adv(["1.0", "0.0"]))
case("adv/empty", ValueError, "rewards", lambda t: adv([]))
case("adv/group_size not dividing", ValueError, "group_size", lambda t: adv([1.0, 0.0, 1.0, 0.0], group_size=3))
case("adv/group_size=1", ValueError, "group_size", lambda t: adv([1.0, 0.0], group_size=1))
case("adv/group_size=0", ValueError, "group_size", lambda t: adv([1.0, 0.0], group_size=0))
case("adv/group_ids length", ValueError, "group_ids", lambda t: adv([1.0, 0.0, 1.0], group_ids=[0, 0]))
case("adv/group_ids float", TypeError, "group_ids", lambda t: adv([1.0, 0.0], group_ids=[0.5, 0.5]))
case("adv/scale", ValueError, "scale", lambda t: adv([1.0, 0.0], scale="max"))
case("adv/eps<0", ValueError, "eps", lambda t: adv([1.0, 0.0], eps=-1.0))
case("adv/eps NaN", ValueError, "eps", lambda t: adv([1.0, 0.0], eps=nan))
L = algorithms.grpo_loss
case("loss/old_logprobs shape", ValueError, "old_logprobs", lambda t: L(lp(), lp(2, 4), torch.ones(2), mask()))
case("loss/loss_mask shape", ValueError, "loss_mask", lambda t: L(lp(), lp(), torch.ones(2), mask(3, 3)))
case("loss/advantages shape", ValueError, "advantages", lambda t: L(lp(), lp(), torch.ones(3), mask()))
case("loss/logprobs 1-d", ValueError, "logprobs",
     lambda t: L(torch.zeros(3), torch.zeros(3), torch.ones(1), torch.ones(3)))
case("loss/logprobs list", TypeError, "logprobs", lambda t: L([[0.0]], lp(1, 1), torch.ones(1), mask(1, 1)))
case("loss/beta<0", ValueError, "beta", lambda t: L(lp(), lp(), torch.ones(2), mask(), ref_logprobs=lp(), beta=-0.1))
case("loss/beta NaN", ValueError, "beta", lambda t: L(lp(), lp(), torch.ones(2), mask(), ref_logprobs=lp(), beta=nan))
case("loss/beta without ref", ValueError, "ref_logprobs", lambda t: L(lp(), lp(), torch.ones(2), mask(), beta=0.1))
case("loss/clip_eps<0", ValueError, "clip_eps", lambda t: L(lp(), lp(), torch.ones(2), mask(), clip_eps=-0.2))
case("loss/clip_eps NaN", ValueError, "clip_eps", lambda t: L(lp(), lp(), torch.ones(2), mask(), clip_eps=nan))
case("loss/clip_eps_high<0", ValueError, "clip_eps_high",
     lambda t: L(lp(), lp(), torch.ones(2), mask(), clip_eps_high=-1.0))
case("loss/aggregation", ValueError, "aggregation", lambda t: L(lp(), lp(), torch.ones(2), mask(), aggregation="sum"))
case("loss/NaN logprobs on kept tokens", ValueError, ["logprobs", "finite"],
     lambda t: L(lp(fill=nan), lp(), torch.ones(2), mask()))
case("loss/NaN old_logprobs on kept tokens", ValueError, ["old_logprobs", "finite"],
     lambda t: L(lp(), torch.full((2, 3), nan), torch.ones(2), mask()))
case("loss/NaN advantages", ValueError, ["advantages", "finite"],
     lambda t: L(lp(), lp(), torch.tensor([1.0, nan]), mask()))
case("loss/inf ref_logprobs", ValueError, ["ref_logprobs", "finite"],
     lambda t: L(lp(), lp(), torch.ones(2), mask(), ref_logprobs=torch.full((2, 3), -inf), beta=0.1))
case("loss/constant max_completion_length<C", ValueError, "max_completion_length",
     lambda t: L(lp(), lp(), torch.ones(2), mask(), aggregation="constant", max_completion_length=2))
case("pg/aggregation", ValueError, "aggregation",
     lambda t: algorithms.compute_policy_gradient_loss(lp(), torch.ones(2), mask(), aggregation="mean"))
case("pg/NaN logprobs on kept tokens", ValueError, ["logprobs", "finite"],
     lambda t: algorithms.compute_policy_gradient_loss(lp(fill=nan), torch.ones(2), mask()))
case("pg/advantages inf", ValueError, ["advantages", "finite"],
     lambda t: algorithms.compute_policy_gradient_loss(lp(), torch.tensor([inf, 1.0]), mask()))
case("algo/unknown algorithm", ValueError, ["'a2c'", "known"], lambda t: algorithms.create_algorithm_config("a2c"))
case("algo/unknown option", ValueError, "clip_epsilon",
     lambda t: algorithms.create_algorithm_config("grpo", clip_epsilon=0.3))
case("algo/config without name", ValueError, "name",
     lambda t: algorithms.compute_loss_by_algorithm(core.collate([ro()], 0), lp(1, 2), {"clip_eps": 0.2}))
case("algo/schedule starts late", ValueError, "schedule", lambda t: algorithms.get_algorithm_config(0, {5: "grpo"}))

# --- rlnb.kl ----------------------------------------------------------------------------------------------------------
case("kl/shape mismatch", ValueError, "ref_logprobs", lambda t: kl.kl_k3(torch.zeros(2, 3), torch.zeros(2, 4)))
case("kl/not a tensor", TypeError, "logprobs", lambda t: kl.compute_per_token_kl([[0.0]], torch.zeros(1, 1)))
case("kl/mask shape", ValueError, "mask",
     lambda t: kl.compute_per_token_kl(torch.zeros(2, 3), torch.zeros(2, 3), mask=torch.ones(2, 2)))
case("kl/estimator name", ValueError, ["'k4'", "k3"], lambda t: kl.kl_estimator("k4"))
case("kl/reduction", ValueError, "reduction",
     lambda t: kl.compute_batch_kl(torch.zeros(2, 3), torch.zeros(2, 3), reduction="median"))
case("kl/exact logits shape", ValueError, "logits",
     lambda t: kl.exact_kl_from_logits(torch.zeros(1, 2, 5), torch.zeros(1, 2, 6)))
case("kl/exact direction", ValueError, "direction",
     lambda t: kl.exact_kl_from_logits(torch.zeros(1, 2, 5), torch.zeros(1, 2, 5), direction="both"))
case("kl/schedule name", ValueError, "schedule", lambda t: kl.create_kl_schedule(0.1, 0.0, 10, schedule="exponential"))
case("kl/schedule num_iterations=0", ValueError, "num_iterations", lambda t: kl.create_kl_schedule(0.1, 0.0, 0))
case("kl/schedule initial_kl<0", ValueError, "initial_kl", lambda t: kl.create_kl_schedule(-0.1, 0.0, 10))
case("kl/schedule final_kl NaN", ValueError, "final_kl", lambda t: kl.create_kl_schedule(0.1, nan, 10))
case("kl/ema decay>1", ValueError, "decay", lambda t: kl.create_ema_updater(1.5))
case("kl/ema decay<0", ValueError, "decay", lambda t: kl.create_ema_updater(-0.1))
case("kl/ema decay NaN", ValueError, "decay", lambda t: kl.create_ema_updater(nan))
case("kl/truncated threshold", ValueError, "threshold", lambda t: kl.create_truncated_kl(0.0))
case("kl/adaptive confidence", ValueError, "confidence_threshold",
     lambda t: kl.create_adaptive_kl(confidence_threshold=1.0))
case("kl/adaptive target_kl", ValueError, "target_kl", lambda t: kl.update_adaptive_beta(0.1, 0.05, target_kl=0.0))
case("kl/periodic update_every", ValueError, "update_every", lambda t: kl.create_periodic_updater(0))
case("kl/reference None", ValueError, "ref_model",
     lambda t: kl.get_reference_logprobs(None, torch.ones(1, 3, dtype=torch.long), torch.ones(1, 3), 1))

# --- rlnb.core: collate -----------------------------------------------------------------------------------------------
case("collate/empty", ValueError, "rollouts", lambda t: core.collate([], 0))
case("collate/pad None", ValueError, "pad_token_id", lambda t: core.collate([ro()], None))
case("collate/not a Rollout", TypeError, "rollouts[0]", lambda t: core.collate([{"prompt": "x"}], 0))
case("collate/no prompt tokens", ValueError, "rollouts[1].prompt_token_ids",
     lambda t: core.collate([ro(), ro()._replace(prompt_token_ids=[])], 0))
case("collate/loss_mask length", ValueError, "rollouts[0].loss_mask", lambda t: core.collate([ro(loss_mask=[1])], 0))
case("collate/logprobs length", ValueError, "rollouts[1].logprobs",
     lambda t: core.collate([ro(logprobs=[-1.0, -1.0]), ro(logprobs=[-1.0, -1.0, -1.0])], 0))
case("collate/ref_logprobs length", ValueError, "rollouts[0].ref_logprobs",
     lambda t: core.collate([ro(ref_logprobs=[0.0])], 0))
case("collate/some logprobs missing", ValueError, "logprobs",
     lambda t: core.collate([ro(logprobs=[-1.0, -1.0]), ro()], 0))
case("collate/scalar and vector rewards", ValueError, "rewards", lambda t: core.collate([ro(1.0), ro([1.0, 2.0])], 0))
case("collate/string reward", ValueError, "rewards", lambda t: core.collate([ro("1.0")], 0))
case("collate/NaN reward", ValueError, ["rollouts[1].rewards", "finite"], lambda t: core.collate([ro(1.0), ro(nan)], 0))

# --- rlnb.core: TrainingConfig and the papermill notebook's parameters ------------------------------------------------
case("config/unknown field", ValueError, ["lerning_rate", "learning_rate"],
     lambda t: create_training_config(lerning_rate=1e-3))
case("config/wrong type", ValueError, "learning_rate", lambda t: create_training_config(learning_rate="abc"))
case("config/out of range", ValueError, "group_size", lambda t: create_training_config(group_size=0))
case("config/inf", ValueError, "learning_rate", lambda t: create_training_config(learning_rate=inf))
case("config/NaN", ValueError, "beta", lambda t: create_training_config(beta=nan))
case("config/int field given 2.5", ValueError, "prompts_per_step",
     lambda t: create_training_config(prompts_per_step=2.5))
case("config/bool for int", ValueError, "num_iterations", lambda t: create_training_config(num_iterations=True))
case("config/choice", ValueError, "lr_schedule", lambda t: create_training_config(lr_schedule="linear"))
case("config/config=int", TypeError, "config", lambda t: create_training_config(5))
case("config/None for int", ValueError, "seed", lambda t: create_training_config(seed=None))
case("config/max_seconds<0", ValueError, "max_seconds", lambda t: create_training_config(max_seconds=-1.0))
case("config/algorithm_options list", ValueError, "algorithm_options",
     lambda t: create_training_config(algorithm_options=[1]))

def papermill(**injected):
    "What nbs/experiments/grpo_training.ipynb does with its parameter cell plus papermill's injected cell."
    params = {**TrainingConfig_defaults(), **injected}
    return create_training_config(**params)
def TrainingConfig_defaults(): return core.TrainingConfig()._asdict()
case("papermill/lerning_rate", ValueError, ["lerning_rate", "learning_rate"], lambda t: papermill(lerning_rate=1e-3))
case("papermill/learning_rate='abc'", ValueError, ["learning_rate", "abc"], lambda t: papermill(learning_rate="abc"))
case("papermill/group_size='8'", ValueError, "group_size", lambda t: papermill(group_size="8"))

# --- JSONL records: rlnb.core.rollouts_from_jsonl, rlnb.tasks.load_jsonl_dataset --------------------------------------
def jsonl(t, text, name="data.jsonl", mode="w"):
    p = t / name
    (p.write_bytes if isinstance(text, bytes) else p.write_text)(text)
    return p
def good_line(): return json.dumps(core.to_jsonable(ro()))
case("rollouts_jsonl/bad JSON", ValueError, ["{tmp}/data.jsonl:2", "JSON"],
     lambda t: core.rollouts_from_jsonl(jsonl(t, good_line() + "\n{not json\n")))
case("rollouts_jsonl/not a Rollout", ValueError, ["data.jsonl:1", "Rollout"],
     lambda t: core.rollouts_from_jsonl(jsonl(t, '{"a": 1}\n')))
case("rollouts_jsonl/unknown record", ValueError, ["data.jsonl:1", "Bogus"],
     lambda t: core.rollouts_from_jsonl(jsonl(t, '{"__record__": "Bogus", "x": 1}\n')))
case("rollouts_jsonl/unknown field", ValueError, ["data.jsonl:1", "promptt"],
     lambda t: core.rollouts_from_jsonl(jsonl(t, '{"__record__": "Rollout", "promptt": "x"}\n')))
case("rollouts_jsonl/bad tensor dtype", ValueError, ["data.jsonl:1", "dtype"],
     lambda t: core.rollouts_from_jsonl(jsonl(t, '{"__record__": "Rollout", "prompt": "x", "rewards": '
                                              '{"__tensor__": [1.0], "dtype": "float99", "shape": [1]}}\n')))
case("rollouts_jsonl/not UTF-8", ValueError, ["{tmp}/data.jsonl", "UTF-8"],
     lambda t: core.rollouts_from_jsonl(jsonl(t, b'{"__record__": "Rollout", "prompt": "\xff\xfe"}\n')))
case("rollouts_jsonl/missing file", FileNotFoundError, "nope.jsonl",
     lambda t: core.rollouts_from_jsonl(t / "nope.jsonl"))
case("dataset/missing key", ValueError, ["data.jsonl", "line 1", "'answer'"],
     lambda t: tasks.load_jsonl_dataset(jsonl(t, '{"question": "1+1="}\n')))
case("dataset/bad JSON", ValueError, ["data.jsonl", "line 2", "JSON"],
     lambda t: tasks.load_jsonl_dataset(jsonl(t, '{"question": "1+1=", "answer": "2"}\n{"question": \n')))
case("dataset/empty file", ValueError, ["data.jsonl", "no examples"], lambda t: tasks.load_jsonl_dataset(jsonl(t, "")))
case("dataset/not an object", ValueError, ["data.jsonl", "JSON object"],
     lambda t: tasks.load_jsonl_dataset(jsonl(t, "[1, 2]\n")))
case("dataset/missing file", FileNotFoundError, "nope.jsonl", lambda t: tasks.load_jsonl_dataset(t / "nope.jsonl"))
case("dataset/not UTF-8", ValueError, ["{tmp}/data.jsonl", "UTF-8"],
     lambda t: tasks.load_jsonl_dataset(jsonl(t, b'{"question": "\xff", "answer": "2"}\n')))

# --- rlnb.checkpoints -------------------------------------------------------------------------------------------------
def saved(t, m=None, optimizer=None):
    "A checkpoint of the tiny model (or `m`) in t/ckpt."
    m = model() if m is None else m
    return checkpoints.save_checkpoint(TrainingState(3, 3, m, optimizer), t / "ckpt")
def truncate(path, keep=0.5):
    data = path.read_bytes(); path.write_bytes(data[:int(len(data) * keep)]); return path
def load(t, m=None, **kw): return checkpoints.load_checkpoint(t / "ckpt", model() if m is None else m, **kw)
case("ckpt/empty folder", FileNotFoundError, ["{tmp}/ckpt", "not a checkpoint"],
     lambda t: ((t / "ckpt").mkdir(), load(t)))
case("ckpt/missing folder", FileNotFoundError, "{tmp}/ckpt", lambda t: load(t))
case("ckpt/truncated safetensors", ValueError, ["{tmp}/ckpt/model.safetensors", "corrupt"],
     lambda t: (truncate(saved(t) / "model.safetensors"), load(t)))
case("ckpt/garbage safetensors", ValueError, ["{tmp}/ckpt/model.safetensors", "corrupt"],
     lambda t: ((saved(t) / "model.safetensors").write_bytes(b"\x00garbage" * 10), load(t)))
case("ckpt/missing weights file", FileNotFoundError, "{tmp}/ckpt/model.safetensors",
     lambda t: ((saved(t) / "model.safetensors").unlink(), load(t)))
case("ckpt/garbage state.json", ValueError, ["{tmp}/ckpt/state.json", "JSON"],
     lambda t: ((saved(t) / "state.json").write_text("{garbage"), load(t)))
case("ckpt/state.json not an object", ValueError, "{tmp}/ckpt/state.json",
     lambda t: ((saved(t) / "state.json").write_text("[1, 2]"), load(t)))
case("ckpt/state.json missing keys", ValueError, ["{tmp}/ckpt/state.json", "iteration"],
     lambda t: ((saved(t) / "state.json").write_text('{"weights": "full"}'), load(t)))
case("ckpt/different model shape", ValueError, ["{tmp}/ckpt/model.safetensors", "shape"],
     lambda t: (saved(t), load(t, tiny.create_tiny_model(tok(), hidden_size=64, num_heads=4, num_kv_heads=2))))
case("ckpt/lora into plain model", ValueError, ["LoRA", "model"],
     lambda t: (saved(t, models.apply_lora(model(), r=4)), load(t)))
case("ckpt/lora rank mismatch", ValueError, ["{tmp}/ckpt/adapter_model.safetensors", "shape"],
     lambda t: (saved(t, models.apply_lora(model(), r=4)), load(t, models.apply_lora(model(), r=8))))
case("ckpt/corrupt optimizer.pt", ValueError, ["{tmp}/ckpt/optimizer.pt", "corrupt"],
     lambda t: (truncate(saved(t, optimizer=torch.optim.SGD(_tiny()[0].parameters(), lr=0.1)) / "optimizer.pt"),
                load(t, optimizer=torch.optim.SGD(model().parameters(), lr=0.1))))
case("ckpt/corrupt rng.pt", ValueError, ["{tmp}/ckpt/rng.pt", "corrupt"],
     lambda t: ((saved(t) / "rng.pt").write_bytes(b"junk"), load(t)))

# --- rlnb.training.train and rlnb.quickstart.quick_start_training -----------------------------------------------------
def run(t=None, **kw):
    cfg = kw.pop("config", small())
    return training.train(cfg, **({"model": model(), "tokenizer": tok()} | kw), progress=False)
case("train/group_size=1", ValueError, "group_size", lambda t: run(config=small(group_size=1)))
case("train/group_size=0", ValueError, "group_size", lambda t: run(config=dict(group_size=0)))
case("train/unknown algorithm", ValueError, ["'a2c'", "algorithm"], lambda t: run(config=small(algorithm="a2c")))
case("train/unknown algorithm option", ValueError, "clip_epsilon",
     lambda t: run(config=small(algorithm_options={"clip_epsilon": 0.3})))
case("train/unknown task", ValueError, ["'nope'", "task"], lambda t: run(config=small(task="nope")))
case("train/model without tokenizer", ValueError, "tokenizer", lambda t: run(tokenizer=None))
case("train/prompts and prompt_loader", ValueError, ["prompts", "prompt_loader"],
     lambda t: run(prompts=["1+1="], prompt_loader=lambda i: ["1+1="]))
case("train/resume without checkpoint", ValueError, ["resume", "{tmp}/run", "checkpoint"],
     lambda t: run(config=small(output_dir=str(t / "run"), resume=True)))
case("train/resume without output_dir", ValueError, ["resume", "output_dir"], lambda t: run(config=small(resume=True)))
case("train/reward_fn returns a string", ValueError, ["reward function", "str"],
     lambda t: run(reward_fn=lambda r: "1.0"))
case("train/reward_fn returns NaN", ValueError, ["reward function", "nan"], lambda t: run(reward_fn=lambda r: nan))
case("train/reward_fn not callable", TypeError, "reward_fn", lambda t: run(reward_fn=1.0))
case("train/logger not callable", TypeError, "logger", lambda t: run(logger=5))
case("train/eval_fn not callable", TypeError, "eval_fn", lambda t: run(config=small(eval_every=1), eval_fn="accuracy"))
case("train/stop_fn not callable", TypeError, "stop_fn", lambda t: run(stop_fn=True))
case("train/rollout_fn returns a list", TypeError, "rollout_fn", lambda t: run(rollout_fn=lambda m, k, p, c: []))
case("train/config field typo", ValueError, ["lerning_rate", "learning_rate"],
     lambda t: run(config=dict(lerning_rate=1e-3)))
case("quickstart/typo", TypeError, ["lerning_rate", "learning_rate"],
     lambda t: quickstart.quick_start_training(lerning_rate=1e-3))
case("quickstart/group_size=1", ValueError, "group_size", lambda t: quickstart.quick_start_training(group_size=1))
case("quickstart/learning_rate inf", ValueError, "learning_rate",
     lambda t: quickstart.quick_start_training(learning_rate=inf))
case("quickstart/prompts and prompt_loader", ValueError, ["prompts", "prompt_loader"],
     lambda t: quickstart.quick_start_training(small(), prompts=["1+1="], prompt_loader=lambda i: ["1+1="],
                                               progress=False))
case("quickstart/reward_fn returns a string", ValueError, ["reward function", "str"],
     lambda t: quickstart.quick_start_training(small(), reward_fn=lambda r: "1.0", progress=False))

# --- rlnb.sft ---------------------------------------------------------------------------------------------------------
def run_sft(examples, **kw):
    return run_sft_fn(model(), tok(), examples, **{**dict(num_iterations=1, batch_size=2, progress=False), **kw})
no_assistant = Conversation((Message("user", "1+1="),))
case("sft/empty examples", ValueError, "examples", lambda t: run_sft([]))
case("sft/no assistant turn", ValueError, ["examples[1]", "assistant"],
     lambda t: run_sft([("1+1=", "2"), no_assistant]))
case("sft/example a bare string", TypeError, "examples[0]", lambda t: run_sft(["1+1=2", ("1+1=", "2")]))
case("sft/batch_size=0", ValueError, "batch_size", lambda t: run_sft([("1+1=", "2")], batch_size=0))
case("sft/learning_rate<0", ValueError, "learning_rate", lambda t: run_sft([("1+1=", "2")], learning_rate=-1.0))
case("sft/eval_every without eval_fn", ValueError, "eval_fn", lambda t: run_sft([("1+1=", "2")], eval_every=5))

# --- rlnb.tiny --------------------------------------------------------------------------------------------------------
case("tiny/hidden_size=0", ValueError, "hidden_size", lambda t: tiny.create_tiny_model(tok(), hidden_size=0))
case("tiny/hidden_size float", ValueError, "hidden_size", lambda t: tiny.create_tiny_model(tok(), hidden_size=128.0))
case("tiny/hidden_size % num_heads", ValueError, ["hidden_size", "num_heads"],
     lambda t: tiny.create_tiny_model(tok(), hidden_size=130))
case("tiny/num_heads % num_kv_heads", ValueError, "num_kv_heads",
     lambda t: tiny.create_tiny_model(tok(), num_kv_heads=3))
case("tiny/num_layers<0", ValueError, "num_layers", lambda t: tiny.create_tiny_model(tok(), num_layers=-1))
case("tiny/steps=0", ValueError, "steps", lambda t: tiny.load_tiny_model(steps=0, progress=False))
case("tiny/steps str", ValueError, "steps", lambda t: tiny.load_tiny_model(steps="10", progress=False))
case("tiny/unknown task", ValueError, "'nope'", lambda t: tiny.load_tiny_model("nope", progress=False))
case("tiny/path not a tiny model", ValueError, "path",
     lambda t: ((t / "m").mkdir(), (t / "m" / "x.txt").write_text("x"),
                tiny.load_tiny_model(path=t / "m", progress=False)))
case("tiny/unknown model_config key", ValueError, "num_layerz",
     lambda t: tiny.load_tiny_model(model_config={"num_layerz": 3}, cache_dir=t, progress=False))
case("tiny/unknown sft_config key", ValueError, "learning_ratee",
     lambda t: tiny.load_tiny_model(sft_config={"learning_ratee": 1e-3}, cache_dir=t, progress=False))

# --- rlnb.logprobs, rlnb.rollouts, rlnb.loggers -----------------------------------------------------------------------
ids = lambda: torch.ones(1, 4, dtype=torch.long)
case("logprobs/1-d input_ids", ValueError, "input_ids",
     lambda t: logprobs.compute_logprobs_for_tokens(model(), torch.ones(4, dtype=torch.long), torch.ones(4), 1))
case("logprobs/attention_mask shape", ValueError, "attention_mask",
     lambda t: logprobs.compute_logprobs_for_tokens(model(), ids(), torch.ones(1, 3), 1))
case("logprobs/completion_length=0", ValueError, "completion_length",
     lambda t: logprobs.compute_logprobs_for_tokens(model(), ids(), torch.ones(1, 4), 0))
case("logprobs/completion_length>=T", ValueError, "completion_length",
     lambda t: logprobs.compute_logprobs_for_tokens(model(), ids(), torch.ones(1, 4), 4))
case("logprobs/temperature=0", ValueError, "temperature",
     lambda t: logprobs.compute_logprobs_for_tokens(model(), ids(), torch.ones(1, 4), 1, temperature=0.0))
case("logprobs/micro_batch_size=0", ValueError, "micro_batch_size",
     lambda t: logprobs.compute_logprobs_for_tokens(model(), ids(), torch.ones(1, 4), 1, micro_batch_size=0))
case("rollouts/gen_config dict", TypeError, "gen_config",
     lambda t: rollouts.create_batch_rollouts(model(), tok(), ["1+1="], {}))
case("rollouts/answers length", ValueError, "answers",
     lambda t: rollouts.create_batch_rollouts(model(), tok(), ["1+1=", "2+2="], GenerationConfig(max_new_tokens=1),
                                              answers=["2"]))
case("rollouts/empty prompt", ValueError, "prompts[0]",
     lambda t: rollouts.create_batch_rollouts(model(), tok(), [""], GenerationConfig(max_new_tokens=1)))
case("rollouts/prompt loader empty", ValueError, "source", lambda t: rollouts.create_prompt_loader([], 2))
case("rollouts/prompt loader prompts_per_step=0", ValueError, "prompts_per_step",
     lambda t: rollouts.create_prompt_loader(["a"], 0))
case("loggers/ema momentum=1", ValueError, "momentum",
     lambda t: loggers.update_ema_metrics({}, {"a": 1.0}, momentum=1.0))
case("loggers/progress total=0", ValueError, "total", lambda t: loggers.create_progress_logger(0))
case("loggers/metrics missing file", FileNotFoundError, "nope.jsonl", lambda t: loggers.load_metrics(t / "nope.jsonl"))

# --- rlnb.tools and the calculator (rlnb.tasks) -----------------------------------------------------------------------
case("tools/parse None", TypeError, "text", lambda t: tools.parse_json_tool_calls(None))
case("tools/extract int", TypeError, "generation", lambda t: tools.extract_tool_calls(5))
case("tools/execute tools=list", TypeError, "tools", lambda t: tools.execute_tools([], tools=[len]))
case("tools/execute nothing to run", TypeError, "tool_executor", lambda t: tools.execute_tools([]))
case("calculator/import attempt", ValueError, "expr", lambda t: tasks.safe_eval("__import__('os')"))
case("calculator/not a str", TypeError, "expr", lambda t: tasks.safe_eval(12))
case("calculator/too long", ValueError, "expr", lambda t: tasks.safe_eval("1+" * 200 + "1"))
case("tasks/unknown task", ValueError, ["'nope'", "known tasks"], lambda t: tasks.get_task("nope"))
case("tasks/unknown difficulty", ValueError, "digitz", lambda t: tasks.get_task("addition", digitz=3))
case("tasks/digits=0", ValueError, "digits", lambda t: tasks.addition_task(digits=0))


@pytest.mark.parametrize("fn, exc, contains", CASES)
def test_bad_input(fn, exc, contains, tmp_path):
    check_bad_input(fn, exc, contains, tmp_path)


def test_many_distinct_cases():
    assert len(CASES) >= 60
    assert len({c.id for c in CASES}) == len(CASES)


def test_nan_logprobs_on_masked_positions_are_ignored():
    "Padding may hold NaN or -inf log-probs: masked positions never reach the loss or its gradient."
    logp = torch.tensor([[-1.0, nan], [-2.0, -inf]], requires_grad=True)
    m = torch.tensor([[1.0, 0.0], [1.0, 0.0]])
    for agg in algorithms.AGGREGATIONS:
        loss, _ = algorithms.grpo_loss(logp, logp.detach(), torch.tensor([1.0, -1.0]), m, ref_logprobs=logp.detach(),
                                       beta=0.1, aggregation=agg)
        assert math.isfinite(loss.item())
        (g,) = torch.autograd.grad(loss, logp)
        assert torch.isfinite(g).all() and (g[:, 1] == 0).all()
    loss, _ = algorithms.compute_policy_gradient_loss(logp, torch.tensor([1.0, -1.0]), m)
    assert math.isfinite(loss.item())
