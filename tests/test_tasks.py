"Tests of rlnb.tasks through the installed package: dataset files on disk, determinism, rewards on rollouts."
import json, random

import pytest

from rlnb.core import Generation, Rollout
from rlnb.tasks import (TASKS, Task, TaskExample, check_countdown, extract_gsm8k_answer, extract_number, get_task,
                        list_tasks, load_jsonl_dataset, create_dataset_task, safe_eval)

GSM8K_RECORDS = [
    {"question": "Tom has 3 boxes of 4 pens. How many pens?", "answer": "3 * 4 = <<3*4=12>>12\n#### 12"},
    {"question": "A TV costs $1,200 and a radio $34.50. Total?", "answer": "1,200 + 34.50 = 1,234.50\n#### 1,234.50"},
    {"question": "It was 2 degrees, then fell 7. Now?", "answer": "2 - 7 = -5\n#### -5"},
]


@pytest.fixture
def gsm8k_file(tmp_path):
    path = tmp_path / "gsm8k_test.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in GSM8K_RECORDS) + "\n\n")  # trailing blank line is skipped
    return path


def write(tmp_path, name, text):
    path = tmp_path / name
    path.write_text(text)
    return path


def test_load_gsm8k(gsm8k_file):
    data = load_jsonl_dataset(gsm8k_file, answer_extractor=extract_gsm8k_answer)
    assert [e.answer for e in data] == ["12", "1234.50", "-5"]
    assert all(isinstance(e, TaskExample) for e in data)
    assert data[0].prompt == GSM8K_RECORDS[0]["question"]
    assert [e.metadata["line"] for e in data] == [1, 2, 3]
    assert data[2].metadata["source"] == str(gsm8k_file)
    assert data[1].metadata["record"]["answer"] == GSM8K_RECORDS[1]["answer"]


def test_extraction():
    assert extract_gsm8k_answer("so 70+2=72\n#### 72") == "72"
    assert extract_gsm8k_answer("#### 1,234") == "1234"
    assert extract_gsm8k_answer("no marker here 5") is None
    assert extract_number("paid $1,234.50 in total") == "1234.50"
    assert extract_number("it fell to -5") == "-5"
    assert extract_number("+3") == "3"
    assert extract_number("5-3") == "3"
    assert extract_number("nothing") is None


@pytest.mark.parametrize("name,text,message", [
    ("bad.jsonl", '{"question": "q", "answer": "#### 1"}\n{not json\n', "bad.jsonl, line 2: not valid JSON"),
    ("key.jsonl", '{"question": "q", "answer": "#### 1"}\n\n{"question": "q2"}\n',
     "key.jsonl, line 3: missing key 'answer'"),
    ("obj.jsonl", '"just a string"\n', "obj.jsonl, line 1: expected a JSON object"),
    ("nomark.jsonl", '{"question": "q", "answer": "7"}\n', "nomark.jsonl, line 1: answer_extractor found no answer"),
    ("empty.jsonl", "\n  \n", "has no examples"),
])
def test_load_errors(tmp_path, name, text, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(")):
        load_jsonl_dataset(write(tmp_path, name, text), answer_extractor=extract_gsm8k_answer)


def test_missing_file(tmp_path):
    with pytest.raises(FileNotFoundError, match="no file at"):
        load_jsonl_dataset(tmp_path / "absent.jsonl")


def test_custom_keys(tmp_path):
    data = load_jsonl_dataset(write(tmp_path, "k.jsonl", '{"q": "2+2=", "a": 4}\n'), prompt_key="q", answer_key="a")
    assert data[0][:2] == ("2+2=", "4")


def test_dataset_task(gsm8k_file):
    task = create_dataset_task(load_jsonl_dataset(gsm8k_file, answer_extractor=extract_gsm8k_answer), name="gsm8k")
    assert isinstance(task, Task) and task.name == "gsm8k"
    first = task.sample(7, seed=3)
    assert first == task.sample(7, seed=3) and first[:3] == task.sample(3, seed=3)
    assert {e.prompt for e in first[:3]} == {r["question"] for r in GSM8K_RECORDS}  # one full pass first
    assert task.reward_fn(Rollout("q", Generation("The total is $1,234.5."), answer="1234.50")) == 1.0
    assert task.reward_fn(Rollout("q", Generation("It is now -5 degrees"), answer="-5")) == 1.0
    assert task.reward_fn(Rollout("q", Generation("It is now 5 degrees"), answer="-5")) == 0.0


@pytest.mark.parametrize("name", list_tasks())
def test_sample_deterministic(name):
    task = get_task(name)
    random.seed(0)
    a = task.sample(30, seed=11)
    random.seed(123)
    state = random.getstate()
    b = task.sample(30, seed=11)
    assert a == b and random.getstate() == state  # independent of, and leaves alone, the global RNG
    assert task.sample(30, seed=12) != a
    assert all(isinstance(e.prompt, str) and isinstance(e.answer, str) and e.prompt.endswith("=") for e in a)


@pytest.mark.parametrize("name", list_tasks())
def test_reward_on_rollouts(name):
    task = get_task(name)
    for ex in task.sample(20, seed=1):
        good = Rollout(ex.prompt, Generation(f"  {ex.answer}\n"), answer=ex.answer)
        bad = Rollout(ex.prompt, Generation(ex.answer + "1"), answer=ex.answer)
        assert task.reward_fn(good) == 1.0 and task.reward_fn(bad) == 0.0
        assert task.reward_fn(Rollout(ex.prompt, None, answer=ex.answer)) == 0.0
    with pytest.raises(ValueError, match="rollout.answer"):
        task.reward_fn(Rollout("1+1=", Generation("2")))


def test_addition_reward_numeric():
    task = get_task("addition")
    assert task.sample(1, seed=0)[0].prompt.count("+") == 1
    assert task.reward_fn(Rollout("12+34=", Generation("46"), answer="46")) == 1.0
    assert task.reward_fn(Rollout("12+34=", Generation("46.0"), answer="46")) == 1.0
    assert task.reward_fn(Rollout("12+34=", Generation("46 apples"), answer="46")) == 0.0


def test_countdown_is_safe_and_accepts_equivalents():
    assert check_countdown("7*(5+3)", "(3+5)*7")
    assert not check_countdown("8*7", "(3+5)*7")
    assert not check_countdown("__import__('os').system('echo hi')", "(3+5)*7")
    with pytest.raises(ValueError):
        safe_eval("2**1000000")


def test_registry_errors():
    with pytest.raises(ValueError, match="known tasks: addition, arithmetic, countdown, reverse"):
        get_task("nope")
    with pytest.raises(ValueError, match=r"\['digit'\]"):
        get_task("addition", digit=3)
    with pytest.raises(ValueError, match="addition_task: `digits`"):
        get_task("addition", digits=0)
    assert set(TASKS) == set(list_tasks())
    assert get_task("addition", digits=3).params["digits"] == 3
