"""Bad inputs, round three (text, command line, bounds): tool-call text parsed in one pass, tool calls capped per
completion, tool parsers' results and token ids checked where they enter, sweeps bounded, the CLI's exit status.

Like tests/test_bad_inputs_2.py: each case is one bad input that must raise an exception of the right type whose message
names the argument, the hook or the file; the behaviour fixes are plain tests below."""
import functools, json
from pathlib import Path

import pytest
import torch

from bad_inputs import check_bad_input

from rlnb import chat, cli, experiments, multiturn, sweep_results, tiny, tools
from rlnb.core import Conversation, Generation, GenerationConfig, Message

torch.set_num_threads(1)
TRAINING_NB = Path(__file__).resolve().parent.parent / "nbs" / "experiments" / "grpo_training.ipynb"


@functools.cache
def tok():
    return tiny.create_tiny_tokenizer()


def status_folder(tmp_path, notebook) -> Path:
    "A run folder whose status.json names `notebook` as the run's executed notebook."
    out = tmp_path / "run1"
    out.mkdir()
    (out / "status.json").write_text(json.dumps({"status": "completed", "params": {}, "notebook": notebook,
                                                 "attempt": 1}))
    return out


def a_file(tmp_path) -> Path:
    path = tmp_path / "a_file"
    path.write_text("not a folder")
    return path


def env_step(parser):
    "One step of a tool environment whose `tool_parser` is `parser`, after an assistant turn."
    env = multiturn.create_tool_environment({"calculator": tools.calculator}, tool_parser=parser, timeout_s=None)
    return env.step(None, Conversation((Message("user", "6*7?"), Message("assistant", "6*7"))))


CASES = []


def case(name, exc, contains, fn):
    CASES.append(pytest.param(fn, exc, (contains,) if isinstance(contains, str) else tuple(contains), id=name))


# --- tool calls: the calls handed to the executor, a parser's result --------------------------------------------------
case("tools/execute_tools calls None", TypeError, ["execute_tools", "`tool_calls` must be a list", "NoneType"],
     lambda t: tools.execute_tools(None, tools={"calculator": tools.calculator}))
case("tools/execute_tools calls a dict", TypeError, "`tool_calls` must be a list",
     lambda t: tools.execute_tools({"name": "calculator", "arguments": {}}, tools={"calculator": tools.calculator}))
case("tools/execute_and_track_tools calls None", TypeError, ["execute_and_track_tools", "`tool_calls` must be a list"],
     lambda t: multiturn.execute_and_track_tools(None, tools={"calculator": tools.calculator}))
case("tools/tool_parser arguments an int", TypeError,
     ["create_tool_environment: `tool_parser` returned call 0 with arguments 5", "expected a dict"],
     lambda t: env_step(lambda text: [{"name": "x", "arguments": 5}]))
case("tools/tool_parser returns a str", TypeError, "`tool_parser` returned a str; expected a list of calls",
     lambda t: env_step(lambda text: "calculator"))
case("tools/tool_parser returns None", TypeError, "`tool_parser` returned a NoneType",
     lambda t: env_step(lambda text: None))
case("tools/tool_parser call not a dict", TypeError, ["`tool_parser` returned 'calculator' as call 0"],
     lambda t: env_step(lambda text: ["calculator"]))
case("tools/tool_parser name an int", TypeError, "`tool_parser` returned call 0 with name 3",
     lambda t: env_step(lambda text: [{"name": 3, "arguments": {}}]))
case("tools/extract_tool_calls parser arguments a list", TypeError,
     ["extract_tool_calls: `tool_parser` returned call 0 with arguments [1]"],
     lambda t: tools.extract_tool_calls("x", tool_parser=lambda text: [{"name": "add", "arguments": [1]}]))


def scripted(text):
    "A `generator` hook that writes `text` at every turn of every episode."
    def generator(model, tokenizer, prompts, config):
        ids = tokenizer(text, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
        return [Generation(text, token_ids=ids, finish_reason="stop")
                for _ in range(len(prompts) * config.num_return_sequences)]
    return generator


case("tools/multiturn rollout tool_parser arguments an int", TypeError,
     "`tool_parser` returned call 0 with arguments 5",
     lambda t: multiturn.create_multiturn_rollout(
         None, tok(), ["6*7?"], GenerationConfig(max_new_tokens=8), tools={"x": len},
         tool_parser=lambda s: [{"name": "x", "arguments": 5}], generator=scripted("call x"), timeout_s=None))

# --- token ids --------------------------------------------------------------------------------------------------------
case("chat/parse_thinking negative id", ValueError, ["parse_thinking", "`text_or_ids`[0] is -1, not a token id"],
     lambda t: chat.parse_thinking([-1], tokenizer=tok()))
case("chat/parse_thinking id past the vocabulary", ValueError,
     ["`text_or_ids`[0] is 1000000000", "the tokenizer's ids are 0 to"],
     lambda t: chat.parse_thinking([10**9, 5], tokenizer=tok()))
case("chat/parse_thinking float id", TypeError, "`text_or_ids`[1] is a float; token ids are ints",
     lambda t: chat.parse_thinking([4, 1.5], tokenizer=tok()))
case("chat/parse_thinking bool id", TypeError, "`text_or_ids`[0] is a bool",
     lambda t: chat.parse_thinking([True], tokenizer=tok()))

# --- sweeps: status files, grid size, threads, output folders ---------------------------------------------------------
for bad in (5, "/etc/hostname", "../x"):
    case(f"experiments/run_experiment status notebook {bad!r}", ValueError,
         ["{tmp}/run1/status.json has notebook", "expected a file name"],
         lambda t, bad=bad: experiments.run_experiment(TRAINING_NB, {}, status_folder(t, bad)))
case("experiments/expand_grid 2.56M runs", ValueError, ["expand_grid: the grid makes 2,560,000 runs", "MAX_SWEEP_RUNS"],
     lambda t: experiments.expand_grid({k: list(range(1, 41)) for k in ("a", "b", "c", "d")}))
case("experiments/expand_grid huge seed count", ValueError, "the grid makes 2,000,000,000,000 runs",
     lambda t: experiments.expand_grid({"learning_rate": [1e-3, 3e-3]}, seeds=10**12))
case("experiments/expand_grid list of settings x seeds", ValueError, "(2 settings x 6,000 seeds)",
     lambda t: experiments.expand_grid([{"learning_rate": 1e-3}, {"learning_rate": 3e-3}], seeds=6000))
case("experiments/run_sweep 2.56M runs", ValueError, "the grid makes 2,560,000 runs",
     lambda t: experiments.run_sweep(
         TRAINING_NB, {k: list(range(1, 41)) for k in ("num_iterations", "prompts_per_step", "max_new_tokens",
                                                       "eval_size")}, output_root=t / "o", log_fn=None))
case("experiments/run_sweep threads_per_run 100000", ValueError, "`threads_per_run` must be an int from 1 to 1024",
     lambda t: experiments.run_sweep(TRAINING_NB, {"num_iterations": 2}, output_root=t / "o", threads_per_run=100_000,
                                     log_fn=None))
case("experiments/run_sweep threads_per_run 1025", ValueError, "got 1025",
     lambda t: experiments._run_env(1025))
case("experiments/run_sweep threads_per_run True", ValueError, "got True",
     lambda t: experiments._run_env(True))
case("experiments/run_sweep output_root a file", ValueError, ["run_sweep: `output_root` '{tmp}/a_file' is a file"],
     lambda t: experiments.run_sweep(TRAINING_NB, {"num_iterations": 2}, output_root=a_file(t), log_fn=None))
case("experiments/run_sweep output_root below a file", ValueError, ["lies below '{tmp}/a_file', which is a file"],
     lambda t: experiments.run_sweep(TRAINING_NB, {"num_iterations": 2}, output_root=a_file(t) / "o", log_fn=None))
case("experiments/run_experiment output_dir below a file", ValueError,
     ["run_experiment: `output_dir` '{tmp}/a_file/run'", "is a file, not a folder"],
     lambda t: experiments.run_experiment(TRAINING_NB, {}, a_file(t) / "run"))


@pytest.mark.parametrize("fn,exc,contains", CASES)
def test_bad_input(fn, exc, contains, tmp_path):
    check_bad_input(fn, exc, contains, tmp_path)


# --- behaviour --------------------------------------------------------------------------------------------------------
class Counted(str):
    "A str that counts the characters read from it, by iteration or by index."
    read = 0
    def __iter__(self):
        Counted.read += len(self)
        return super().__iter__()
    def __getitem__(self, k):
        Counted.read += 1
        return super().__getitem__(k)


@pytest.mark.parametrize("text", ["{" * 20_000, '{"' * 10_000, "[{" * 10_000 + '{"name": "add", "arguments": {}}'])
def test_the_function_call_parser_reads_the_text_once(text):
    "Bare JSON calls are found in one pass: each character read once (the first version read '{' * N 64 times)."
    Counted.read = 0
    multiturn.parse_function_calls(Counted(text))
    assert Counted.read == len(text)


def test_the_function_call_parser_finds_what_it_found_before():
    "Calls after prose brackets, inside a bracket that never closes, and the marker forms: as before."
    names = lambda text: [(c["name"], c.get("error")) for c in multiturn.parse_function_calls(text)]
    assert names('Use { then {"name": "add", "arguments": {"a": 1}}') == [("add", None)]
    assert names('[1, 2] and {"name": "add", "arguments": {}} {"name": "mul", "arguments": {}}') == [
        ("add", None), ("mul", None)]
    assert names("The set [1, 2] and {x: y} are not calls.") == []
    assert names('[TOOL_CALLS] [{"name": "add", "arguments": {"a": 1}}, {"name": "mul", "arguments": {}}]') == [
        ("add", None), ("mul", None)]
    assert multiturn.parse_function_calls("{" * 5_000_000) == []  # 22 s before; one pass now


def test_tool_calls_past_the_limit_are_not_run():
    ran = []
    def count(call):
        ran.append(call["name"])
        return "ok"
    calls = [{"name": f"t{k}", "arguments": {}, "id": str(k)} for k in range(tools.MAX_TOOL_CALLS + 3)]
    results = tools.execute_tools(calls, tool_executor=count, timeout_s=None)
    assert len(ran) == tools.MAX_TOOL_CALLS and len(results) == len(calls)
    assert [r["error"] for r in results[:tools.MAX_TOOL_CALLS]] == [None] * tools.MAX_TOOL_CALLS
    last = results[-1]
    assert (last["name"], last["tool_call_id"]) == (f"t{len(calls) - 1}", str(len(calls) - 1))
    assert last["content"].startswith(f"error: ToolCallLimitError: call {len(calls)} of {len(calls)} not run")
    assert "MAX_TOOL_CALLS" in last["content"]


def test_the_limit_holds_in_a_tool_environment():
    "The multi-turn path (create_tool_environment -> execute_and_track_tools) runs at most MAX_TOOL_CALLS too."
    ran = []
    def one(expression): ran.append(expression); return "1"
    text = '<tool name="one">1</tool>' * (tools.MAX_TOOL_CALLS + 5)
    env = multiturn.create_tool_environment({"one": one}, timeout_s=None)
    step = env.step(None, Conversation((Message("user", "?"), Message("assistant", text))))
    results = step.info["tool_results"]
    assert len(ran) == tools.MAX_TOOL_CALLS and len(results) == tools.MAX_TOOL_CALLS + 5
    assert all("ToolCallLimitError" in r["error"] for r in results[tools.MAX_TOOL_CALLS:])
    assert all(m.content.startswith("error: ToolCallLimitError") for m in step.messages[tools.MAX_TOOL_CALLS:])
    tracked = multiturn.execute_and_track_tools([{"name": "one", "arguments": "1"}] * (tools.MAX_TOOL_CALLS + 1),
                                                tools={"one": one}, timeout_s=None)
    assert [r["error"] is None for r in tracked].count(True) == tools.MAX_TOOL_CALLS
    assert all(r["time_s"] >= 0 for r in tracked)


def test_the_built_in_parsers_pass_the_check():
    "A malformed call from a built-in parser (name None, with its error) passes the check and reaches the model."
    step = env_step(multiturn.parse_function_calls)  # "6*7" is no JSON call: the answer
    assert step.done
    env = multiturn.create_tool_environment({"calculator": tools.calculator}, timeout_s=None)
    bad = env.step(None, Conversation((Message("user", "?"), Message("assistant", "<tool>1</tool>"))))
    assert bad.info["tool_results"][0]["error"].startswith("ValueError: malformed tool call")


def test_parse_thinking_takes_the_usual_id_types():
    ids = tok().encode("<think>1+1 is 2</think>2")
    expected = chat.parse_thinking(ids, tok())
    assert chat.parse_thinking(torch.tensor(ids), tok()) == expected  # 0-d integer tensors are ids
    assert chat.parse_thinking([len(tok()) - 1], tok()).thinking == ""  # the last id of the vocabulary is one


def test_load_sweep_skips_a_status_that_points_elsewhere(tmp_path):
    for k, bad in enumerate((5, "/etc/hostname", "../x")):
        out = tmp_path / f"run{k}"
        out.mkdir()
        (out / "status.json").write_text(json.dumps({"status": "completed", "params": {}, "notebook": bad}))
    with pytest.warns(UserWarning, match="status.json has notebook"):
        sweep = sweep_results.load_sweep(tmp_path)
    assert len(sweep.runs) == 0


def test_a_status_with_its_own_notebook_name_is_read(tmp_path):
    out = status_folder(tmp_path, "run.ipynb")
    assert experiments.read_run_status(out)["notebook"] == "run.ipynb"
    assert experiments._run_env(1024)["RLNB_NUM_THREADS"] == "1024"  # the limit itself is allowed


def test_a_grid_at_the_limit_is_expanded():
    plan = experiments.expand_grid({"learning_rate": list(range(1, 101)), "beta": list(range(100))})
    assert len(plan) == experiments.MAX_SWEEP_RUNS


@pytest.mark.parametrize("argv,says", [
    (["sweep", "--threads", "100000", "-p", "num_iterations", "2"], "`threads_per_run` must be an int from 1 to 1024"),
    (["sweep", "-o", "FILE", "-p", "num_iterations", "2"], "`output_root` '{tmp}/a_file' is a file, not a folder"),
    (["run", "-o", "FILE"], "`output_dir` '{tmp}/a_file' is a file, not a folder"),
    (["sweep", *[x for k in ("num_iterations", "prompts_per_step", "max_new_tokens", "eval_size")
                 for x in ("-p", k, *map(str, range(1, 41)))]], "the grid makes 2,560,000 runs"),
])
def test_the_cli_refuses_with_exit_status_2(argv, says, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)  # default output folders, if any were made, would land here
    argv = [argv[0], str(TRAINING_NB), *(str(a_file(tmp_path)) if a == "FILE" else a for a in argv[1:])]
    if "-o" not in argv: argv += ["-o", str(tmp_path / "o")]
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert f"rlnb {argv[0]}: error:" in err and says.replace("{tmp}", str(tmp_path)) in err, err
    assert sorted(p.name for p in tmp_path.iterdir()) in ([], ["a_file"])


def _one_tool_iteration(tool_parser):
    from rlnb import training
    from rlnb.core import create_training_config
    model, tokenizer = tiny.load_tiny_model(progress=False)
    config = create_training_config(num_iterations=1, prompts_per_step=2, group_size=2, max_new_tokens=4,
                                    eval_every=0, lora_r=0)
    return training.train(config, model=model, tokenizer=tokenizer, tool_parser=tool_parser, progress=False)


def test_single_turn_training_takes_the_built_in_parsers_malformed_calls():
    "A malformed call (name None, with its error) is the parsers' own record: single-turn training keeps it."
    state = _one_tool_iteration(lambda text: [{"name": None, "arguments": None, "error": "not JSON"}])
    assert state.iteration == 1


def test_single_turn_training_names_a_parser_with_bad_arguments():
    with pytest.raises(TypeError, match="`tool_parser` returned call 0 with arguments 5"):
        _one_tool_iteration(lambda text: [{"name": "x", "arguments": 5}])
