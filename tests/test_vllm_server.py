"""rlnb.vllm_server with a real `vllm` server process: the script starts one, the trainer (another process) samples
from it through HTTP, and the server's log-probs equal the trainer's after every move of the weights (a LoRA adapter
hot-loaded, or every weight reloaded). Runs in .venv-vllm; skipped where vLLM is not installed (rlnb's .venv)."""
import importlib.util, json, os, signal, socket, subprocess, sys, time
from pathlib import Path

import pytest
import torch

from rlnb.core import create_training_config, set_seed
from rlnb.mismatch import mismatch_metrics, sample_and_score
from rlnb.models import apply_lora
from rlnb.tiny import load_tiny_model
from rlnb.training import train
from rlnb.vllm_server import (call_server, create_server_generator, free_port, start_vllm_server)

ROOT = Path(__file__).resolve().parents[1]
HAS_VLLM = importlib.util.find_spec("vllm") is not None
pytestmark = pytest.mark.skipif(not HAS_VLLM, reason="vLLM is not installed here (`bash scripts/install.sh vllm` "
                                "makes .venv-vllm, where these tests run)")
PROMPTS = ["12+34=", "5+77=", "60+9="]


def gaps_after_moves(model, tok, generator, change, rounds=3) -> list[float]:
    "Each round: change the weights `change` picks, sample through the server, score with the trainer: the worst gap."
    torch.manual_seed(0)
    gaps = []
    for _ in range(rounds):
        with torch.no_grad():
            for name, p in model.named_parameters():
                if change(name): p.add_(0.02 * torch.randn_like(p))
        batch, trainer = sample_and_score(model, tok, PROMPTS, generator, n=8, max_new_tokens=6)
        gaps.append(mismatch_metrics(trainer, batch.rollout_logprobs, batch.completion_mask)
                    ["mismatch/logprob_abs_diff_max"])
    return gaps


def test_a_full_weight_policy_moves_to_the_server_every_call():
    "lora_r=0: every weight reloaded from a folder (/collective_rpc); a lost move would show as a gap after round 1."
    torch.set_num_threads(1)
    model, tok = load_tiny_model()
    with start_vllm_server(model, tok) as server:
        generator = create_server_generator(server.url)
        assert max(gaps_after_moves(model, tok, generator, lambda name: True)) < 1e-4
        assert [t.keys() >= {"sync_s", "generate_s"} for t in generator.timings] == [True] * 3
        stale = create_server_generator(server.url)
        stale.sync = lambda model: "base"  # never moves the weights: the server keeps the last ones it got
        assert max(gaps_after_moves(model, tok, stale, lambda name: True)) > 1e-2


def _serve(tmp_path, *args):
    "scripts/vllm_server.py in a process of its own, and its URL once it prints that it is serving."
    log = open(tmp_path / "server.out", "w")
    process = subprocess.Popen([sys.executable, str(ROOT / "scripts" / "vllm_server.py"), *args], stdout=log,
                               stderr=subprocess.STDOUT, cwd=tmp_path, start_new_session=True)
    deadline = time.time() + 600
    while time.time() < deadline and process.poll() is None:
        said = (tmp_path / "server.out").read_text()
        if "serving http" in said: return process, said.split("serving ")[1].split()[0]
        time.sleep(1)
    _stop(process)
    raise AssertionError("scripts/vllm_server.py did not start:\n" + (tmp_path / "server.out").read_text()[-3000:])


def _stop(process):
    "SIGTERM to the script, which stops the server it started (in a session of its own) on its way out."
    if process.poll() is None:
        os.killpg(process.pid, signal.SIGTERM)
        try: process.wait(60)
        except subprocess.TimeoutExpired: os.killpg(process.pid, signal.SIGKILL)


def test_the_script_serves_a_lora_policy_to_train_and_to_the_rlnb_command(tmp_path):
    "The chapter's two commands: the script serves; `train` here and `rlnb train` in another process sample from it."
    process, url = _serve(tmp_path, "--model", "tiny", "--lora-r", "8", "--port", str(free_port()))
    try:
        served = call_server(url, "/v1/models")["data"]
        assert [m["id"] for m in served] == ["base"]
        config = create_training_config(generator="vllm_server", generator_url=url, num_iterations=3, eval_every=0,
                                        prompts_per_step=4, group_size=4, seed=0, rollout_correction="tis_token")
        set_seed(0)
        history = train(config, progress=False).stats_history
        assert len(history) == 3
        assert max(s.custom_metrics["mismatch/logprob_abs_diff_max"] for s in history) < 1e-4
        assert all(s.custom_metrics["mismatch/kl"] < 1e-6 for s in history)
        # the correction reads the server's log-probs as it reads the engine's: weights of 1 where they agree
        assert all(abs(s.custom_metrics["mismatch/weight_mean"] - 1) < 1e-4 for s in history)
        # sampling ahead from the server: each queued batch from a frozen copy of the adapter, as old as it says
        ahead = []  # the logged rows: the loop adds the staleness and the timings to what the step measured
        train(config._replace(off_policy_steps=2, num_iterations=4), progress=False,
              logger=lambda s, st: ahead.append(st.custom_metrics))
        assert [row["off_policy/staleness"] for row in ahead] == [0.0, 1.0, 2.0, 2.0]
        assert ahead[0]["mismatch/logprob_abs_diff_max"] < 1e-4  # the first: on-policy
        assert all(row["mismatch/kl"] > 0 for row in ahead[1:])  # then behind, and measured
        run = subprocess.run([sys.executable, "-m", "rlnb.cli", "train", "-p", "generator", "vllm_server",
                              "-p", "generator_url", url, "-p", "num_iterations", "2", "-p", "eval_every", "0",
                              "-p", "output_dir", str(tmp_path / "run")], capture_output=True, text=True, timeout=600,
                             env={**os.environ, "OMP_NUM_THREADS": "1", "RLNB_NUM_THREADS": "1"})
        assert run.returncode == 0, run.stderr[-3000:]
        rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
        steps = [r for r in rows if "mismatch/logprob_abs_diff_max" in r]
        assert len(steps) == 2 and all(r["mismatch/logprob_abs_diff_max"] < 1e-4 for r in steps)
        adapters = [m["id"] for m in call_server(url, "/v1/models")["data"]]
        assert adapters == ["base", "policy"]  # the trainers' adapter, loaded under one name
    finally:
        _stop(process)


def test_a_lora_policy_on_a_server_without_lora_gets_the_servers_reason():
    "A LoRA policy against a server started for full weights: the load is refused with the server's own words."
    torch.set_num_threads(1)
    model, tok = load_tiny_model()
    with start_vllm_server(model, tok) as server:
        policy = apply_lora(load_tiny_model()[0], r=8)
        with pytest.raises(RuntimeError, match="/v1/load_lora_adapter answered"):
            create_server_generator(server.url)(policy, tok, PROMPTS)


def test_a_server_that_cannot_start_is_reported_with_its_log():
    "A server option vLLM refuses: the process exits, and the error quotes vLLM's reason from its log."
    model, tok = load_tiny_model()
    with pytest.raises(RuntimeError, match=r"(?s)exited with code .*max.num.seqs"):
        start_vllm_server(model, tok, max_num_seqs=-1, timeout=120)


def test_a_port_in_use_is_refused_before_anything_starts():
    "A server left on the port would answer /health for the new one: refused, naming the port."
    model, tok = load_tiny_model()
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(ValueError, match=f"port {port} on 127.0.0.1 is in use"):
            start_vllm_server(model, tok, port=port)
