"Real trackers behind the logger interface: W&B offline and TensorBoard, each read back from the files it wrote."
import functools, math

import pytest

from rlnb.core import TrainingConfig, TrainingState, TrainingStats, create_training_config
from rlnb.loggers import (_wandb_records, create_jsonl_logger, create_tensorboard_logger, load_metrics,
                          load_wandb_metrics, log_to_wandb)
from rlnb.training import train

wandb = pytest.importorskip("wandb")  # a dev dependency: installed wherever the tests run
pytest.importorskip("tensorboard")


@pytest.fixture
def offline(monkeypatch, tmp_path):
    "W&B in offline mode, quiet, writing under tmp_path; the run is finished afterwards whatever happens."
    for k, v in {"WANDB_MODE": "offline", "WANDB_SILENT": "true", "WANDB_DIR": str(tmp_path)}.items():
        monkeypatch.setenv(k, v)
    yield functools.partial(log_to_wandb, project="rlnb-test", dir=str(tmp_path))
    if wandb.run is not None: wandb.finish()


def step(iteration, **metrics):
    "The (state, stats) pair train would log after `iteration` iterations."
    return TrainingState(iteration, iteration, None, None), TrainingStats(0.0, 1.0, 1e-3, 0.0, 0.0, 0.0, metrics)


@pytest.mark.slow
def test_log_to_wandb_writes_each_metric_at_its_step(offline, tmp_path):
    offline(*step(0, **{"eval/accuracy": 0.25}))
    for it in range(1, 6):
        offline(*step(it, **{"reward/mean": it / 10, "kl/mean": it / 1000, "algorithm": "grpo", "ok": True}))
    offline(*step(5, **{"eval/accuracy": 0.5}))  # an evaluation after the last step joins its row
    wandb.finish()
    runs = list((tmp_path / "wandb").glob("offline-run-*"))
    assert len(runs) == 1, runs
    df = load_wandb_metrics(runs[0])  # waits for the writer's `exit` record: wandb.finish() may return before it
    records = list(_wandb_records(next(runs[0].glob("run-*.wandb"))))
    assert any(r.WhichOneof("record_type") == "exit" for r in records)
    run_records = [r.run for r in records if r.WhichOneof("record_type") == "run"]
    assert run_records and run_records[0].project == "rlnb-test"
    assert df["step"].tolist() == [0, 1, 2, 3, 4, 5]
    assert df["reward/mean"].tolist()[1:] == [0.1, 0.2, 0.3, 0.4, 0.5] and math.isnan(df["reward/mean"][0])
    assert df["kl/mean"].tolist()[1:] == [0.001, 0.002, 0.003, 0.004, 0.005]
    assert df["eval/accuracy"][0] == 0.25 and df["eval/accuracy"][5] == 0.5
    assert df["iteration"].tolist() == [0, 1, 2, 3, 4, 5]
    assert "algorithm" not in df.columns  # strings are not logged as metrics


def test_load_wandb_metrics_reads_records_across_blocks(offline, tmp_path):
    "A run longer than one 32 KiB block of the .wandb log: records split across blocks are joined again."
    metrics = {f"metric/{k}": k for k in range(12)}
    for it in range(1, 401): offline(*step(it, **{**metrics, "reward/mean": it / 400}))
    wandb.finish()
    df = load_wandb_metrics(tmp_path)  # the wandb dir's parent: one run is found (latest-run is the same file)
    file = next((tmp_path / "wandb").glob("offline-run-*/run-*.wandb"))
    assert file.stat().st_size > 3 * 32768
    assert df["step"].tolist() == list(range(1, 401))
    assert df["reward/mean"].tolist() == [it / 400 for it in range(1, 401)]
    assert (df["metric/11"] == 11).all()


def test_load_wandb_metrics_refuses_what_is_not_one_run(tmp_path):
    (tmp_path / "run-x.wandb").write_text('{"step": 1}\n')
    with pytest.raises(ValueError, match="not a W&B run file"): load_wandb_metrics(tmp_path / "run-x.wandb")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="found 0"): load_wandb_metrics(tmp_path / "empty")


def scalars(log_dir):
    "tag -> [(step, value)] read back with TensorBoard's own reader."
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    events = EventAccumulator(str(log_dir))
    events.Reload()
    return {tag: [(e.step, e.value) for e in events.Scalars(tag)] for tag in events.Tags()["scalars"]}, events


def test_tensorboard_logger_writes_numbers_and_flushes_at_the_end():
    calls = []
    class Writer:  # records what a SummaryWriter would be asked to do
        def add_scalar(self, tag, value, step): calls.append(("scalar", tag, value, step))
        def add_text(self, tag, text, step): calls.append(("text", tag, text, step))
        def flush(self): calls.append(("flush",))
    log = create_tensorboard_logger("unused", writer=Writer())
    config = TrainingConfig(num_iterations=2)
    for it in (1, 2):
        state, stats = step(it, **{"reward/mean": 0.5, "algorithm": "grpo", "skipped": False})
        log(state._replace(metadata={"config": config}), stats)
    assert [c for c in calls if c[0] == "flush"] == [("flush",)] and calls[-1] == ("flush",)  # once, at the end
    scalars_written = [c[1:] for c in calls if c[0] == "scalar"]  # numbers only: no string, no bool
    assert scalars_written == [("iteration", 1, 1), ("reward/mean", 0.5, 1),
                               ("iteration", 2, 2), ("reward/mean", 0.5, 2)]
    texts = [c for c in calls if c[0] == "text"]
    assert len(texts) == 1 and "num_iterations = 2" in texts[0][2]


def test_wandb_and_tensorboard_in_a_real_run(offline, tmp_path):
    config = create_training_config(num_iterations=3, prompts_per_step=2, group_size=4, eval_every=3, eval_size=8)
    jsonl = create_jsonl_logger(tmp_path / "metrics.jsonl")
    tb = create_tensorboard_logger(tmp_path / "tb")
    train(config, logger=[offline, tb, jsonl], progress=False)
    wandb.finish()
    expected = load_metrics(jsonl.path)
    steps, evals = expected.dropna(subset=["reward/mean"]), expected.dropna(subset=["eval/accuracy"])
    assert len(steps) == 3 and evals["step"].tolist() == [0, 3]

    kls = expected.dropna(subset=["kl/mean"])  # beta 0: the KL is measured every eval_every iterations, from the first
    assert len(kls) == 1
    wb = load_wandb_metrics(tmp_path / "wandb").set_index("step")
    for key in ("reward/mean", "loss/total", "grad_norm", "time/step_s"):
        assert wb.loc[steps["step"], key].tolist() == steps[key].tolist(), key
    for key, rows in (("eval/accuracy", evals), ("kl/mean", kls)):  # logged on some steps only
        assert wb.loc[rows["step"], key].tolist() == rows[key].tolist(), key

    tags, events = scalars(tmp_path / "tb")  # flushed at the last iteration, without closing the writer
    for key, rows in (("reward/mean", steps), ("loss/total", steps), ("kl/mean", kls)):
        assert [s for s, _ in tags[key]] == rows["step"].tolist()
        assert [v for _, v in tags[key]] == pytest.approx(rows[key].tolist(), rel=1e-6, abs=1e-7)
    assert [s for s, _ in tags["eval/accuracy"]] == [0, 3]
    text = events.Tensors("config/text_summary")[0].tensor_proto.string_val[0].decode()
    assert "num_iterations = 3" in text and "eval_size = 8" in text
    tb.writer.close()


def test_load_wandb_metrics_leaves_out_a_half_written_last_record(offline, tmp_path):
    "The writer is another process: a file cut anywhere reads as the records before the cut, never as corrupt."
    for it in range(1, 6): offline(*step(it, **{"reward/mean": it / 10}))
    wandb.finish()
    full = load_wandb_metrics(tmp_path)["reward/mean"].tolist()
    assert full == [0.1, 0.2, 0.3, 0.4, 0.5]
    data = next((tmp_path / "wandb").glob("offline-run-*/run-*.wandb")).read_bytes()
    cut = tmp_path / "cut" / "run-cut.wandb"
    cut.parent.mkdir()
    for end in range(len(data) - 1500, len(data), 7):  # through the last history rows, the summary and the exit record
        cut.write_bytes(data[:end])
        rows = load_wandb_metrics(cut, wait_s=0)
        got = rows["reward/mean"].tolist() if len(rows) else []
        assert got == full[:len(got)], (end, got)
