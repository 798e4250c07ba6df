"""Hostile model text through every parser, checker and tool (issue 10): an error result, never an exception and
never a hang. A tool that times out is killed, side effects included."""
import math, os, threading, time
from decimal import Decimal
from fractions import Fraction

import pytest

from rlnb import tasks
from rlnb.tools import calculator, execute_tools, extract_tool_calls, parse_json_tool_calls

BOUND_S = 2.0  # generous: every input below takes well under 0.1 s


def _call(arguments_json: str, name: str = "calculator") -> str:
    return f'<tool_call>{{"name": "{name}", "arguments": {arguments_json}}}</tool_call>'


HOSTILE = {
    "deep_json_list": _call('{"expression": ' + "[" * 1000 + "]" * 1000 + "}"),  # 2 KB, the RecursionError
    "deep_json_object": _call('{"x": ' + '{"a": ' * 1200 + "1" + "}" * 1200 + "}"),
    "deep_json_unclosed": "<tool_call>" + "[" * 5000 + "</tool_call>",
    "deep_json_in_arguments_string": _call('"{\\"x\\": ' + "[" * 1000 + "]" * 1000 + '}"'),
    "deep_parens": "(" * 100_000 + "1" + ")" * 100_000,
    "deep_parens_in_budget": "(" * 49 + "1" + ")" * 49,
    "deep_unary": "-" * 99 + "1",
    "long_sum": "1+" * 100_000 + "1",
    "nines": "9" * 100_000,
    "nines_in_json": _call('{"expression": ' + "9" * 5000 + "}"),  # past Python's 4300-digit int limit
    "power_tower": "10**10**10",
    "power_tower_call": _call('{"expression": "10**10**10"}'),
    "big_product": "*".join(["999999999"] * 11),
    "exponent": "1e999999",
    "exponent_in_json": _call('{"expression": 1e999999}'),
    "nan_in_json": _call('{"expression": NaN}'),
    "huge_decimal": "1" + "0" * 100_000 + ".5",
    "long_text": "x" * 200_000,
    "long_commas": "1," * 100_000,
    "long_dots": "1." * 100_000,
    "long_signs": "+-" * 100_000,
    "long_hashes": "####" * 50_000,
    "long_open_tags": "<tool_call>" * 20_000,
    "many_calls": "<tool_call>{}</tool_call>" * 8_000,
    "long_call": _call('{"expression": "' + "1" * 200_000 + '"}'),
    "control_chars": "\x00\x01\x1b[31m 12 \x7f\x00",
    "control_chars_in_call": _call('{"expression": "1\x00+2"}'),
    "nul_in_name": _call('{"expression": "1+2"}', name="calc\\u0000ulator"),
    "surrogates": "\ud800\udfff 12 \udc80",
    "surrogate_escape_in_call": _call('{"expression": "\\ud800"}'),
    "import": "__import__('os').system('echo pwned')",
    "dunder": "().__class__.__bases__[0].__subclasses__()",
    "lambda": "(lambda: 1)()",
    "import_call": "<tool_call>__import__('os').system('echo pwned')</tool_call>",
    "import_in_arguments": _call('{"expression": "__import__(\'os\')"}'),
    "unclosed_block": '<tool_call>{"name": "calculator", "arguments": {',
    "unclosed_string": '<tool_call>{"name": "calculator", "arguments": {"expression": "1+',
    "empty": "",
}


def _timed(fn, *args):
    t0 = time.perf_counter()
    out = fn(*args)
    assert time.perf_counter() - t0 < BOUND_S, f"{getattr(fn, '__name__', fn)} took {time.perf_counter() - t0:.2f} s"
    return out


def _check_calls(calls):
    assert isinstance(calls, list)
    for c in calls:
        assert set(c) >= {"name", "arguments", "raw"} and isinstance(c["arguments"], dict)
        assert c.get("error") is None or isinstance(c["error"], str)
        assert len(c["raw"]) <= 10_100  # a hostile block is not copied whole into every record


@pytest.mark.parametrize("name", HOSTILE)
def test_tool_call_parsers(name):
    text = HOSTILE[name]
    _check_calls(_timed(parse_json_tool_calls, text))
    _check_calls(_timed(extract_tool_calls, text))


@pytest.mark.parametrize("name", [n for n in HOSTILE if n.startswith("deep_json")] + [
    "nines_in_json", "exponent_in_json", "nan_in_json", "surrogate_escape_in_call", "import_call", "unclosed_block",
    "long_call"])
def test_hostile_tool_calls_become_error_results(name):
    calls = _timed(parse_json_tool_calls, HOSTILE[name])
    assert len(calls) == 1 and calls[0]["name"] is None and calls[0]["error"], calls[0]


@pytest.mark.parametrize("name", HOSTILE)
def test_checkers_and_extractors(name):
    text = HOSTILE[name]
    for check, answer in [(tasks.check_number, "12"), (tasks.check_exact, "12"), (tasks.check_countdown, "(3+5)*7"),
                          (tasks.check_extracted_number, "12"), (tasks.check_extracted_number, "Paris")]:
        assert _timed(check, text, answer) in (True, False)
    assert _timed(tasks.parse_number, text) is None or isinstance(tasks.parse_number(text), Decimal)
    for extract in (tasks.extract_number, tasks.extract_gsm8k_answer,
                    lambda t: tasks.extract_gsm8k_answer("#### " + t)):
        got = _timed(extract, text)
        assert got is None or (isinstance(got, str) and Decimal(got).is_finite())


@pytest.mark.parametrize("name", HOSTILE)
def test_safe_eval_and_calculator(name):
    "safe_eval and the calculator either compute an exact value or raise ValueError (their documented error)."
    text = HOSTILE[name]
    for fn in (tasks.safe_eval, lambda t: tasks.safe_eval(t, max_length=10**6, max_abs=math.inf), calculator):
        t0 = time.perf_counter()
        try: value = fn(text)
        except ValueError as e: assert str(e)
        else: assert isinstance(value, (Fraction, str))
        assert time.perf_counter() - t0 < BOUND_S


@pytest.mark.slow
@pytest.mark.parametrize("timeout_s", [None, 5.0])
def test_hostile_text_through_execute_tools(timeout_s):
    "Every hostile text as a parsed call and as a calculator argument: one result per call, never an exception."
    calls = [c for text in HOSTILE.values() for c in parse_json_tool_calls(text)[:3]]
    calls += [{"name": "calculator", "arguments": {"expression": text}} for text in HOSTILE.values()]
    calls += [{"name": text[:50_000], "arguments": {}} for text in HOSTILE.values()]
    t0 = time.perf_counter()
    results = execute_tools(calls, tools={"calculator": calculator}, timeout_s=timeout_s)
    assert time.perf_counter() - t0 < BOUND_S * 10
    assert len(results) == len(calls)
    for r in results:
        assert isinstance(r["content"], str) and len(r["content"]) < 5_000
        r["content"].encode("utf-8")  # valid unicode: no lone surrogates reach the conversation
        assert r["error"] is None or r["content"].startswith("error: ")
    assert sum(r["error"] is None for r in results) == 2  # the two valid expressions (deep but in budget) did compute


def test_calculator():
    assert calculator("(3+5)*7") == "56" and calculator("7/2") == "3.5" and calculator(" -4 / 8 ") == "-0.5"
    assert calculator("1/3").startswith("0.33333333")
    for bad, words in [("2**10", "not allowed"), ("1/0", "division by zero"), ("__import__('os')", "contains"),
                       ("9" * 300, "characters"), ("", "not an arithmetic expression")]:
        with pytest.raises(ValueError, match=words): calculator(bad)


def test_one_hostile_call_in_a_batch_leaves_the_others_intact():
    text = (_call('{"expression": "2+3"}') + HOSTILE["deep_json_list"] + _call('{"expression": "10**10**10"}')
            + _call('{"expression": "6*7"}'))
    calls = extract_tool_calls(text)
    results = execute_tools(calls, tools={"calculator": calculator}, timeout_s=5.0)
    assert [r["content"] for r in results][::3] == ["5", "42"]
    assert results[1]["error"].startswith("ValueError: malformed tool call") and "nest" in results[1]["error"]
    assert results[2]["error"].startswith("ValueError") and results[2]["name"] == "calculator"


@pytest.mark.slow
def test_timed_out_tool_is_killed_with_its_side_effects(tmp_path):
    marker = tmp_path / "side_effect"
    def slow_then_write():
        time.sleep(3.0)
        marker.write_text("the tool was not stopped")
        while True: time.sleep(1)
    t0 = time.perf_counter()  # timings generous enough for a busy machine, where a fork can take a while
    [res] = execute_tools([{"name": "slow", "arguments": {}}], tools={"slow": slow_then_write}, timeout_s=1.0)
    assert time.perf_counter() - t0 < 2.5
    assert res["error"] == "TimeoutError: no result within 1.0 s" and res["name"] == "slow"
    time.sleep(3.0)
    assert not marker.exists(), "the timed-out tool kept running"


def test_tool_exceptions_and_unpicklable_results_become_error_results():
    def boom(): raise ZeroDivisionError("tool divided by zero")
    def die(): os._exit(3)
    res = execute_tools([{"name": "boom", "arguments": {}}, {"name": "die", "arguments": {}},
                         {"name": "lock", "arguments": {}}, {"name": "echo", "arguments": {"s": "a\ud800b"}}],
                        tools={"boom": boom, "die": die, "lock": lambda: {"content": "x", "lock": threading.Lock()},
                               "echo": lambda s: s}, timeout_s=5.0)
    assert (res[0]["error"] == "ZeroDivisionError: tool divided by zero"
            and res[0]["content"].startswith("error: ZeroDivisionError"))
    assert "'die'" in res[1]["error"] and "exit" in res[1]["error"]
    assert "'lock'" in res[2]["error"] and "pickle" in res[2]["error"]
    assert res[3]["error"] is None and res[3]["content"].encode("utf-8")


def test_in_process_without_timeout_keeps_state():
    "timeout_s=None runs in this process: a tool may change the caller's objects."
    seen = []
    def log(x): seen.append(x)
    execute_tools([{"name": "log", "arguments": {"x": 1}}], tools={"log": log}, timeout_s=None)
    assert seen == [1]
