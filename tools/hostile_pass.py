"""A hostile pass: about 1,000 bad, odd or malicious inputs, tried as a careless or hostile user would, each classified.

Every case declares its family, a one-line description, the call, and what a right answer looks like: accepted
(and the result checked), or refused with an error (or a warning) whose message holds given words (the argument,
file or setting the case is about). Each outcome is one of

    correct  the call worked and its result is right (a value that should be accepted is)
    clear    an exception of an expected type (or a warning) whose message names what the case is about
    raw      an exception that does not name it, or a KeyError / IndexError / RecursionError ... from deep inside,
             or an error for an input that should have been accepted
    silent   a bad input accepted and used without a word (no error, no warning), or a wrong result
    lost     a file written, moved or deleted outside the folder the case chose (a sentinel folder is compared)
    hang     no answer within the case's timeout (the worker is killed)
    crash    the worker process died

Cases run in a pool of worker processes (each imports rlnb once); a hang or a crash kills only its worker, which
is replaced. Nothing needs the network; cases that train use the tiny model for an iteration or two. Everything a
case writes goes under one temporary folder (HOME, TMPDIR, RLNB_CACHE and the working folder point into it).

Run it from the repository root (about 5 minutes on 2 cores with 2 workers; a case that hangs costs its timeout):

    OMP_NUM_THREADS=1 RLNB_NUM_THREADS=1 PYTHONPATH=$PWD python tools/hostile_pass.py --workers 2 --json pass.json
    python tools/hostile_pass.py --list                      # the families and their case counts
    python tools/hostile_pass.py --family links --limit 20   # one family, its first 20 cases

It prints a table of counts per family and outcome, the total, the share of raw errors, and every case whose outcome
is neither correct nor clear (family, description, outcome, the first line of the message)."""
from __future__ import annotations

import argparse, contextlib, copy, functools, hashlib, io, json, os, shutil, signal, socket, struct, sys
import tempfile, time, warnings
from collections import Counter
from pathlib import Path
from typing import Callable, NamedTuple

ROOT = Path(__file__).resolve().parents[1]
TRAINING_NB = ROOT / "nbs" / "experiments" / "grpo_training.ipynb"
OUTCOMES = ("correct", "clear", "raw", "silent", "lost", "hang", "crash")
nan, inf = float("nan"), float("inf")


# --- cases -----------------------------------------------------------------------------------------------------------
class Case(NamedTuple):
    family: str  # which family of the issue the case belongs to
    description: str  # one line
    fn: Callable  # fn(t) with t the case's own empty folder (its sentinel is t.parent / "outside")
    expect: str = "refuse"  # "refuse": an error or a warning naming `words`; "accept": works; "either": one of them
    words: tuple = ()  # what the message must hold
    check: Callable | None = None  # check(result, t) -> None if right, else what is wrong (accepted cases)
    timeout: float = 20.0  # seconds before the case counts as a hang
    types: tuple = ()  # exception types that count as clear (default: ValueError, TypeError, OSError, CliRefused)
    isolated: bool = False  # the case changes process-wide state: its worker is replaced after it


CASES: list[Case] = []


def case(family, description, fn, expect="refuse", words=(), check=None, timeout=20.0, types=(), isolated=False):
    CASES.append(Case(family, description, fn, expect, (words,) if isinstance(words, str) else tuple(words), check,
                      timeout, types, isolated))


class CliRefused(Exception):
    "`rlnb ...` exited with status 2 (bad arguments); the message is its stderr."


class CliFailed(Exception):
    "`rlnb ...` exited with another non-zero status."


# --- shared helpers: the tiny model, small runs, a saved run ----------------------------------------------------------
FAST = dict(num_iterations=1, prompts_per_step=2, group_size=2, max_new_tokens=2, eval_every=0, lora_r=0)


@functools.cache
def _tiny():
    from rlnb import tiny
    return tiny.load_tiny_model(progress=False)


def tok(): return _tiny()[1]
def model(): return copy.deepcopy(_tiny()[0])
def outside(t: Path) -> Path: return t.parent / "outside"


def cfg(**kw):
    from rlnb.core import create_training_config
    return create_training_config(**{**FAST, **kw})


def train(config=None, **hooks):
    "One short run of `train` on a fresh copy of the tiny model."
    from rlnb.training import train as train_fn
    hooks.setdefault("model", model())
    hooks.setdefault("tokenizer", tok())
    return train_fn(config or cfg(), progress=False, **hooks)


BASE_RUN = dict(num_iterations=2, prompts_per_step=2, group_size=2, max_new_tokens=3, eval_every=0, lora_r=4)


@functools.cache
def _base_run() -> Path:
    "A finished 2-iteration LoRA run with its checkpoint, made once per worker (copied by each case that uses it)."
    from rlnb.core import create_training_config
    from rlnb.training import train as train_fn
    out = Path(os.environ["HOSTILE_ROOT"]) / f"base-run-{os.getpid()}"
    if not out.exists():
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            train_fn(create_training_config(**BASE_RUN, output_dir=str(out)), progress=False)
    return out


def saved_run(t: Path) -> Path:
    "A copy of the base run in t/run."
    shutil.copytree(_base_run(), t / "run", symlinks=True)
    return t / "run"


def resume(run: Path, **changes):
    "Resume the run in `run` to iteration 3, with `changes` to its config."
    from rlnb.core import create_training_config
    from rlnb.training import train as train_fn
    return train_fn(create_training_config(**{**BASE_RUN, "num_iterations": 3, **changes, "output_dir": str(run),
                                              "resume": True}), progress=False)


def cli(*argv) -> str:
    "`rlnb ARGV` in this process: its stdout if it exits 0; CliRefused (status 2) or CliFailed otherwise."
    from rlnb import cli as cli_module
    out, err = io.StringIO(), io.StringIO()
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            rc = cli_module.main([str(a) for a in argv])
    except SystemExit as e: rc = e.code  # argparse
    if rc == 2: raise CliRefused(err.getvalue().strip())
    if rc: raise CliFailed(f"exit status {rc}: {err.getvalue().strip() or out.getvalue().strip()}")
    return out.getvalue()


def small_notebook(path: Path, body: str = "", tagged: bool = True) -> Path:
    "A papermill notebook: a parameters cell (num_iterations, seed, output_dir) and `body`."
    import nbformat
    cells = [nbformat.v4.new_code_cell("num_iterations = 1\nseed = 0\noutput_dir = None",
                                       metadata={"tags": ["parameters"]} if tagged else {})]
    if body: cells.append(nbformat.v4.new_code_cell(body))
    nb = nbformat.v4.new_notebook(cells=cells)
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(nb, path)
    return path


def linked(link: Path, target: Path) -> Path:
    "A symbolic link at `link` to `target` (its folder made)."
    link.parent.mkdir(parents=True, exist_ok=True)
    link.symlink_to(target)
    return link


_SNAPSHOT = {}  # the sentinel folder as the case found it (ready() takes it again after a case's own setup)


def ready(t: Path) -> None:
    "Call after a case's own setup changed its sentinel folder: what is outside is compared from here on."
    _SNAPSHOT["before"] = _snapshot(t.parent)


def no_grads(m) -> str | None:
    "None if no parameter of `m` holds a gradient, else how many do."
    stale = [n for n, p in m.named_parameters() if p.grad is not None and p.grad.abs().sum() > 0]
    return f"{len(stale)} parameters keep a gradient ({stale[0]})" if stale else None


# --- family "config": every TrainingConfig field x values of another type, out of range, non-finite ------------------
def _field_kinds() -> dict:
    "TrainingConfig field -> (kind, optional): kind is int, float, str, bool or dict."
    from rlnb.core import TrainingConfig
    kinds = {}
    for name, ann in TrainingConfig.__annotations__.items():
        text = ann if isinstance(ann, str) else getattr(ann, "__name__", str(ann))
        text = str(ann) if "None" in str(ann) else text
        kind = next(k for k in ("bool", "int", "float", "str", "dict") if k in text)
        kinds[name] = (kind, "None" in str(ann))
    return kinds


def _hostile_values(kind: str, name: str) -> list:
    "(description, value) pairs a field of `kind` must refuse."
    if kind == "int": return [("the str '2'", "2"), ("2.5", 2.5), ("True", True)][len(name) % 2:]
    if kind == "float": return [("the str '0.5'", "0.5"), ("nan", nan), ("inf", inf)]
    if kind == "str": return [("5", 5), ("a NUL", "a\x00b")]
    if kind == "bool": return [("the str 'False'", "False"), ("2", 2)]
    return [("the str 'clip_eps=0.1'", "clip_eps=0.1"), ("a list of pairs", [("clip_eps", 0.1)]),
            ("an int key", {1: 2}), ("a NaN knob", {"clip_eps": nan})]


# values that a field must refuse besides those of another type: names outside its choices, ranges
_STR_BAD = {"model": [("blank", "  ")], "dtype": [("'float16'", "float16"), ("'FLOAT32'", "FLOAT32")],
            "task": [("'addition '", "addition "), ("'nope'", "nope")],
            "task_format": [("'Chat'", "Chat")], "generator": [("'vllm '", "vllm "), ("'HF'", "HF")],
            "algorithm": [("'GRPO'", "GRPO"), ("'grpo '", "grpo ")], "lr_schedule": [("'linear'", "linear")],
            "mixed_precision": [("'fp16'", "fp16"), ("True as str", "True")],
            "rollout_correction": [("'TIS'", "TIS"), ("'tis'", "tis")], "teacher": [("blank", " ")],
            "output_dir": [("an empty str", "")], "plugins": [("'a b'", "a b"), ("'os;x'", "os;x"), ("','", ",")]}


def config_door(**fields):
    "A config as the papermill notebook and the CLI get it: checked by check_run_params, then by train itself."
    from rlnb.experiments import check_run_params
    params = {**FAST, **fields}
    check_run_params(params)
    config = cfg(**fields)
    train(config._replace(num_iterations=0))
    return config


def _config_family() -> None:
    from rlnb.core import CONFIG_MAXIMA, TrainingConfig, _LIMITS
    for name, (kind, optional) in _field_kinds().items():
        for what, value in _hostile_values(kind, name) + _STR_BAD.get(name, []):
            words = name if not isinstance(value, dict) else "clip_eps" if "clip_eps" in value else "[1]"  # the knob
            case("config", f"{name} = {what}", lambda t, n=name, v=value: config_door(**{n: v}), words=words)
        if not optional and kind == "float":
            case("config", f"{name} = None (not optional)", lambda t, n=name: config_door(**{n: None}), words=name)
    # the edges themselves: the smallest allowed value is accepted, an excluded bound refused, past the largest refused
    needs = {"group_size": dict(algorithm="reinforce"), "over_sampling_factor": dict(algorithm="dapo"),
             "max_sampling_rounds": dict(algorithm="dapo"), "overlong_buffer": dict(algorithm="dapo")}
    for name, (low, inclusive) in _LIMITS.items():
        kind = _field_kinds()[name][0]
        other = needs.get(name, {})
        if inclusive:
            case("config", f"{name} = its minimum {low}", lambda t, n=name, v=low, o=other: cfg(**o, **{n: v}),
                 expect="accept", check=lambda r, t, n=name, v=low: None if getattr(r, n) == v else
                 f"{n} became {getattr(r, n)!r}")
        else:
            case("config", f"{name} = {low} (its bound, excluded)",
                 lambda t, n=name, v=low, o=other: cfg(**o, **{n: v}), words=name)
    for name, high in CONFIG_MAXIMA.items():
        kind = _field_kinds()[name][0]
        above = high + 1 if kind == "int" else high * 1.5
        case("config", f"{name} = {above} (above its maximum)", lambda t, n=name, v=above: cfg(**{n: v}), words=name)
    case("config", "an unknown field", lambda t: cfg(learning_rat=1e-3), words="learning_rat")
    case("config", "a field given as a positional TrainingConfig and a keyword", lambda t: cfg(
         config=TrainingConfig(), learning_rate=1e-3), expect="either")


# --- family "cli": rlnb train / run / sweep x bad -p, -y and -f values -----------------------------------------------
_CLI_BAD = {"int": [("2.5", "2.5"), ("'3'", "'3'"), ("nan", "nan")], "float": [("nan", "nan"), ("1e999", "1e999"),
            ("'0.1'", "'0.1'")], "str": [("5", "5"), ("[1]", "[1]")], "bool": [("'yes'", "yes"), ("2", "2")],
            "dict": [("a list", "[1, 2]"), ("a str", "clip_eps")]}
QUICK = ("-p", "num_iterations", "0", "-p", "eval_every", "0")  # if a bad value slips through: nothing long runs


def _cli_family() -> None:
    for name, (kind, _) in _field_kinds().items():
        for what, text in _CLI_BAD[kind][len(name) % 2:][:1]:  # one of two values, by the name's length
            quick = () if name in ("num_iterations", "eval_every") else QUICK
            case("cli", f"train -p {name} {what}", lambda t, n=name, x=text, q=quick: cli("train", "-p", n, x, *q),
                 words=name)
    for sub in ("run", "train"):  # rlnb sweep reads its parameters with the same code as rlnb run
        first = (sub,) if sub == "train" else (sub, str(TRAINING_NB), "-o", "OUT")
        argv = lambda t, *a, f=first: [x.replace("OUT", str(t / "o")) for x in f] + list(a)
        q = QUICK if sub == "train" else ()
        case("cli", f"{sub}: -p with a misspelt field", lambda t, a=argv: cli(*a(t, "-p", "lerning_rate", "1e-3", *q)),
             words="lerning_rate")
        case("cli", f"{sub}: -p name that is no identifier", lambda t, a=argv: cli(*a(t, "-p", "learning-rate", "1")),
             words="learning-rate")
        case("cli", f"{sub}: -p name without a value", lambda t, a=argv: cli(*a(t, "-p", "seed")), words="-p")
        case("cli", f"{sub}: -p given twice", lambda t, a=argv: cli(*a(t, "-p", "seed", "1", "-p", "seed", "2")),
             words="seed")
        case("cli", f"{sub}: -p output_dir with a NUL", lambda t, a=argv: cli(*a(t, "-p", "output_dir", "a\x00b", *q)),
             words="output_dir")
        case("cli", f"{sub}: -p seed of 5,000 digits", lambda t, a=argv: cli(*a(t, "-p", "seed", "9" * 5000, *q)),
             words="seed")
        case("cli", f"{sub}: -p learning_rate nested 2,000 deep",
             lambda t, a=argv: cli(*a(t, "-p", "learning_rate", "[" * 2000 + "]" * 2000, *q)), words="learning_rate")
        case("cli", f"{sub}: -p learning_rate 1e-3 with a trailing space", lambda t, a=argv:
             cli(*a(t, "-p", "learning_rate", "1e-3 ", *q)), expect="either", words="learning_rate")
        case("cli", f"{sub}: -y a list", lambda t, a=argv: cli(*a(t, "-y", "[1, 2]")), words="-y")
        case("cli", f"{sub}: -y unclosed", lambda t, a=argv: cli(*a(t, "-y", "learning_rate: [")), words="-y")
        case("cli", f"{sub}: -y an int key", lambda t, a=argv: cli(*a(t, "-y", "{1: 2}")), words="-y")
        case("cli", f"{sub}: -y a python tag", lambda t, a=argv:
             cli(*a(t, "-y", "seed: !!python/object/apply:os.getpid []")), words="-y")
        case("cli", f"{sub}: -y a date", lambda t, a=argv: cli(*a(t, "-y", "seed: 2020-01-01", *q)), words="seed")
        case("cli", f"{sub}: -y learning_rate .nan", lambda t, a=argv: cli(*a(t, "-y", "learning_rate: .nan", *q)),
             words="learning_rate")
        case("cli", f"{sub}: -y binary", lambda t, a=argv: cli(*a(t, "-y", "model: !!binary aGVsbG8=", *q)),
             words="model")
        case("cli", f"{sub}: -y a set", lambda t, a=argv: cli(*a(t, "-y", "seed: !!set {1, 2}", *q)), words="seed")
        case("cli", f"{sub}: -y an int of 5,000 digits", lambda t, a=argv: cli(*a(t, "-y", "seed: " + "7" * 5000, *q)),
             words="seed")
        case("cli", f"{sub}: -y an anchor that holds itself", lambda t, a=argv:
             cli(*a(t, "-y", "learning_rate: &a [*a]", *q)), words="learning_rate")
        case("cli", f"{sub}: -f missing", lambda t, a=argv: cli(*a(t, "-f", str(t / "no.yaml"))),
             words="no.yaml")
        case("cli", f"{sub}: -f a folder", lambda t, a=argv: cli(*a(t, "-f", str(t))), words="-f")
        case("cli", f"{sub}: -f a FIFO", lambda t, a=argv: (os.mkfifo(t / "p.yaml"),
                                                             cli(*a(t, "-f", str(t / "p.yaml")))), words="p.yaml")
        case("cli", f"{sub}: -f invalid UTF-8", lambda t, a=argv: ((t / "b.yaml").write_bytes(b"seed: \xff\xfe\n"),
             cli(*a(t, "-f", str(t / "b.yaml"), *q))), words="seed")
        case("cli", f"{sub}: -f NUL bytes", lambda t, a=argv: ((t / "z.yaml").write_bytes(b"\0" * 64),
             cli(*a(t, "-f", str(t / "z.yaml")))), words="z.yaml")
        case("cli", f"{sub}: -f 2 MB", lambda t, a=argv: ((t / "big.yaml").write_text("# x\n" * 500_000),
             cli(*a(t, "-f", str(t / "big.yaml")))), words="big.yaml")
        case("cli", f"{sub}: -f a link to a missing file", lambda t, a=argv: (linked(t / "l.yaml", t / "gone.yaml"),
             cli(*a(t, "-f", str(t / "l.yaml")))), words="l.yaml")
    case("cli", "train -p num_iterations 0: nothing trained, a summary", lambda t: cli("train", *QUICK),
         expect="accept", check=lambda r, t: None if "trained 0 steps" in r else f"said {r[:200]!r}")
    case("cli", "train -p num_iterations 0 with output_dir: summary.json written", lambda t: (cli(
         "train", *QUICK, "-p", "output_dir", str(t / "o")), json.loads((t / "o" / "summary.json").read_text()))[1],
         expect="accept", check=lambda r, t: None if r["final_step"] == 0 else f"summary {r}")
    for flag, value, word in (("--seeds", "-1", "seeds"), ("--seeds", "0", "seeds"), ("--seeds", "100000", "seeds"),
                              ("--workers", "0", "workers"), ("--workers", "-3", "workers"),
                              ("--threads", "0", "threads"), ("--threads", "-1", "threads")):
        case("cli", f"sweep {flag} {value}", lambda t, f=flag, v=value: cli(
             "sweep", TRAINING_NB, "-o", t / "o", f, v, "-p", "num_iterations", "1", "2"), words=word)
    case("cli", "sweep: -p seed and --seeds both", lambda t: cli(
         "sweep", TRAINING_NB, "-o", t / "o", "--seeds", "2", "-p", "seed", "1", "2"), words="seed")
    case("cli", "sweep: values 1 and 1.0", lambda t: cli(
         "sweep", TRAINING_NB, "-o", t / "o", "-p", "learning_rate", "1", "1.0"), words="equal")
    case("cli", "sweep: 10,001 values", lambda t: cli(
         "sweep", TRAINING_NB, "-o", t / "o", "-p", "seed", *map(str, range(10_001))), words="10,001")
    case("cli", "run: -o a file", lambda t: ((t / "f").write_text("x"), cli("run", TRAINING_NB, "-o", t / "f")),
         words="output_dir")
    case("cli", "run: -o below a file", lambda t: ((t / "f").write_text("x"),
                                                   cli("run", TRAINING_NB, "-o", t / "f" / "run")), words="output_dir")
    case("cli", "run: a notebook that does not exist", lambda t: cli("run", t / "none.ipynb", "-o", t / "o"),
         words="none.ipynb")
    case("cli", "run: a notebook that is a folder", lambda t: cli("run", t, "-o", t / "o"), words="notebook")
    case("cli", "run: a notebook of invalid JSON", lambda t: ((t / "x.ipynb").write_text("{"), cli(
         "run", t / "x.ipynb", "-o", t / "o", "-p", "seed", "1")), words="x.ipynb")
    case("cli", "run: a notebook nested 100,000 deep", lambda t: ((t / "d.ipynb").write_text(
         "[" * 100_000 + "]" * 100_000), cli("run", t / "d.ipynb", "-o", t / "o", "-p", "seed", "1")), words="d.ipynb")
    case("cli", "run: a notebook without a parameters cell", lambda t: cli(
         "run", small_notebook(t / "u.ipynb", tagged=False), "-o", t / "o", "-p", "seed", "1"), words="parameters")
    case("cli", "run: a tiny notebook runs and completes", lambda t: cli(
         "run", small_notebook(t / "ok.ipynb"), "-o", t / "o", "-p", "seed", "3"), expect="accept", timeout=90,
         check=lambda r, t: None if json.loads((t / "o" / "status.json").read_text())["status"] == "completed" else
         "status is not completed")
    case("cli", "no command", lambda t: cli(), words="run,sweep,train")
    case("cli", "an unknown command", lambda t: cli("trian"), words="trian")


# --- family "degenerate": every algorithm x its knobs at degenerate values -------------------------------------------
_KNOB_BAD = {  # knob -> values that make a run meaningless or are of another kind: each must be refused (or warned)
    "clip_eps": [nan, "0.2", -0.5, 1.5], "clip_eps_high": [nan, -1.0, "0.28"], "eps": [nan, -1.0, "1e-4"],
    "beta": [nan, -0.1, "0.1", inf], "aggregation": ["sum", ""], "max_completion_length": [0, -5, 2.5],
    "kl_fn": ["", 3.0], "log_ratio_clip": [nan, "1"], "dual_clip": [0.5, nan], "clip_cov_ratio": [-0.1, 1.5, nan],
    "clip_cov_low": [nan, -1.0], "clip_cov_high": [-1.0, nan], "divergence": ["kl2", 3], "ratio_cap": [nan, "1"],
    "weights": [[nan, 1.0], "1,1", []], "k": [0, -1, 2.5, 100], "threshold": [nan, "1"],
    "tau_pos": [0.0, -1.0, nan], "tau_neg": [0.0, -1.0, nan], "kl_cov_ratio": [-0.1, 1.5, nan],
    "kl_cov_coef": [-1.0, nan], "teacher_coef": [nan, "1"], "gamma": [nan, -0.5, 1.5], "lam": [nan, -0.5, 1.5],
    "whiten": ["no", 2, None], "value_fn": [5, "x"], "vf_coef": [nan, -1.0], "value_clip": [-1.0, nan],
    "kl_penalty": ["rewardz", 3], "baseline_fn": [5, "mean"], "kl_estimator": ["k7", 3], "pair_selector": [5, "best"],
    "min_margin": [nan, -1.0], "scale": ["max", None, 1]}
_KNOB_GOOD = {  # (algorithm, knob, value) among the values above that are right for that algorithm
    ("cispo", "clip_eps", 1.5): "1 - clip_eps < 0: no lower bound, CISPO's own choice",
    ("clip_cov", "clip_cov_low", -1.0): "a covariance band may start below 0"}
_SHARED_KNOBS = ("clip_eps", "clip_eps_high", "eps", "beta", "aggregation", "max_completion_length", "kl_fn",
                 "log_ratio_clip", "dual_clip")  # in many algorithms: two values each are enough


def _algo_run(name: str, **options):
    "One iteration of `name` on the tiny model with `options` as its knobs."
    base = dict(group_size=4, max_new_tokens=5)  # dapo's overlong buffer (4 tokens) must fit
    if name == "grpo_passk": options = {"k": 2, **options}
    if name == "opd": base["teacher"] = "tiny"
    return train(cfg(algorithm=name, algorithm_options=options or None, **base))


def _degenerate_family() -> None:
    from rlnb.algorithms import ALGORITHMS, create_algorithm_config
    for name in sorted(ALGORITHMS):
        case("degenerate", f"{name} with its defaults trains", lambda t, n=name: _algo_run(n).iteration,
             expect="accept", check=lambda r, t: None if r == 1 else f"iteration {r}", timeout=40)
        knobs = [k for k in create_algorithm_config(name) if k in _KNOB_BAD]
        for j, knob in enumerate(knobs):
            values = _KNOB_BAD[knob]
            # one value per knob, a different one from one algorithm to the next
            values = [values[(j + len(name)) % len(values)]]
            for v in values:
                if (name, knob, v) in _KNOB_GOOD:  # a value the paper uses: it must train
                    case("degenerate", f"{name}: {knob}={v!r} ({_KNOB_GOOD[name, knob, v]})", lambda t, n=name,
                         k=knob, v=v: _algo_run(n, **{k: v}).iteration, expect="accept",
                         check=lambda r, t: None if r == 1 else f"iteration {r}", timeout=40)
                    continue
                case("degenerate", f"{name}: {knob}={v!r}", lambda t, n=name, k=knob, v=v: _algo_run(n, **{k: v}),
                     words=knob, timeout=40)
        if name in ("grpo", "ppo", "dpo", "sapo", "opd"):
            case("degenerate", f"{name}: an unknown knob", lambda t, n=name: _algo_run(n, clip_epsilon=0.1),
                 words="clip_epsilon")
        spec = ALGORITHMS[name]
        if spec.group_relative:
            case("degenerate", f"{name}: group_size 1", lambda t, n=name: train(cfg(
                 algorithm=n, group_size=1, teacher="tiny" if n == "opd" else None)), words="group_size")
    case("degenerate", "temperature 1e-6: every group's completions equal", lambda t: train(cfg(
         temperature=1e-6, group_size=4, num_iterations=2)), words="trains on nothing")
    case("degenerate", "entropy_top_fraction 1e-9: the mask keeps its one token", lambda t: train(cfg(
         entropy_top_fraction=1e-9, group_size=4)).iteration, expect="accept",  # at least one token, by design
         check=lambda r, t: None if r == 1 else f"iteration {r}")
    case("degenerate", "dapo: every group filtered (equal rewards)", lambda t: train(cfg(
         algorithm="dapo", group_size=2, max_new_tokens=5, overlong_buffer=0), reward_fn=lambda r: 1.0),
         words="dynamic")
    case("degenerate", "a reward that is always 0", lambda t: train(cfg(group_size=4), reward_fn=lambda r: 0.0),
         words="trains on nothing")
    case("degenerate", "max_grad_norm 1e-30: every step clipped to nothing", lambda t: train(cfg(
         max_grad_norm=1e-30)), expect="either", words="max_grad_norm")
    case("degenerate", "rollout_correction mis_token with cap 1.0 on policy: kept", lambda t: train(cfg(
         rollout_correction="mis_token", rollout_correction_cap=1.0)).iteration, expect="accept")
    case("degenerate", "icepop with low = high = 1", lambda t: train(cfg(
         rollout_correction="icepop", rollout_correction_low=1.0, rollout_correction_high=1.0)),
         expect="either", words="rollout_correction")
    case("degenerate", "reinforce with group_size 1 trains", lambda t: train(cfg(
         algorithm="reinforce", group_size=1)).iteration, expect="accept")


# --- family "links": every file rlnb writes in a run, cache or export folder x a link (or a folder) in its place ------
def _targets(t: Path) -> dict:
    "Where a planted link may point: a file outside, a folder outside, a missing path outside."
    o = outside(t)
    return {"a file outside": o / "precious.txt", "a folder outside": o / "sub", "a missing path outside": o / "new"}


def _plant(folder: Path, name: str, target: Path) -> None:
    linked(folder / name, target)


def _train_into(out: Path, **kw):
    return train(cfg(output_dir=str(out), num_iterations=2, checkpoint_every=1, **kw))


def _links_family() -> None:
    import matplotlib
    matplotlib.use("Agg")
    names = ["metrics.jsonl", "checkpoint", ".lock", "summary.json", ".checkpoint.old-1", ".checkpoint.tmp-1",
             "checkpoint.tmp", "rollouts.jsonl"]
    for name in names:
        for where, target in (("a file outside", "precious.txt"), ("a folder outside", "sub"),
                              ("a missing path outside", "new")):
            case("links", f"train into a folder whose {name} is a link to {where}",
                 lambda t, n=name, x=target: (_plant(t / "run", n, outside(t) / x), _train_into(t / "run")),
                 expect="either", words=name, timeout=40)
    for name in ("state.json", "model.safetensors", "adapter_model.safetensors", "optimizer.pt", "rng.pt"):
        case("links", f"resume a run whose checkpoint/{name} is a link outside",
             lambda t, n=name: ((r := saved_run(t)), (r / "checkpoint" / n).unlink(missing_ok=True),
                                _plant(r / "checkpoint", n, outside(t) / "precious.txt"),
                                resume(r, checkpoint_every=1)), expect="either", words=name, timeout=40)
    for name in ("metrics.jsonl", "checkpoint"):
        case("links", f"resume a run whose {name} became a link to a copy outside",
             lambda t, n=name: ((r := saved_run(t)), shutil.move(str(r / n), str(outside(t) / "moved")),
                                _plant(r, n, outside(t) / "moved"), ready(t), resume(r)), expect="either", words=name,
             timeout=40)
    for name, what in (("summary.json", "file"), ("summary.json", "folder"), (".summary.json.tmp", "file")):
        case("links", f"rlnb train with {name} a link to a {what} outside",
             lambda t, n=name, w=what: (_plant(t / "run", n, outside(t) / ("precious.txt" if w == "file" else "sub")),
                                        cli("train", *QUICK, "-p", "output_dir", t / "run")), expect="either",
             words=name, timeout=40)
    for name, kind in (("checkpoint", "file"), (".lock", "folder"), ("metrics.jsonl.tmp", "folder"),
                       ("checkpoint", "fifo")):
        case("links", f"train into a folder whose {name} is a {kind}", lambda t, n=name, k=kind: (
             _in_place(t / "run" / n, k), _train_into(t / "run")), expect="either", words=name, timeout=40)
    for name, kind in (("status.json", "folder"), ("run.ipynb", "folder"), ("attempts", "file"),
                       (".run.lock", "folder"), ("summary.json", "fifo")):
        case("links", f"run_experiment into a folder whose {name} is a {kind}", lambda t, n=name, k=kind: (
             _in_place(t / "run" / n, k), _run_in(t)), expect="either", words=name, timeout=60)
    case("links", "rlnb train with summary.json a folder", lambda t: (
         (t / "run" / "summary.json").mkdir(parents=True), cli("train", *QUICK, "-p", "output_dir", t / "run")),
         words="summary.json", timeout=40)
    from rlnb.experiments import ATTEMPTS_DIR, RUN_LOCK_FILE, STATUS_FILE
    for name in ("run.ipynb", STATUS_FILE, "summary.json", "reward_curve.png", ATTEMPTS_DIR, RUN_LOCK_FILE, ".lock",
                 "metrics.jsonl", "checkpoint"):
        case("links", f"run_experiment into a folder whose {name} is a missing path outside",
             lambda t, n=name: _run_with_link(t, n, "new"), words=name, timeout=60)
    for name in ("1", "2"):
        case("links", f"run_experiment: attempts/{name} a link to a folder outside",
             lambda t, n=name: _run_with_link(t, f"{ATTEMPTS_DIR}/{n}", "sub"), expect="either", words=ATTEMPTS_DIR,
             timeout=90)
    case("links", "run_experiment: checkpoint/state.json a link outside (one level down)",
         lambda t: _run_with_link(t, "checkpoint/state.json", "precious.txt"), expect="either", words="state.json",
         timeout=90)
    for name in ("summary.json", "status.json", "run.ipynb", "metrics.jsonl"):
        case("links", f"a notebook that makes {name} a link outside while it runs",
             lambda t, n=name: _notebook_plants(t, n), expect="either", words=name, timeout=90)
    # writers one by one
    from rlnb.cache import write_atomically
    for where, target in (("a file outside", "precious.txt"), ("a missing path outside", "new"),
                          ("a folder outside", "sub")):
        case("links", f"write_atomically onto a link to {where}", lambda t, x=target: (
             _plant(t, "f.json", outside(t) / x), write_atomically(t / "f.json", "{}")), expect="either",
             words="f.json")
        case("links", f"save_figure onto a link to {where}", lambda t, x=target: _figure_onto(t, x), expect="either",
             words="curve.png")
        case("links", f"create_jsonl_logger onto a link to {where}", lambda t, x=target: _log_onto(t, x),
             expect="either", words="metrics.jsonl")
        case("links", f"folder_lock with .lock a link to {where}", lambda t, x=target: _lock_onto(t, x),
             expect="either", words=".lock")
        case("links", f"save_checkpoint with checkpoint a link to {where}", lambda t, x=target: _save_onto(t, x),
             expect="either", words="checkpoint")
    case("links", "RLNB_CACHE a link to a folder outside: the cache may be built there", lambda t: (
         linked(t / "cache", outside(t) / "sub"), os.environ.__setitem__("RLNB_CACHE", str(t / "cache")),
         __import__("rlnb.cache", fromlist=["x"]).default_cache_dir()), expect="accept")
    case("links", "drop_metrics_after on a metrics file that is a link outside", lambda t: (
         _plant(t, "metrics.jsonl", outside(t) / "precious.txt"),
         __import__("rlnb.loggers", fromlist=["x"]).drop_metrics_after(t / "metrics.jsonl", 0)), words="metrics.jsonl")
    case("links", "load_sweep over a folder with a run folder that is a link outside", lambda t: (
         _plant(t, "run-a", outside(t) / "sub"), __import__("rlnb.sweep_results", fromlist=["x"]).load_sweep(t)),
         expect="either", words="run-a")
    case("links", "build_atomically into a folder that is a dangling link", lambda t: (
         _plant(t, "built", outside(t) / "new"), __import__("rlnb.cache", fromlist=["x"]).build_atomically(
             t / "built", lambda tmp: (Path(tmp) / "f.txt").write_text("x"), lambda f: (f / "f.txt").is_file())),
         expect="either", words="built")


def _in_place(path: Path, kind: str) -> None:
    "A file, a folder or a FIFO where rlnb expects the other kind."
    path.parent.mkdir(parents=True, exist_ok=True)
    if kind == "file": path.write_text("not what rlnb wrote")
    elif kind == "folder": (path / "inside").mkdir(parents=True)
    else: os.mkfifo(path)


def _run_in(t: Path):
    from rlnb.experiments import STATUS_FILE, run_experiment
    out = t / "run"
    if not (out / STATUS_FILE).exists():
        (out / STATUS_FILE).write_text(json.dumps({"status": "failed", "params": {"seed": 0}, "attempt": 1}))
    return run_experiment(small_notebook(t / "nb.ipynb"), {"seed": 0}, out, check_params=None).status


def _run_with_link(t: Path, name: str, target: str):
    from rlnb.experiments import STATUS_FILE, run_experiment
    out = t / "run"
    out.mkdir()
    if name.split("/")[0] != STATUS_FILE:
        (out / STATUS_FILE).write_text(json.dumps({"status": "failed", "params": {"seed": 0}, "attempt": 1}))
    if "/" in name:  # one level down
        (out / name.split("/")[0]).mkdir(exist_ok=True)
    _plant(out, name, outside(t) / target)
    return run_experiment(small_notebook(t / "nb.ipynb"), {"seed": 0}, out, check_params=None).status


def _notebook_plants(t: Path, name: str):
    from rlnb.experiments import run_experiment
    body = (f"import os, pathlib\np = pathlib.Path(output_dir) / {name!r}\nif p.exists() or p.is_symlink(): "
            f"p.unlink()\np.symlink_to({str(outside(t) / 'precious.txt')!r})")
    return run_experiment(small_notebook(t / "nb.ipynb", body), {"seed": 0}, t / "run", check_params=None).status


def _figure_onto(t: Path, target: str):
    import matplotlib.pyplot as plt
    from rlnb.loggers import save_figure
    _plant(t, "curve.png", outside(t) / target)
    fig, ax = plt.subplots()
    ax.plot([0, 1])
    try: return save_figure(fig, t / "curve.png", dpi=20)
    finally: plt.close(fig)


def _log_onto(t: Path, target: str):
    from rlnb.core import TrainingState, TrainingStats
    from rlnb.loggers import create_jsonl_logger
    _plant(t, "metrics.jsonl", outside(t) / target)
    log = create_jsonl_logger(t / "metrics.jsonl")
    return log(TrainingState(1, 1, None, None), TrainingStats(0.0, 0.0, 1e-3, 0.0, 0.5, 0.1))


def _rollouts_onto(t: Path, target: str, append: bool = False):
    from rlnb.core import Rollout, rollouts_to_jsonl
    _plant(t, "r.jsonl", outside(t) / target)
    return rollouts_to_jsonl([Rollout("1+1=", prompt_token_ids=[1], token_ids=[2], rewards=1.0)], t / "r.jsonl",
                             append=append)


def _lock_onto(t: Path, target: str):
    from rlnb.cache import LOCK_FILE, folder_lock
    _plant(t, LOCK_FILE, outside(t) / target)
    with folder_lock(t, "hostile"): pass


def _save_onto(t: Path, target: str):
    from rlnb.checkpoints import save_checkpoint
    from rlnb.core import TrainingState
    import torch
    _plant(t, "checkpoint", outside(t) / target)
    return save_checkpoint(TrainingState(1, 1, torch.nn.Linear(2, 2), None), t / "checkpoint")


# --- family "interrupt": a stopped cell (KeyboardInterrupt, SIGINT) at each hook, then resume ------------------------
def _interrupted_then_resumed(t: Path, hook: str, at: int, lora: int, signal_it: bool):
    "Interrupt a 3-iteration run at `hook` in iteration `at`; check the model, the files, and that resume completes."
    import torch
    from rlnb.core import create_training_config
    from rlnb.loggers import load_metrics
    from rlnb.training import train as train_fn
    out = t / "run"
    config = create_training_config(num_iterations=3, prompts_per_step=2, group_size=2, max_new_tokens=3,
                                     eval_every=1 if hook == "eval_fn" else 0, lora_r=lora, output_dir=str(out),
                                     checkpoint_every=1)
    seen = {"n": 0}

    def stop():
        if signal_it: os.kill(os.getpid(), signal.SIGINT)
        else: raise KeyboardInterrupt

    def hit(it):
        if it == at and seen["n"] == 0:
            seen["n"] = 1
            stop()

    it_of = lambda s: s.iteration
    per_iteration = {"reward_fn": 4, "template_fn": 2, "kl_fn": 1}  # calls of the hook in one iteration

    def counted(h):
        seen[h] = seen.get(h, 0) + 1
        if seen[h] == (at - 1) * per_iteration[h] + 1: hit(at)

    hooks = {
        "reward_fn": dict(reward_fn=lambda r: (counted("reward_fn"), float(len(r.token_ids) % 2))[1]),
        "logger": dict(logger=lambda s, st: hit(it_of(s))),
        "stop_fn": dict(stop_fn=lambda s, m: hit(it_of(s)) or False),
        "eval_fn": dict(eval_fn=lambda s: (hit(it_of(s)), {"eval/x": 0.0})[1]),
        "iteration_hook": dict(iteration_hook=lambda s, b: (hit(it_of(s) + 1), b)[1]),
        "optimizer_step_fn": dict(optimizer_step_fn=_interrupting_step(hit)),
        "kl_fn": dict(kl_fn=lambda lp, ref: (counted("kl_fn"), (lp - ref))[1]),
        "template_fn": dict(template_fn=lambda conv, tk: (counted("template_fn"), conv.messages[-1].content)[1]),
        "prompt_loader": dict(prompt_loader=lambda i: (hit(i + 1), ["1+1=", "2+3="])[1], reward_fn=lambda r: 0.0),
    }[hook]
    if hook == "kl_fn": config = config._replace(beta=0.1)
    if hook == "prompt_loader": config = config._replace(prompts_per_step=16)  # the loader decides it
    m = model()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            train_fn(config, model=m, tokenizer=tok(), progress=False, **hooks)
            return "the interrupt was swallowed: train returned"
        except KeyboardInterrupt: pass
    problems = [p for p in [no_grads(m)] if p]
    ckpt_iteration = None
    if (out / "checkpoint" / "state.json").exists():  # rows logged after it are dropped when the run resumes
        ckpt_iteration = json.loads((out / "checkpoint" / "state.json").read_text())["iteration"]
    if ckpt_iteration is None:  # none yet is right only when the first iteration was stopped before its end
        if at > 1 or signal_it: problems.append("no checkpoint to resume from")
        return "; ".join(problems) or None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        state = train_fn(config._replace(resume=True), model=model(), tokenizer=tok(), progress=False,
                         **{k: v for k, v in hooks.items() if k in ("kl_fn", "template_fn")} if hook in
                         ("kl_fn", "template_fn") else {})
    rows = load_metrics(out / "metrics.jsonl")
    its = sorted(int(i) for i in rows.dropna(subset=["reward/mean"])["iteration"])  # training rows, not evaluations
    if state.iteration != 3: problems.append(f"resumed to iteration {state.iteration}, not 3")
    if sorted(set(its)) != [1, 2, 3] or len(its) != len(set(its)):
        problems.append(f"metrics iterations after resume: {its}")
    del torch
    return "; ".join(problems) or None


def _interrupting_step(hit):
    from rlnb.step import default_optimizer_step as optimizer_step
    def step(state, max_grad_norm):
        hit(state.global_step + 1)
        return optimizer_step(state, max_grad_norm)
    return step


def _interrupt_family() -> None:
    hooks = ["reward_fn", "logger", "stop_fn", "eval_fn", "iteration_hook", "optimizer_step_fn", "kl_fn",
             "template_fn", "prompt_loader"]
    for hook in hooks:
        for at in (1, 2):
            for lora in (0, 4):
                for sig in (False, True):
                    if sig and lora == 4: continue
                    how = "SIGINT" if sig else "KeyboardInterrupt"
                    case("interrupt", f"{how} in {hook} at iteration {at}, lora_r={lora}, then resume",
                         lambda t, h=hook, a=at, l=lora, s=sig: _interrupted_then_resumed(t, h, a, l, s),
                         expect="accept", check=lambda r, t: r, timeout=60)
    case("interrupt", "two SIGINTs in one logger call", lambda t: _double_sigint(t), expect="accept",
         check=lambda r, t: r, timeout=60)
    case("interrupt", "SIGINT during save_checkpoint's write", lambda t: _sigint_in_save(t), expect="accept",
         check=lambda r, t: r, timeout=60)


def _double_sigint(t: Path):
    def logger(s, st):
        if s.iteration == 1:
            os.kill(os.getpid(), signal.SIGINT)
            os.kill(os.getpid(), signal.SIGINT)
    m = model()
    try:
        train(cfg(num_iterations=3, output_dir=str(t / "run")), model=m, logger=logger)
        return "train returned"
    except KeyboardInterrupt: pass
    if signal.getsignal(signal.SIGINT) is not signal.default_int_handler: return "the SIGINT handler was not put back"
    return no_grads(m)


def _sigint_in_save(t: Path):
    from rlnb import checkpoints
    original = checkpoints._write_checkpoint
    def slow(state, folder):
        os.kill(os.getpid(), signal.SIGINT)
        return original(state, folder)
    checkpoints._write_checkpoint = slow
    try:
        try: train(cfg(num_iterations=2, checkpoint_every=1, output_dir=str(t / "run")))
        except KeyboardInterrupt: pass
    finally: checkpoints._write_checkpoint = original
    left = sorted(p.name for p in (t / "run").iterdir() if p.name.startswith(".checkpoint"))
    if left: return f"temporary checkpoint folders left: {left}"
    state = json.loads((t / "run" / "checkpoint" / "state.json").read_text())
    return None if state["iteration"] >= 1 else f"checkpoint at {state['iteration']}"


# --- family "hang": sizes in headers (GGUF, YAML aliases, nesting) and distributed waits, bounded -------------------
def _gguf(path: Path, tensor_count=0, kvs=(), tensors=b"", version=3, kv_count=None, tail=b"") -> Path:
    "A GGUF file: header, key-values (key, type, payload bytes), tensor infos and a tail, as given."
    s = lambda text: struct.pack("<Q", len(text)) + text
    body = b"GGUF" + struct.pack("<I", version) + struct.pack("<Q", tensor_count)
    body += struct.pack("<Q", len(kvs) if kv_count is None else kv_count)
    for key, kind, payload in kvs: body += s(key) + struct.pack("<I", kind) + payload
    path.write_bytes(body + tensors + tail)
    return path


def _gstr(text: bytes) -> bytes: return struct.pack("<Q", len(text)) + text
ARCH = (b"general.architecture", 8, _gstr(b"llama"))


def _tensor(name=b"w", dims=(2, 2), kind=0, offset=0) -> bytes:
    return _gstr(name) + struct.pack("<I", len(dims)) + b"".join(struct.pack("<Q", d) for d in dims) + struct.pack(
        "<IQ", kind, offset)


def _nested_array(depth: int) -> bytes:
    payload = struct.pack("<IQ", 0, 1) + b"\x01"
    for _ in range(depth): payload = struct.pack("<IQ", 9, 1) + payload
    return payload


_GGUF_CASES = {
    "an array of 2**60 bytes": dict(kvs=[ARCH, (b"x", 9, struct.pack("<IQ", 0, 2**60))]),
    "an array of 2**40 strings": dict(kvs=[ARCH, (b"x", 9, struct.pack("<IQ", 8, 2**40))]),
    "a string of 2**62 bytes": dict(kvs=[ARCH, (b"x", 8, struct.pack("<Q", 2**62))]),
    "a key of 2**62 bytes": dict(kvs=[], kv_count=1, tail=struct.pack("<Q", 2**62) + b"k" * 16),
    "2**62 key-values": dict(kvs=[ARCH], kv_count=2**62),
    "2**62 tensors": dict(kvs=[ARCH], tensor_count=2**62),
    "arrays nested 100,000 deep": dict(kvs=[ARCH, (b"x", 9, _nested_array(100_000))]),
    "a value of type 99": dict(kvs=[ARCH, (b"x", 99, b"\0" * 8)]),
    "version 1": dict(kvs=[ARCH], version=1), "version 999": dict(kvs=[ARCH], version=999),
    "a tensor of 2**31 dimensions": dict(kvs=[ARCH], tensor_count=1,
                                         tensors=_gstr(b"w") + struct.pack("<I", 2**31) + b"\0" * 64),
    "a tensor of 2**40 x 2**40 floats": dict(kvs=[ARCH], tensor_count=1, tensors=_tensor(dims=(2**40, 2**40))),
    "a tensor at offset 2**62": dict(kvs=[ARCH], tensor_count=1, tensors=_tensor(offset=2**62)),
    "a tensor of type 999": dict(kvs=[ARCH], tensor_count=1, tensors=_tensor(kind=999)),
    "a tensor name of 2**40 bytes": dict(kvs=[ARCH], tensor_count=1, tensors=struct.pack("<Q", 2**40) + b"w" * 8),
    "alignment 0": dict(kvs=[ARCH, (b"general.alignment", 4, struct.pack("<I", 0))], tensor_count=1,
                        tensors=_tensor()),
    "alignment 3": dict(kvs=[ARCH, (b"general.alignment", 4, struct.pack("<I", 3))], tensor_count=1,
                        tensors=_tensor()),
    "the architecture a number": dict(kvs=[(b"general.architecture", 4, struct.pack("<I", 7))]),
    "the architecture given twice": dict(kvs=[ARCH, (b"general.architecture", 8, _gstr(b"gpt2"))]),
    "a bool of value 2": dict(kvs=[ARCH, (b"x", 7, b"\x02")]),
    "only the magic": None, "an empty file": None,
}


def _gguf_file(t: Path, what: str) -> Path:
    path = t / "m.gguf"
    if what == "only the magic": path.write_bytes(b"GGUF")
    elif what == "an empty file": path.write_bytes(b"")
    else: _gguf(path, **_GGUF_CASES[what])
    return path


_BOMB = "a: &a [x, x, x, x, x, x, x, x, x]\n" + "".join(
    f"{chr(98 + k)}: &{chr(98 + k)} [{', '.join(['*' + chr(97 + k)] * 9)}]\n" for k in range(8))
_MERGE_BOMB = "a: &a {x: 1, y: 2}\n" + "".join(
    f"{chr(98 + k)}: &{chr(98 + k)} [{', '.join(['*' + chr(97 + k)] * 10)}]\n" for k in range(8))
_CHAIN = "a0: &a0 [x, x]\n" + "".join(f"a{k}: &a{k} [*a{k - 1}, *a{k - 1}]\n" for k in range(1, 90))
_YAML = {"the billion laughs": _BOMB, "laughs of mappings": _MERGE_BOMB, "a chain of 90 doublings": _CHAIN,
         "a flow list nested 100,000 deep": "seed: " + "[" * 100_000 + "]" * 100_000,
         "a block list nested 3,000 deep": "seed:\n" + "".join(" " * k + "-\n" for k in range(3000)),
         "a flow mapping nested 50,000 deep": "seed: " + "{a: " * 50_000 + "1" + "}" * 50_000,
         "an alias as a key": "a: &a [1, 2]\n? *a\n: 1\n",
         "a merge of a list": "a: &a [1]\nb:\n  <<: *a\n",
         "a document stream": "seed: 1\n---\nseed: 2\n"}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _distributed(env: dict):
    from rlnb.distributed import init_distributed
    os.environ.update({"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(_free_port()), **env})
    return init_distributed("gloo")


def _hang_family() -> None:
    from rlnb.real_models import inspect_gguf
    from rlnb.models import load_model
    from rlnb.cli import yaml_params
    for what in _GGUF_CASES:
        case("hang", f"inspect_gguf: {what}", lambda t, w=what: inspect_gguf(_gguf_file(t, w)), words="m.gguf")
        case("hang", f"load_model of a .gguf: {what}", lambda t, w=what: load_model(str(_gguf_file(t, w))),
             words="m.gguf", timeout=40)
    case("hang", "load_model of a folder named x.gguf", lambda t: ((t / "x.gguf").mkdir(),
                                                                   load_model(str(t / "x.gguf"))), words="x.gguf")
    for what, text in _YAML.items():
        case("hang", f"yaml_params: {what}", lambda t, x=text: yaml_params(x), words="-y")
        case("hang", f"rlnb train -f: {what}", lambda t, x=text: ((t / "p.yaml").write_text(x), cli(
             "train", "-f", t / "p.yaml", *QUICK)), words="p.yaml", timeout=40)
    for what, text in list(_YAML.items())[:3]:
        case("hang", f"rlnb sweep -y: {what}", lambda t, x=text: cli("sweep", TRAINING_NB, "-o", t / "o", "-y", x),
             words="-y")
    for what, env, words in (
            # the start waits RLNB_START_TIMEOUT (120 s by default), then stops saying so: bounded here at 8 s
            ("rank 0 of 2, its peer never comes", dict(WORLD_SIZE="2", RANK="0", RLNB_START_TIMEOUT="8"),
             "RLNB_START_TIMEOUT"),
            ("rank 1 of 2, no rank 0", dict(WORLD_SIZE="2", RANK="1", RLNB_START_TIMEOUT="8"), "RLNB_START_TIMEOUT"),
            ("WORLD_SIZE 'two'", dict(WORLD_SIZE="two", RANK="0"), "WORLD_SIZE"),
            ("WORLD_SIZE 2, RANK 2", dict(WORLD_SIZE="2", RANK="2"), "RANK"),
            ("WORLD_SIZE 2, RANK 'x'", dict(WORLD_SIZE="2", RANK="x"), "RANK"),
            ("WORLD_SIZE 2, RANK -1", dict(WORLD_SIZE="2", RANK="-1"), "RANK"),
            ("MASTER_PORT 99999", dict(WORLD_SIZE="2", RANK="0", MASTER_PORT="99999"), "MASTER_PORT"),
            ("MASTER_PORT 'http'", dict(WORLD_SIZE="2", RANK="0", MASTER_PORT="http"), "MASTER_PORT"),
            ("MASTER_ADDR unresolvable", dict(WORLD_SIZE="2", RANK="1", MASTER_ADDR="no-such-host.invalid",
                                              RLNB_START_TIMEOUT="8"), "MASTER_ADDR")):
        case("hang", f"init_distributed: {what}", lambda t, e=env: _distributed(e), words=words, timeout=45,
             isolated=True, types=(ValueError, TypeError, RuntimeError))  # RankFailedError: a RuntimeError
    case("hang", "WORLD_SIZE 1.5", lambda t: _distributed(dict(WORLD_SIZE="1.5", RANK="0")), words="WORLD_SIZE",
         isolated=True)
    case("hang", "rlnb train with WORLD_SIZE 2 and no peer", lambda t: (os.environ.update(
         WORLD_SIZE="2", RANK="0", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port()), RLNB_START_TIMEOUT="8"),
         cli("train", *QUICK)),
         words="RLNB_START_TIMEOUT", timeout=45, isolated=True, types=(CliRefused, CliFailed))  # exit 1: a rank failed


# --- family "files": every file rlnb reads x corruptions ------------------------------------------------------------
def _corrupt(path: Path, how: str) -> None:
    "Replace (or damage) the file at `path` as `how` says."
    original = path.read_bytes() if path.is_file() and not path.is_symlink() else b""
    if path.is_symlink() or path.is_file(): path.unlink()
    elif path.is_dir(): shutil.rmtree(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    content = {"empty": b"", "truncated": original[:max(1, len(original) // 2)], "NUL bytes": b"\0" * 300,
               "invalid UTF-8": b"\xff\xfe\xfa{\x80", "nested 100,000 deep": b"[" * 100_000 + b"]" * 100_000,
               "an int of 5,000 digits": b"1" * 5000, "1e999": b"1e999", "NaN": b"NaN", "a JSON list": b"[]",
               "a JSON string": b'"x"', "null": b"null", "an object nested 5,000 deep": b'{"a":' * 5000 + b"1" +
               b"}" * 5000}.get(how)
    if content is not None: path.write_bytes(content)
    elif how == "a folder": path.mkdir()
    elif how == "a link to itself": path.symlink_to(path.name)
    elif how == "a safetensors header of 2**60 bytes": path.write_bytes(struct.pack("<Q", 2**60) + b"{}")
    elif how == "a safetensors header nested deep":
        header = b'{"a":' * 5000 + b"1" + b"}" * 5000
        path.write_bytes(struct.pack("<Q", len(header)) + header)
    elif how == "a pickle of a list":
        import torch
        torch.save([1, 2, 3], path)
    else: raise ValueError(how)


_TEXT_CORRUPTIONS = ("empty", "truncated", "NUL bytes", "invalid UTF-8", "nested 100,000 deep",
                     "an int of 5,000 digits", "a JSON list", "an object nested 5,000 deep", "a folder",
                     "a link to itself")
_BINARY_CORRUPTIONS = ("empty", "truncated", "NUL bytes", "a safetensors header of 2**60 bytes",
                       "a safetensors header nested deep", "a folder", "a link to itself")
_PICKLE_CORRUPTIONS = ("empty", "truncated", "NUL bytes", "a pickle of a list", "a folder", "a link to itself")


def _jsonl_line(path: Path, how: str, first: str) -> None:
    "A JSONL file whose first line is `first` and whose second line is corrupted as `how` says."
    _corrupt(path, how)
    if path.is_file() and not path.is_symlink():
        path.write_bytes(first.encode() + b"\n" + path.read_bytes() + b"\n")


def _status_folder(t: Path) -> Path:
    run = t / "run-a"
    run.mkdir()
    (run / "status.json").write_text(json.dumps({"status": "completed", "params": {"seed": 0}, "attempt": 1}))
    (run / "summary.json").write_text(json.dumps({"final_step": 0}))
    return run


def _files_family() -> None:
    from rlnb import checkpoints, experiments, loggers, sweep_results, tasks
    from rlnb.core import rollouts_from_jsonl
    from rlnb.cache import lock_holder
    readers = [  # (what, file under t once set up, setup, call, words, corruptions, expect)
        ("checkpoint_metadata: state.json", "run/checkpoint/state.json", saved_run,
         lambda t: checkpoints.checkpoint_metadata(t / "run" / "checkpoint"), "state.json", _TEXT_CORRUPTIONS),
        ("resume: state.json", "run/checkpoint/state.json", saved_run, lambda t: resume(t / "run"), "state.json",
         _TEXT_CORRUPTIONS),
        ("resume: adapter_model.safetensors", "run/checkpoint/adapter_model.safetensors", saved_run,
         lambda t: resume(t / "run"), "adapter_model.safetensors", _BINARY_CORRUPTIONS),
        ("resume: optimizer.pt", "run/checkpoint/optimizer.pt", saved_run, lambda t: resume(t / "run"),
         "optimizer.pt", _PICKLE_CORRUPTIONS),
        ("resume: rng.pt", "run/checkpoint/rng.pt", saved_run, lambda t: resume(t / "run"), "rng.pt",
         _PICKLE_CORRUPTIONS),
        ("resume: scheduler.pt", "run/checkpoint/scheduler.pt", saved_run, lambda t: resume(t / "run"),
         "scheduler.pt", _PICKLE_CORRUPTIONS),
        ("load_sweep: status.json", "run-a/status.json", _status_folder, lambda t: sweep_results.load_sweep(t),
         "status.json", _TEXT_CORRUPTIONS),
        ("load_sweep: summary.json", "run-a/summary.json", _status_folder, lambda t: sweep_results.load_sweep(t),
         "summary.json", _TEXT_CORRUPTIONS),
        ("run_experiment: status.json", "run-a/status.json", _status_folder, lambda t: experiments.run_experiment(
            small_notebook(t / "nb.ipynb"), {"seed": 0}, t / "run-a", check_params=None), "status.json",
         _TEXT_CORRUPTIONS),
        ("lock_holder: .lock", "run-a/.lock", _status_folder, lambda t: lock_holder(t / "run-a"), ".lock",
         _TEXT_CORRUPTIONS),
        ("run_experiment: the notebook", "nb.ipynb", lambda t: small_notebook(t / "nb.ipynb"),
         lambda t: experiments.run_experiment(t / "nb.ipynb", {"seed": 0}, t / "o", check_params=None), "nb.ipynb",
         _TEXT_CORRUPTIONS),
    ]
    for what, rel, setup, call, words, corruptions in readers:
        for how in corruptions:
            expect = "either" if what.startswith(("lock_holder", "load_sweep")) else "refuse"
            case("files", f"{what} {how}", lambda t, r=rel, s=setup, c=call, h=how: (s(t), _corrupt(t / r, h), c(t)),
                 expect=expect, words=words, timeout=60)
    line_readers = [
        ("load_metrics", "metrics.jsonl", '{"iteration": 1, "step": 1}',
         lambda t: loggers.load_metrics(t / "metrics.jsonl"), "metrics.jsonl", "either"),
        ("drop_metrics_after", "metrics.jsonl", '{"iteration": 1, "step": 1}',
         lambda t: loggers.drop_metrics_after(t / "metrics.jsonl", 0), "metrics.jsonl", "either"),
        ("resume: metrics.jsonl", "run/metrics.jsonl", '{"iteration": 1, "step": 1}',
         lambda t: resume(t / "run"), "metrics.jsonl", "either"),
        ("load_jsonl_dataset", "data.jsonl", '{"question": "1+1=", "answer": "2"}',
         lambda t: tasks.load_jsonl_dataset(t / "data.jsonl"), "data.jsonl", "refuse"),
        ("rollouts_from_jsonl", "r.jsonl", json.dumps({"prompt": "1+1=", "prompt_token_ids": [1],
                                                       "token_ids": [2], "rewards": 1.0}),
         lambda t: rollouts_from_jsonl(t / "r.jsonl"), "r.jsonl", "refuse"),
    ]
    for what, rel, first, call, words, expect in line_readers:
        for how in _TEXT_CORRUPTIONS:
            if how in ("a folder", "a link to itself", "truncated"): continue
            setup = saved_run if rel.startswith("run/") else (lambda t: None)
            case("files", f"{what}: line 2 {how}",
                 lambda t, r=rel, s=setup, c=call, h=how, f=first: (s(t), _jsonl_line(t / r, h, f), c(t)),
                 expect="either" if how == "empty" else expect, words=words, timeout=60)
        for how in ("a folder", "a link to itself"):
            case("files", f"{what}: the file {how}", lambda t, r=rel, c=call, h=how, s=(
                 saved_run if rel.startswith("run/") else (lambda t: None)): (s(t), _corrupt(t / r, h), c(t)),
                 words=words, timeout=60)
    for name in ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"):
        for how in ("empty", "NUL bytes", "nested 100,000 deep", "a folder"):
            load = "load_tokenizer" if name.startswith("tokenizer") else "load_model"
            # a tokenizer rebuilt from the folder's other files is right if it reads text as the tiny model's does
            case("files", f"{load} of a folder whose {name} is {how}", lambda t, n=name, h=how, f=load: (
                 _saved_model(t), _corrupt(t / "m" / n, h), getattr(__import__("rlnb.models", fromlist=["x"]), f)(
                     str(t / "m"))), words="{t}/m", timeout=40, expect="either" if load == "load_tokenizer" else
                 "refuse", check=_same_tokens if load == "load_tokenizer" else None)


def _same_tokens(result, t) -> str | None:
    ids, expected = result[-1].encode("12+34="), tok().encode("12+34=")
    return None if ids == expected else f"the tokenizer reads '12+34=' as {ids}, not {expected}"


def _saved_model(t: Path) -> Path:
    m, tk = _tiny()
    m.save_pretrained(t / "m")
    tk.save_pretrained(t / "m")
    return t / "m"


# --- family "resume": what changed between a run and its resume is applied (and said) or refused, naming it ----------
_RESUME_CHANGES = {  # field -> a changed value that is valid on its own
    "model": None, "dtype": "bfloat16", "teacher": "tiny", "task": "reverse", "task_format": "chat",
    "prompts_per_step": 4, "group_size": 4, "temperature": 0.7, "max_new_tokens": 5, "dynamic_sampling": True,
    "over_sampling_factor": 2.0, "max_sampling_rounds": 2, "overlong_buffer": 1, "algorithm": "rloo",
    "algorithm_options": {"clip_eps": 0.1}, "beta": 0.05, "entropy_coef": 0.01, "entropy_top_fraction": 0.5,
    "entropy_target": 0.5, "entropy_coef_step": 1e-3, "entropy_coef_max": 1e-2, "learning_rate": 1e-5,
    "lr_schedule": "constant", "warmup_steps": 2, "weight_decay": 0.1, "max_grad_norm": 0.5, "updates_per_batch": 2,
    "mixed_precision": "bf16", "rollout_correction": "tis_token", "rollout_correction_cap": 3.0,
    "off_policy_steps": 1, "seed": 1, "lora_r": 8, "generator": "hf_bf16",
}
_RESUME_FREE = {"eval_every": 1, "eval_size": 4, "checkpoint_every": 1, "max_seconds": 600.0, "num_threads": 1,
                "micro_batch_size": 2}  # may change at resume: they change neither the run nor its numbers


def _other_model(t: Path) -> str:
    "The tiny model with other weights, saved as a folder: the same shapes, another base model."
    import torch
    m, tk = model(), tok()
    with torch.no_grad():
        for p in m.parameters(): p.add_(0.01)
    m.save_pretrained(t / "other")
    tk.save_pretrained(t / "other")
    return str(t / "other")


def _lr_applied(state, t) -> str | None:
    lrs = {g.get("initial_lr", g["lr"]) for g in state.optimizer.param_groups}
    return None if lrs == {1e-5} else f"the optimizer's peak learning rate stayed {lrs}"


def _resume_family() -> None:
    for field, value in _RESUME_CHANGES.items():
        if field == "model":
            case("resume", "resume onto another base model of the same shapes", lambda t: resume(
                 saved_run(t), model=_other_model(t)), words="model", timeout=40)
            continue
        check = _lr_applied if field == "learning_rate" else None
        case("resume", f"resume with {field} changed to {value!r}", lambda t, f=field, v=value: resume(
             saved_run(t), **{f: v}), words=field, check=check, timeout=40)
    for field, value in _RESUME_FREE.items():
        case("resume", f"resume with {field} changed to {value!r} (free to change)", lambda t, f=field, v=value:
             resume(saved_run(t), **{f: v}).iteration, expect="accept",
             check=lambda r, t: None if r == 3 else f"iteration {r}", timeout=40)
    case("resume", "resume with the same settings reaches iteration 3", lambda t: resume(saved_run(t)).iteration,
         expect="accept", check=lambda r, t: None if r == 3 else f"iteration {r}", timeout=40)
    case("resume", "resume with num_iterations equal to the checkpoint's", lambda t: resume(
         saved_run(t), num_iterations=2).iteration, expect="accept",
         check=lambda r, t: None if r == 2 else f"iteration {r}", timeout=40)
    case("resume", "resume onto other prompts of the same number", lambda t: _resume_prompts(t, ["7+1=", "3+3="]),
         words="prompts", timeout=40)
    case("resume", "resume onto a DataBuffer of other prompts of the same size", lambda t: _resume_prompts(
         t, ["7+1=", "3+3="], buffer=True), words="prompts", timeout=40)
    for value in (-7, 2.5, 10**30, "3", None, True, [1]):
        case("resume", f"resume with the DataBuffer position drawn={value!r} in state.json",
             lambda t, v=value: _resume_buffer(t, drawn=v), words="DataBuffer", timeout=40)
    for field, value in (("size", 5), ("seed", 99), ("seed", "0")):  # the buffer holds 3 prompts
        case("resume", f"resume with the DataBuffer {field}={value!r} in state.json",
             lambda t, f=field, v=value: _resume_buffer(t, **{f: v}), words="DataBuffer", timeout=40)
    for key, value in (("iteration", -1), ("global_step", -3), ("iteration", True), ("global_step", "2"),
                       ("iteration", 1.5)):
        case("resume", f"resume from a state.json whose {key} is {value!r}", lambda t, k=key, v=value:
             _resume_state(t, **{k: v}), words=key, timeout=40)
    case("resume", "resume from a state.json whose config is another run's (algorithm dpo)", lambda t:
         _resume_config(t, algorithm="dpo"), words="algorithm", timeout=40)
    case("resume", "resume from a state.json without a config", lambda t: _resume_config(t, drop=True),
         expect="either", words="config", timeout=40)
    case("resume", "resume from a state.json whose config has an unknown field", lambda t: _resume_config(
         t, nonsense_field=1), expect="either", words="nonsense_field", timeout=40)
    case("resume", "resume with the checkpoint folder copied from a LoRA r=8 run", lambda t: resume(
         saved_run(t), lora_r=8, algorithm_options=None), words="lora_r", timeout=40)


def _resume_prompts(t: Path, prompts, buffer: bool = False):
    from rlnb.core import create_training_config
    from rlnb.rollouts import DataBuffer
    from rlnb.training import train as train_fn
    out = t / "run"
    base = create_training_config(**{**BASE_RUN, "output_dir": str(out)})
    wrap = DataBuffer if buffer else list
    train_fn(base, prompts=wrap(["1+1=", "2+2="]), reward_fn=lambda r: 0.0, progress=False)
    return train_fn(base._replace(num_iterations=3, resume=True), prompts=wrap(prompts), reward_fn=lambda r: 0.0,
                    progress=False)


def _state_json(run: Path, edit) -> None:
    path = run / "checkpoint" / "state.json"
    meta = json.loads(path.read_text())
    edit(meta)
    path.write_text(json.dumps(meta))


def _resume_buffer(t: Path, **fields):
    from rlnb.rollouts import DataBuffer
    from rlnb.core import create_training_config
    from rlnb.training import train as train_fn
    out = t / "run"
    base = create_training_config(**{**BASE_RUN, "output_dir": str(out)})
    prompts = ["1+1=", "2+2=", "3+1="]
    train_fn(base, prompts=DataBuffer(prompts), reward_fn=lambda r: 0.0, progress=False)
    _state_json(out, lambda m: m["metadata"]["data_buffer"].update(fields))
    return train_fn(base._replace(num_iterations=3, resume=True), prompts=DataBuffer(prompts),
                    reward_fn=lambda r: 0.0, progress=False)


def _resume_state(t: Path, **fields):
    run = saved_run(t)
    _state_json(run, lambda m: m.update(fields))
    return resume(run)


def _resume_config(t: Path, drop: bool = False, **fields):
    run = saved_run(t)
    _state_json(run, lambda m: m["metadata"].pop("config") if drop else m["metadata"]["config"].update(fields))
    return resume(run)


# --- family "errors": raw errors of libraries rlnb calls, named where the input enters ------------------------------
def _errors_family() -> None:
    from rlnb import chat, core, generation, models, rollouts
    from rlnb.core import Conversation, GenerationConfig, Message, ModelConfig, Rollout
    for name in ("SMOLLM2", "Tiny", "gpt2", "org/no-such-model", "hf://tiny", "tiny ", "./tiny", "tiny.gguf",
                 "~nobody/x", "C:\\models\\x"):
        case("errors", f"load_model({name!r}) offline", lambda t, n=name: models.load_model(n), words=repr(name)[1:-1],
             timeout=40)
    for device in ("cuda", "cuda:0", "cuda:7", "mps", "meta", "xla", "cpu:99", "CPU", "cuda:-1", "gpu"):
        case("errors", f"load_model on device {device!r}", lambda t, d=device: models.load_model(
             ModelConfig("tiny", device=d)), words="device", timeout=40,
             expect="either" if device == "cpu:99" else "refuse")
        case("errors", f"train with device {device!r} via ModelConfig in quick start", lambda t, d=device:
             models.load_tokenizer(ModelConfig("tiny", device=d)), expect="either", words="device")
    for dtype in ("float16", "int8", "bf16", "torch.float32", "complex64"):
        case("errors", f"load_model dtype {dtype!r}", lambda t, d=dtype: models.load_model(
             ModelConfig("tiny", device="cpu", dtype=d)),
             expect="refuse" if dtype in ("int8", "complex64") else "either",
             words="dtype")
    for flag in ("use_flash_attention", "load_in_8bit", "load_in_4bit"):
        case("errors", f"load_model {flag}=True on a CPU", lambda t, f=flag: models.load_model(
             ModelConfig("tiny", device="cpu", **{f: True})), words=flag)
    case("errors", "load_model custom_config on a registered name", lambda t: models.load_model(ModelConfig(
         "tiny", device="cpu", custom_config={"n_layer": 1})), words="custom_config")
    for what, setup in (("a file", lambda t: ((t / "f").write_text("x"), str(t / "f"))[1]),
                        ("under a file", lambda t: ((t / "f").write_text("x"), str(t / "f" / "c"))[1]),
                        ("a NUL in it", lambda t: str(t / "a\x00b")), ("blank", lambda t: " "),
                        ("a relative path", lambda t: "rel/cache"), ("a newline in it", lambda t: str(t / "a\nb"))):
        case("errors", f"RLNB_CACHE {what}: the cache folder", lambda t, s=setup: (
             os.environ.__setitem__("RLNB_CACHE", s(t)), __import__("rlnb.cache", fromlist=["x"]).build_atomically(
                 __import__("rlnb.cache", fromlist=["x"]).default_cache_dir() / "x",
                 lambda tmp: (Path(tmp) / "f").write_text("x"), lambda f: (f / "f").is_file())),
             words="RLNB_CACHE", expect="either" if what == "a relative path" else "refuse")
    big = [2**70, -1, 10**6, 1.5, "3"]
    for ids in big:
        case("errors", f"parse_thinking of token id {ids!r}", lambda t, i=ids: chat.parse_thinking([5, i], tok()),
             words="token")
        case("errors", f"a rollout with token id {ids!r} collated and trained", lambda t, i=ids: train(
             iteration_hook=lambda s, b: b._replace(rollouts=[r._replace(token_ids=[*r.token_ids[:-1], i])
                                                              for r in b.rollouts])), words="token")
        case("errors", f"tokenizer.decode via generation of prompt ids {ids!r}", lambda t, i=ids:
             generation.left_pad([[1, i]], 0), expect="either", words="sequences")
    for role in ("robot", "", "USER", None, 5):
        case("errors", f"a message with role {role!r} in a chat template", lambda t, r=role: chat.apply_chat_template(
             [Message(r, "1+1=")], tok()), words="role")
        case("errors", f"a conversation prompt with role {role!r} in train", lambda t, r=role: train(
             prompts=[Conversation((Message(r, "1+1="),)), Conversation((Message("user", "2+2="),))],
             reward_fn=lambda x: 0.0), words="role")
    case("errors", "a message whose content is None", lambda t: chat.apply_chat_template([Message("user", None)],
                                                                                         tok()), words="content")
    case("errors", "a message whose content is 1 MB", lambda t: chat.apply_chat_template(
         [Message("user", "1" * 1_000_000)], tok()), expect="either", words="content")
    from rlnb.multiturn import Environment, EnvStep
    for part in ("step", "reset"):
        for exc in (KeyError("answer"), ZeroDivisionError("x"), RecursionError("deep")):
            def env(part=part, exc=exc):
                def reset(conv, answer):
                    if part == "reset": raise exc
                    return answer
                def step(state, conv):
                    if part == "step": raise exc
                    return EnvStep(True, 0.0, state, {})
                return Environment(step=step, reset=reset, name="hostile")
            case("errors", f"an environment whose {part} raises {type(exc).__name__}",
                 lambda t, e=env: _env_rollout(e()), words=["hostile", part],  # the original's type, chained
                 types=(ValueError, TypeError, RuntimeError, type(exc)))
    case("errors", "generator 'vllm' without vLLM installed", lambda t: train(cfg(generator="vllm")), words="vllm",
         types=(ValueError, TypeError, OSError, ImportError))
    case("errors", "create_vllm_generator without vLLM installed", lambda t: __import__(
         "rlnb.engines", fromlist=["x"]).create_vllm_generator(model(), gpu_memory_utilization=2.0)(
         model(), tok(), ["1+1="], GenerationConfig()), words="gpu_memory_utilization",
         types=(ValueError, TypeError, ImportError))
    case("errors", "num_threads over the machine's cores", lambda t: train(cfg(num_threads=1024)), expect="either",
         words="num_threads")
    case("errors", "prompts of one blank string", lambda t: train(prompts=["   ", "1+1="], reward_fn=lambda r: 0.0),
         words="prompts")
    case("errors", "prompts of 10,000 characters each", lambda t: train(prompts=["1" * 10_000, "2" * 10_000],
                                                                         reward_fn=lambda r: 0.0),
         expect="either", words="prompt", timeout=60)
    case("errors", "a DataBuffer of one prompt, 2 per step", lambda t: train(prompts=["1+1="], reward_fn=lambda r: 0.0),
         expect="either", words="prompts")
    case("errors", "a reward_fn returning a numpy bool", lambda t: train(reward_fn=lambda r: __import__(
         "numpy").bool_(True)).iteration, expect="either", words="reward")
    case("errors", "a reward_fn returning a 0-d tensor", lambda t: train(reward_fn=lambda r: __import__(
         "torch").tensor(1.0)).iteration, expect="accept")
    case("errors", "a Rollout with positive sampler log-probs in rollouts_to_jsonl", lambda t: core.rollouts_to_jsonl(
         [Rollout("p", prompt_token_ids=[1], token_ids=[2], rewards=0.0, logprobs=[0.7])], t / "r.jsonl"),
         words="logprobs")
    case("errors", "a GenerationConfig with max_new_tokens 10**12", lambda t: generation.batch_generate(
         model(), tok(), ["1+1="], GenerationConfig(max_new_tokens=10**12)), words="max_new_tokens")
    case("errors", "a GenerationConfig with stop_strings of 10,000 entries", lambda t: generation.batch_generate(
         model(), tok(), ["1+1="], GenerationConfig(max_new_tokens=2, stop_strings=["x"] * 10_000)), expect="either",
         words="stop_strings", timeout=40)
    case("errors", "create_prompt_loader of an empty list", lambda t: rollouts.create_prompt_loader([], 2),
         words="prompts")


def _env_rollout(env):
    from rlnb.core import GenerationConfig
    from rlnb.multiturn import create_multiturn_rollout
    return create_multiturn_rollout(model(), tok(), ["1+1="], GenerationConfig(max_new_tokens=2), env=env,
                                    answers=["2"])


def all_cases() -> list[Case]:
    "Every case of the pass, in a fixed order (each worker builds the same list)."
    if not CASES:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            for family in (_links_family, _interrupt_family, _hang_family, _degenerate_family, _resume_family,
                           _files_family, _config_family, _cli_family, _errors_family):
                family()
    return CASES




# --- one case, in a worker -------------------------------------------------------------------------------------------
RAW_TYPES = (KeyError, IndexError, AttributeError, RecursionError, OverflowError, ZeroDivisionError, AssertionError,
             NameError, UnboundLocalError)
CLEAR_TYPES = (ValueError, TypeError, OSError, CliRefused)


# the warning of a batch with nothing to learn from names group_size, temperature, dynamic_sampling: it says nothing
# about a case on one of those, unless the case is about batches with nothing to learn from
NO_SIGNAL = "training_step: iteration"


def message_of(e: BaseException) -> str:
    return str(e) + "".join("\n" + n for n in getattr(e, "__notes__", []))


def _snapshot(base: Path) -> dict:
    "Every path under `base` but its work/ folder: kind, size and content hash, or link target."
    seen = {}
    for dirpath, dirnames, filenames in os.walk(base, followlinks=False):
        rel = Path(dirpath).relative_to(base)
        if rel.parts[:1] == ("work",): continue
        for name in dirnames + filenames:
            p = Path(dirpath) / name
            key = str(rel / name)
            if key == "work": continue
            if p.is_symlink(): seen[key] = ("link", os.readlink(p))
            elif p.is_dir(): seen[key] = ("dir",)
            else:
                try: seen[key] = ("file", hashlib.sha256(p.read_bytes()).hexdigest())
                except OSError as e: seen[key] = ("unreadable", str(e))
    return seen


def _sentinel(base: Path) -> None:
    out = base / "outside"
    (out / "sub").mkdir(parents=True)
    (out / "precious.txt").write_text("precious")
    (out / "sub" / "kept.json").write_text('{"kept": true}')


def judge(c: Case, result, error: BaseException | None, said: list[str], t: Path) -> tuple[str, str]:
    "(outcome, message) of a case that answered."
    c = c._replace(words=tuple(w.replace("{t}", str(t)) for w in c.words))
    if error is not None:
        msg = f"{type(error).__name__}: {message_of(error)}"
        if c.expect == "accept": return "raw", "a good input refused: " + msg
        types = c.types or CLEAR_TYPES
        # a case that names its types accepts them (e.g. an environment's own error, chained under rlnb's message)
        explicit = bool(c.types) or not isinstance(error, RAW_TYPES)
        if isinstance(error, types) and explicit and all(w in msg for w in c.words):
            return "clear", msg
        return "raw", msg
    last = result[-1] if isinstance(result, tuple) and result else result  # (setup, ..., the call's result)
    if getattr(last, "status", None) == "failed" and isinstance(getattr(last, "error", None), str):
        if c.expect == "accept": return "raw", "a good input failed the run: " + last.error
        return ("clear" if all(w in last.error for w in c.words) else "raw"), "the run failed: " + last.error
    problem = None
    if c.check is not None:
        try: problem = c.check(result, t)
        except Exception as e: problem = f"the check failed: {type(e).__name__}: {e}"
    if c.expect == "refuse":
        warned = next((s for s in said if c.words and all(w in s for w in c.words)), None)
        if warned is not None: return "clear", "warned: " + warned
        return "silent", problem or f"accepted without a word (returned {_short(result)})"
    if problem: return "silent", problem
    return "correct", _short(result)


def _short(value) -> str:
    try: text = repr(value)
    except Exception: text = type(value).__name__
    return text[:200]


def run_case(c: Case, base: Path) -> dict:
    "Run one case in this process: its outcome, message and time."
    shutil.rmtree(base, ignore_errors=True)
    t = base / "work"
    t.mkdir(parents=True)
    _sentinel(base)
    _SNAPSHOT["before"] = _snapshot(base)
    env, cwd = dict(os.environ), os.getcwd()
    handlers = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    os.chdir(t)
    out, err = io.StringIO(), io.StringIO()
    result, error, t0 = None, None, time.perf_counter()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err): result = c.fn(t)
        except BaseException as e: error = e  # KeyboardInterrupt and SystemExit too: the case's answer
        finally:
            os.chdir(cwd)
            os.environ.clear()
            os.environ.update(env)
            for number, handler in handlers.items(): signal.signal(number, handler)
    said = [str(w.message) for w in caught
            if not str(w.message).startswith(NO_SIGNAL) or "trains on nothing" in c.words]
    said += [out.getvalue(), err.getvalue()]
    outcome, message = judge(c, result, error, said, t)
    after, before = _snapshot(base), _SNAPSHOT["before"]
    if after != before:
        changed = sorted(k for k in set(before) | set(after) if before.get(k) != after.get(k))
        outcome, message = "lost", f"outside the case's folder, changed: {', '.join(changed[:5])}; {message}"
    return dict(outcome=outcome, message=message, seconds=round(time.perf_counter() - t0, 2))


def _worker(conn, root: str) -> None:
    "Run the cases the parent sends (their numbers), one at a time, answering each with its outcome."
    os.setsid()  # its own process group: a hang is killed with everything it started
    import resource
    limit = 24 * 2**30  # an allocation a huge header asks for fails, instead of taking the machine's memory
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    noise = os.open(os.path.join(root, f"worker-{os.getpid()}.log"), os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    os.dup2(noise, 1)  # what C code prints (torch's c10d, gloo) goes to a log, not the report
    os.dup2(noise, 2)
    import torch
    torch.set_num_threads(1)
    cases = all_cases()
    base = Path(root) / f"case-{os.getpid()}"
    conn.send("ready")  # a case's time starts now, not while rlnb imports
    while True:
        try: index = conn.recv()
        except EOFError: return
        c = cases[index]
        try: answer = run_case(c, base)
        except BaseException as e:  # the harness itself failed on this case: say so, as a crash
            answer = dict(outcome="crash", message=f"harness: {type(e).__name__}: {e}", seconds=0)
        conn.send(answer)
        if c.isolated: return


# --- the pool -------------------------------------------------------------------------------------------------------
def _environment(root: Path) -> dict:
    "Where a case may write: everything under `root`; no network."
    home = root / "home"
    home.mkdir(parents=True, exist_ok=True)
    (root / "tmp").mkdir(exist_ok=True)
    return dict(HOME=str(home), TMPDIR=str(root / "tmp"), RLNB_CACHE=str(root / "cache"), HOSTILE_ROOT=str(root),
                MPLCONFIGDIR=str(root / "mpl"), HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", HF_HOME=str(home / "hf"),
                OMP_NUM_THREADS="1", RLNB_NUM_THREADS="1", MPLBACKEND="Agg", PYTHONWARNINGS="ignore",
                JUPYTER_PLATFORM_DIRS="1", TOKENIZERS_PARALLELISM="false",
                PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))


class _Slot:
    "One worker process and the case it runs."
    def __init__(self, ctx, root: Path):
        parent, child = ctx.Pipe()
        self.process = ctx.Process(target=_worker, args=(child, str(root)), daemon=True)
        self.process.start()
        child.close()
        self.conn, self.index, self.deadline, self.ready = parent, None, None, False

    def kill(self) -> None:
        with contextlib.suppress(OSError): os.killpg(self.process.pid, signal.SIGKILL)
        self.process.join(5)


def run_pass(indexes: list[int], workers: int, root: Path, log=print) -> dict[int, dict]:
    "Run the cases `indexes` on `workers` processes: {index: answer}."
    import multiprocessing
    from multiprocessing.connection import wait
    ctx = multiprocessing.get_context("spawn")
    os.environ.update(_environment(root))
    cases, todo, results = all_cases(), list(reversed(indexes)), {}
    slots = [_Slot(ctx, root) for _ in range(min(workers, len(indexes)))]
    started, t0 = {}, time.time()
    try:
        while todo or any(s.index is not None for s in slots):
            for k, s in enumerate(slots):
                if s.index is None and todo and s.ready:
                    s.index = todo.pop()
                    s.deadline = time.time() + cases[s.index].timeout
                    started[s.index] = time.time()
                    s.conn.send(s.index)
            ready = wait([s.conn for s in slots] + [s.process.sentinel for s in slots], timeout=1.0)
            for k, s in enumerate(slots):
                if not s.ready:  # a fresh worker says when it has imported rlnb and built the cases
                    if s.conn in ready: s.ready = s.conn.recv() == "ready"
                    elif not s.process.is_alive(): raise RuntimeError("a worker died before its first case")
                    continue
                if s.index is None: continue
                c, answer = cases[s.index], None
                if s.conn in ready:
                    try: answer = s.conn.recv()
                    except (EOFError, OSError): answer = None
                if answer is None and (s.process.sentinel in ready or not s.process.is_alive()):
                    answer = dict(outcome="crash", message=f"the worker died (exit code {s.process.exitcode})",
                                  seconds=round(time.time() - started[s.index], 1))
                elif answer is None and time.time() > s.deadline:
                    answer = dict(outcome="hang", message=f"no answer in {c.timeout:.0f} s",
                                  seconds=round(time.time() - started[s.index], 1))
                if answer is None: continue
                results[s.index] = answer
                log(f"[{len(results):>4}/{len(indexes)} {time.time() - t0:6.0f}s] {answer['outcome']:<7} "
                    f"{c.family}: {c.description} ({answer['seconds']} s)")
                if answer["outcome"] in ("hang", "crash") or c.isolated:
                    s.kill()
                    slots[k] = _Slot(ctx, root) if todo else s
                s.index = None
    finally:  # however the pass ends (Ctrl-C too), no worker outlives it
        for s in slots:
            s.conn.close()
            s.kill()
    return results


# --- the report ------------------------------------------------------------------------------------------------------
def report(cases: list[Case], results: dict[int, dict]) -> str:
    "Counts per family x outcome, the total, the raw share, and every case neither correct nor clear."
    families = list(dict.fromkeys(cases[i].family for i in sorted(results)))
    counts = {f: Counter() for f in families}
    for i, r in results.items(): counts[cases[i].family][r["outcome"]] += 1
    total = sum((counts[f] for f in families), Counter())
    width = max(len(f) for f in families + ["total"])
    lines = [f"{'family':<{width}} " + " ".join(f"{o:>7}" for o in OUTCOMES) + "   cases"]
    for f in families + ["total"]:
        row = total if f == "total" else counts[f]
        lines.append(f"{f:<{width}} " + " ".join(f"{row[o]:>7}" for o in OUTCOMES) + f"   {sum(row.values()):>5}")
    n = sum(total.values())
    lines.append(f"\n{n} cases: raw errors {total['raw']} ({100 * total['raw'] / max(n, 1):.1f}%), "
                 f"silent {total['silent']}, lost {total['lost']}, hangs {total['hang']}, crashes {total['crash']}")
    bad = [(cases[i], r) for i, r in sorted(results.items()) if r["outcome"] not in ("correct", "clear")]
    if bad: lines.append("\nneither correct nor clear:")
    for f in families:
        for c, r in bad:
            if c.family == f:
                first = (r["message"].strip().splitlines() or [""])[0][:160]
                lines.append(f"  {f} | {c.description} | {r['outcome']} | {first}")
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--family", action="append", help="run only this family (may be given several times)")
    p.add_argument("--match", help="run only cases whose description contains this text")
    p.add_argument("--limit", type=int, help="run at most this many cases (per family with --family)")
    p.add_argument("--workers", type=int, default=2, help="worker processes (default 2)")
    p.add_argument("--json", help="also write every case's outcome to this JSON file")
    p.add_argument("--list", action="store_true", help="list the families and their case counts, and exit")
    p.add_argument("--quiet", action="store_true", help="no line per case")
    args = p.parse_args(argv)
    cases = all_cases()
    if args.list:
        for f, n in Counter(c.family for c in cases).items(): print(f"{f:<12} {n:>5}")
        print(f"{'total':<12} {len(cases):>5}")
        return 0
    known = sorted({c.family for c in cases})
    unknown = [f for f in args.family or [] if f not in known]
    if unknown: p.error(f"--family {unknown[0]!r}: known families are {', '.join(known)}")
    chosen = [i for i, c in enumerate(cases) if (not args.family or c.family in args.family)
              and (not args.match or args.match in c.description)]
    if args.limit is not None:
        per = Counter()
        chosen = [i for i in chosen if (per.update([cases[i].family]) or per[cases[i].family]) <= args.limit] \
            if args.family else chosen[:args.limit]
    root = Path(tempfile.mkdtemp(prefix="rlnb-hostile-"))
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # a `kill` cleans up too
    t0 = time.time()
    try:
        results = run_pass(chosen, args.workers, root, log=(lambda s: None) if args.quiet else
                           (lambda s: print(s, flush=True)))
    finally: shutil.rmtree(root, ignore_errors=True)
    text = report(cases, results)
    print(f"\nhostile pass: {len(results)} cases in {time.time() - t0:.0f} s with {args.workers} workers\n")
    print(text)
    if args.json:
        Path(args.json).write_text(json.dumps([dict(family=cases[i].family, description=cases[i].description,
                                                    **results[i]) for i in sorted(results)], indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
