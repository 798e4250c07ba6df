"""The loop's seams: it imports no algorithm module, every part of a step that is not the algorithm's enters through a
StepExtension, several processes enter through one object with the single-process seam's functions, and the
package's modules import each other without cycles."""
import ast
import inspect
from pathlib import Path

import pytest
import torch

import rlnb
from rlnb import distributed
from rlnb.algorithms import (STEP_EXTENSIONS, StepExtension, get_algorithm_config, register_step_extension,
                             step_extensions)
from rlnb.core import TrainingConfig
from rlnb.step import OneProcess
from rlnb.training import train

torch.set_num_threads(1)
PACKAGE = Path(rlnb.__file__).parent
ALGORITHM_MODULES = {"ppo", "dpo", "distillation", "baselines", "entropy", "policy_losses", "passk", "catalogue"}
SMALL = dict(num_iterations=2, prompts_per_step=2, group_size=4, max_new_tokens=6, eval_every=0, seed=0, lora_r=0)


def imported_modules(path: Path) -> set[str]:
    "The rlnb modules a file imports, at its top or inside a function (by `import` statements, not by name)."
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.level == 1 and node.module:
            found.add(node.module.split(".")[0])
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("rlnb."):
            found.add(node.module.split(".")[1])
        elif isinstance(node, ast.ImportFrom) and node.module == "rlnb":
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.Import):
            found |= {a.name.split(".")[1] for a in node.names if a.name.startswith("rlnb.")}
    return found


def test_the_loop_imports_no_algorithm_module():
    for module in ("step", "training", "train_checks", "resume"):
        assert imported_modules(PACKAGE / f"{module}.py") & ALGORITHM_MODULES == set(), module


def import_cycles() -> list[set[str]]:
    "Each set of modules that import each other, directly or through others (strongly connected, more than one)."
    modules = {p.stem for p in PACKAGE.glob("*.py") if p.stem != "_modidx"}
    edges = {m: imported_modules(PACKAGE / f"{m}.py") & modules - {m} for m in modules}
    reach = {m: set() for m in modules}
    for m in modules:  # every module each one reaches
        todo = list(edges[m])
        while todo:
            n = todo.pop()
            if n not in reach[m]:
                reach[m].add(n)
                todo.extend(edges[n])
    cycles = {frozenset({m} | {n for n in reach[m] if m in reach[n]}) for m in modules if m in reach[m]}
    return [set(c) for c in cycles]


def test_no_import_cycle():
    assert import_cycles() == []


def test_several_processes_have_every_function_of_the_one_process_seam():
    for name, method in inspect.getmembers(OneProcess, inspect.isfunction):
        if name.startswith("_"): continue
        ours = [p for p in inspect.signature(method).parameters if p != "self"]
        inspect.signature(getattr(distributed, name)).bind(*ours)  # callable with the same arguments


@pytest.fixture
def recorder():
    "A user's extension: it logs the share of counted tokens in each micro-batch and counts the steps it finished."
    finished = []

    def term(batch, logprobs, entropy, config, algorithm_config):
        assert entropy.shape == logprobs.shape and logprobs.requires_grad
        return logprobs.new_zeros(()), {"test/counted": float(batch.loss_mask.sum())}

    def finish(state, config, metrics):
        finished.append(metrics["test/counted"])
        return state

    register_step_extension("recorder", StepExtension(loss_term=term, finish=finish))
    yield finished
    del STEP_EXTENSIONS["recorder"]


def test_a_registered_extension_runs_in_every_step(recorder):
    state = train(TrainingConfig(micro_batch_size=4, **SMALL), progress=False)
    assert len(recorder) == 2  # once per step, after it, with the step's record (micro-batches weighted)
    assert [s.custom_metrics["test/counted"] for s in state.stats_history] == pytest.approx(recorder)
    assert min(recorder) > 0


def test_an_extensions_bad_term_is_named():
    bad = StepExtension(loss_term=lambda batch, logprobs, entropy, config, algorithm_config: 0.5)
    register_step_extension("bad", bad)
    try:
        with pytest.raises(TypeError, match="a step extension's loss_term returned a float"):
            train(TrainingConfig(**SMALL), progress=False)
    finally:
        del STEP_EXTENSIONS["bad"]


def test_a_schedule_that_reaches_opd_later_needs_its_teacher():
    schedule = lambda iteration: get_algorithm_config(iteration, {0: "grpo", 1: "opd"})
    with pytest.raises(ValueError, match="algorithm 'opd' learns from a teacher"):
        train(TrainingConfig(**SMALL), algorithm_config=schedule, progress=False)


def test_an_extension_that_narrows_the_mask_sends_the_correction_to_the_whole_batch():
    from rlnb.step import _corrects_in_update
    tis = TrainingConfig(rollout_correction="tis_token")
    assert _corrects_in_update(tis, [])  # the update's own pass weighs the tokens
    narrowing = StepExtension(narrows_loss_mask=lambda config: True)
    assert not _corrects_in_update(tis, [narrowing])  # rescored first: the mask changes the micro-batches' shares
    assert not _corrects_in_update(tis._replace(entropy_top_fraction=0.5), step_extensions())  # the entropy mask


def test_an_extensions_prepare_runs_without_gradient():
    seen = []
    def prepare(state, batch, config, spec):
        seen.append(torch.is_grad_enabled())
        return batch, config, {}
    register_step_extension("probe", StepExtension(prepare=prepare))
    try: train(TrainingConfig(**{**SMALL, "num_iterations": 1}), progress=False)
    finally: del STEP_EXTENSIONS["probe"]
    assert seen == [False]


def test_a_stopped_step_leaves_no_gradient_behind():
    "A notebook's Stop between backward and the optimizer step: the next step starts from no gradient."
    from rlnb.step import create_training_state, training_step
    from rlnb.rollouts import create_batch_rollouts
    from rlnb.tasks import get_task
    from rlnb.tiny import load_tiny_model
    from rlnb.core import GenerationConfig, set_seed
    from rlnb.algorithms import create_algorithm_config
    set_seed(0)
    model, tok = load_tiny_model(progress=False)
    task = get_task("addition")
    batch = create_batch_rollouts(model, tok, task.sample(2, seed=0), GenerationConfig(max_new_tokens=6,
                                  num_return_sequences=4), reward_fn=task.reward_fn)
    state = create_training_state(model, TrainingConfig(lora_r=0), reference=False)
    def stopped(state, max_grad_norm): raise KeyboardInterrupt
    with pytest.raises(KeyboardInterrupt):
        training_step(state, batch, create_algorithm_config("grpo"), tokenizer=tok, optimizer_step_fn=stopped)
    assert all(p.grad is None for p in model.parameters())
