"""Reinforcement learning for LLM post-training, taught and built in notebooks

Modules:

- `rlnb.kl`: How far has the policy moved from where it started? Estimating KL from sampled tokens, and keeping a reference model to measure it against.
- `rlnb.rewards`: Turning what a policy wrote into numbers a loss can use: scalar and vector rewards, aggregation, normalisation and shaping."""

__version__ = "0.0.1"

# The public names of every module, so `import rlnb; rlnb.collate(...)` and `from rlnb import *` both work.
from .core import *
from .tasks import *
from .models import *
from .chat import *
from .generation import *
from .logprobs import *
from .tools import *
from .rewards import *
from .kl import *
from .rollouts import *
from .algorithms import *
from .loggers import *
from .checkpoints import *
from .training import *
from .sft import *
from .quickstart import *
from .tiny import *  # registers "tiny" in rlnb.models.MODEL_LOADERS / TOKENIZER_LOADERS
