"""Serve a model with vLLM for rlnb's `generator="vllm_server"`, then wait (Ctrl-C stops it).

    .venv-vllm/bin/python scripts/vllm_server.py --model tiny --lora-r 8 --port 8000
    .venv/bin/rlnb train -p generator vllm_server -p generator_url http://127.0.0.1:8000    # in another terminal

--model, --task and --lora-r name the base model as TrainingConfig does, so the trainer's policy fits the server:
the same base weights, and a LoRA rank the server holds (--lora-r 0: a policy that trains every weight). Prints
"serving <url>" once the server answers. Chapter *A generation server* (nbs/70a_vllm_server.ipynb) explains it."""
import argparse, signal, sys

from rlnb.core import create_training_config
from rlnb.training import build_policy
from rlnb.vllm_server import start_vllm_server


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="tiny", help="as TrainingConfig.model: tiny, smollm2, a hub id, a folder")
    ap.add_argument("--task", default="addition", help="the tiny model's task (as TrainingConfig.task)")
    ap.add_argument("--lora-r", type=int, default=8, help="the trainer's LoRA rank (0: it trains every weight)")
    ap.add_argument("--port", type=int, default=8000)
    ap.add_argument("--host", default="127.0.0.1", help="0.0.0.0 serves other machines (a trusted network only)")
    ap.add_argument("--dtype", default="float32", help="the served precision: float32 or bfloat16")
    args = ap.parse_args(argv)
    config = create_training_config(model=args.model, task=args.task, lora_r=args.lora_r, dtype="float32")
    policy, tokenizer = build_policy(config)
    server = start_vllm_server(policy, tokenizer, port=args.port, host=args.host, dtype=args.dtype)
    print(f"serving {server.url} (log: {server.log})", flush=True)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))  # a SIGTERM stops the server too, through `finally`
    try:
        return server.process.wait()
    except KeyboardInterrupt:
        return 0
    finally:
        server.stop()


if __name__ == "__main__":
    sys.exit(main())
