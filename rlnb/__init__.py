"""Reinforcement learning for LLM post-training, taught and built in notebooks

Modules:

- `rlnb.kl`: How far has the policy moved from where it started? Estimating KL from sampled tokens, and keeping a reference model to measure it against.
- `rlnb.rewards`: Turning what a policy wrote into numbers a loss can use: scalar and vector rewards, aggregation, normalisation and shaping.
- `rlnb.training`: One optimizer step, one rollout-then-update iteration, the loop around them, and everything a run needs to be watched, stopped and resumed."""

__version__ = "0.0.1"

# The public names of every module, so `import rlnb; rlnb.collate(...)` and `from rlnb import *` both work.
from .core import *
from .tiny import *
from .tasks import *
from .inference import *
from .rewards import *
from .kl import *
from .rollouts import *
from .algorithms import *
from .training import *
