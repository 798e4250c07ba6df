"Several nodes rehearsed on one machine: two torchrun launchers meet through a c10d rendezvous on localhost (gloo)."
import json, os, signal, subprocess, sys, time
from pathlib import Path

import pytest
import torch

from test_distributed import assert_same_update, free_port, one_update, policy_and_rollouts

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "scripts" / "train_nodes.sh"
# GRPO (group baselines), PPO (its value head, advantages normalised over the batch), REINFORCE++ (batch whitening),
# DPO (pairs): a few algorithms whose update needs every rank's rows in a different way
NODE_CASES = [("grpo", {}), ("ppo", {}), ("reinforce++", {}), ("dpo", {})]
LAUNCHED = ("GROUP_RANK", "GROUP_WORLD_SIZE", "LOCAL_RANK", "RANK", "WORLD_SIZE", "TORCHELASTIC_RUN_ID")


def clean_env(**extra) -> dict:
    "This environment without SLURM's or the script's variables (a CI runner may be a SLURM job), plus `extra`."
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "RLNB_NNODES", "RLNB_NODE_RANK",
                                                                    "RLNB_HEAD", "RLNB_PORT", "RLNB_RUN_ID",
                                                                    "RLNB_PROCS_PER_NODE"))}
    return {**env, "PYTHONPATH": f"{ROOT}{os.pathsep}{ROOT / 'tests'}", "OMP_NUM_THREADS": "1",
            "PATH": f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}", **extra}


def two_launchers(commands: list, envs: list, cwd: Path, timeout: float = 300.0) -> list:
    "Start two launchers at once and wait for both: [(exit status, stdout, stderr, pid)]; killed, with both stderr "
    "tails shown, if either has not finished within `timeout` seconds (a rendezvous that never forms)."
    logs = [(open(cwd / f"node{i}.out", "w+"), open(cwd / f"node{i}.err", "w+")) for i in range(2)]
    procs = [subprocess.Popen(c, env=e, cwd=cwd, stdout=o, stderr=r, start_new_session=True)  # a group: kill all
             for c, e, (o, r) in zip(commands, envs, logs)]
    deadline, done = time.monotonic() + timeout, []
    try:
        for p in procs: p.wait(timeout=max(1.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired: pass
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
    for p, (o, r) in zip(procs, logs):
        o.seek(0), r.seek(0)
        done.append((p.returncode, o.read(), r.read(), p.pid))
        o.close(), r.close()
    return done


def tails(done: list) -> str:
    "Both launchers' exit statuses and the ends of their stderr, for a failed assertion."
    return "\n".join(f"--- launcher {i}: exit {rc}\n{err[-2500:]}" for i, (rc, _, err, _) in enumerate(done))


NODE = r'''
"One node of two: join the group torchrun's rendezvous formed, take one update on this rank's half of the rollouts."
import json, os, sys
import torch, torch.distributed as dist
from rlnb.distributed import close_distributed, init_distributed, process_rank, world_size
from test_distributed import one_update, policy_and_rollouts
init_distributed()  # what `rlnb train` calls: the group torchrun described in the environment (gloo on a CPU)
try:
    policy, tok, rollouts = policy_and_rollouts()
    start = {k: p.detach().clone() for k, p in policy.named_parameters() if p.requires_grad}
    k = len(rollouts) // world_size()
    mine = rollouts[process_rank() * k:(process_rank() + 1) * k]
    results = [one_update(policy, tok, mine, name, options, start) for name, options in json.loads(sys.argv[2])]
    seen = [None] * world_size()  # what each rank's launcher told it, and which process that launcher is
    dist.all_gather_object(seen, {**{k: os.environ[k] for k in json.loads(sys.argv[3])}, "launcher": os.getppid()})
    if process_rank() == 0: torch.save((results, seen), sys.argv[1])
finally: close_distributed()
'''


def test_two_launchers_take_the_single_process_update(tmp_path):
    "`torchrun --nnodes 2 --nproc_per_node 1 --rdzv_backend c10d` twice: two nodes' ranks take one process's update."
    (tmp_path / "node.py").write_text(NODE)
    out, port, run_id = tmp_path / "ranks.pt", free_port(), f"rehearsal-{os.getpid()}"
    torchrun = str(Path(sys.executable).parent / "torchrun")
    # no --node_rank: with c10d the rendezvous numbers the nodes (torchrun ignores it, with a warning); is_host says
    # which launcher hosts the rendezvous store, as scripts/train_nodes.sh does on node 0
    launch = lambda host: [torchrun, "--nnodes", "2", "--nproc_per_node", "1", "--rdzv_backend", "c10d",
                           "--rdzv_endpoint", f"127.0.0.1:{port}", "--rdzv_id", run_id, "--rdzv_conf",
                           f"is_host={host}", str(tmp_path / "node.py"), str(out), json.dumps(NODE_CASES),
                           json.dumps(LAUNCHED)]
    done = two_launchers([launch(1), launch(0)], [clean_env(), clean_env()], tmp_path)
    assert all(rc == 0 for rc, *_ in done) and out.is_file(), tails(done)
    two, seen = torch.load(out, weights_only=False)
    # two launchers, one rank each: group ranks 0 and 1, local rank 0 on each, one world of 2, one run
    assert sorted(s["GROUP_RANK"] for s in seen) == ["0", "1"], seen
    assert [(s["LOCAL_RANK"], s["WORLD_SIZE"], s["GROUP_WORLD_SIZE"], s["TORCHELASTIC_RUN_ID"]) for s in seen] == \
        [("0", "2", "2", run_id)] * 2, seen
    assert [s["RANK"] for s in seen] == ["0", "1"] and all(s["RANK"] == s["GROUP_RANK"] for s in seen), seen
    assert sorted(s["launcher"] for s in seen) == sorted(pid for *_, pid in done), (seen, done)  # one rank each
    policy, tok, rollouts = policy_and_rollouts()
    start = {k: p.detach().clone() for k, p in policy.named_parameters() if p.requires_grad}
    assert len(two) == len(NODE_CASES)
    for (name, options), update2 in zip(NODE_CASES, two):
        assert_same_update(update2, one_update(policy, tok, rollouts, name, options, start), name)


def test_the_cluster_script_on_two_launchers_trains_one_run(tmp_path):
    "scripts/train_nodes.sh run twice, as SLURM would run it on two nodes: one run of 2 processes, logged once."
    params = ["-p", "output_dir", str(tmp_path / "run"), "-p", "num_iterations", "2", "-p", "prompts_per_step", "4",
              "-p", "group_size", "4", "-p", "eval_every", "2", "-p", "eval_size", "8"]
    node = dict(RLNB_NNODES="2", RLNB_HEAD="127.0.0.1", RLNB_PORT=str(free_port()), RLNB_RUN_ID=f"nodes-{os.getpid()}")
    done = two_launchers([["bash", str(SCRIPT), *params]] * 2,
                         [clean_env(**node, RLNB_NODE_RANK=str(r)) for r in (0, 1)], tmp_path)
    assert all(rc == 0 for rc, *_ in done), tails(done)
    for r, (_, _, err, _) in enumerate(done):
        assert f"train_nodes.sh: node {r} of 2, 1 process(es) here, rendezvous nodes-" in err, err[-2000:]
    said = "".join(out for _, out, _, _ in done)
    assert said.count("trained 2 steps with 2 process(es)") == 1, said  # rank 0 alone, on one of the two nodes
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if "reward/mean" in r] == [1, 2] and any("eval/accuracy" in r for r in rows)
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert (summary["world_size"], summary["final_step"]) == (2, 2)


def fake_bin(folder: Path) -> Path:
    "A `torchrun` that prints its arguments and an `scontrol` that knows one allocation: what the script asks of them."
    folder.mkdir()
    (folder / "torchrun").write_text('#!/bin/sh\necho "torchrun $*"\n')
    (folder / "scontrol").write_text('#!/bin/sh\n[ "$*" = "show hostnames gpu-a[17-18]" ] || exit 1\n'
                                     'printf "gpu-a17\\ngpu-a18\\n"\n')
    for f in folder.iterdir(): f.chmod(0o755)
    return folder


def script(env: dict, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(SCRIPT), *args], env=env, capture_output=True, text=True, timeout=60)


def test_the_cluster_script_reads_slurm_and_refuses_what_it_lacks(tmp_path):
    "Under SLURM the script takes the node count, node rank, head node, GPUs and job id from SLURM's variables; "
    "it refuses what is missing or wrong in one line."
    base = clean_env(PATH=f"{fake_bin(tmp_path / 'bin')}{os.pathsep}{os.environ['PATH']}")
    slurm = dict(SLURM_NNODES="2", SLURM_NODEID="1", SLURM_JOB_NODELIST="gpu-a[17-18]", SLURM_JOB_ID="4242",
                 SLURM_GPUS_ON_NODE="8")
    done = script({**base, **slurm}, "-p", "num_iterations", "5")
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["torchrun", "--nnodes", "2", "--nproc_per_node", "8", "--rdzv_backend", "c10d",
                                   "--rdzv_endpoint", "gpu-a17:29500", "--rdzv_id", "4242", "--rdzv_conf", "is_host=0",
                                   "-m", "rlnb.cli", "train", "-p", "num_iterations", "5"], done.stdout
    head = script({**base, **slurm, "SLURM_NODEID": "0", "RLNB_PORT": "29700", "RLNB_PROCS_PER_NODE": "4",
                   "RLNB_JOIN_TIMEOUT": "1200"})  # the overrides win over SLURM's values
    assert ("--nproc_per_node 4 " in head.stdout and "gpu-a17:29700" in head.stdout
            and "--rdzv_conf is_host=1,join_timeout=1200 " in head.stdout), head.stdout
    two, one = dict(RLNB_NNODES="2"), dict(RLNB_NNODES="2", RLNB_NODE_RANK="1")
    refusals = [  # what is missing or wrong -> the one line the script stops with (exit status 2, torchrun not run)
        ({}, "the number of nodes is unset: run under SLURM (SLURM_NNODES) or set RLNB_NNODES=<nodes>"),
        (dict(RLNB_NNODES="two"), "RLNB_NNODES (or SLURM_NNODES)='two' must be a whole number of nodes (1 to 999999)"),
        (two, "this node's rank is unset: run under SLURM (SLURM_NODEID) or set RLNB_NODE_RANK=<0..1>"),
        ({**two, "RLNB_NODE_RANK": "2"}, "RLNB_NODE_RANK (or SLURM_NODEID)='2' must be a node rank from 0 to 1 (of 2 "
                                         "nodes)"),
        (one, "the head node is unset: run under SLURM (SLURM_JOB_NODELIST) or set RLNB_HEAD=<node 0's host>"),
        ({**one, "RLNB_HEAD": "h", "RLNB_PORT": "70000"}, "RLNB_PORT='70000' must be a port number from 1 to 65535"),
        ({**one, "RLNB_HEAD": "h", "RLNB_PROCS_PER_NODE": "0"},
         "RLNB_PROCS_PER_NODE (or SLURM_GPUS_ON_NODE)='0' must be a whole number of processes (1 to 999999)"),
        ({**one, "RLNB_HEAD": "h", "RLNB_JOIN_TIMEOUT": "10m"},
         "RLNB_JOIN_TIMEOUT='10m' must be a whole number of seconds"),
        ({**one, "SLURM_JOB_NODELIST": "other[1-2]"},
         "could not read the head node from SLURM_JOB_NODELIST=other[1-2] with scontrol; set RLNB_HEAD"),
    ]
    for settings, line in refusals:
        done = script({**base, **settings})
        assert (done.returncode, done.stdout, done.stderr) == (2, "", f"train_nodes.sh: {line}\n"), (settings, done)
