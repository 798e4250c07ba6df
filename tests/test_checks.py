"The argument checks every loss shares (rlnb.checks): each error names the call and the argument."
import math

import pytest
import torch

import rlnb
from rlnb.checks import check_2d, check_finite, check_finite_number, resolve_group_ids, rewards_1d


def test_check_2d_names_the_argument_and_the_expected_shape():
    x = torch.zeros(2, 3)
    assert check_2d("f", "logprobs", x) is x
    with pytest.raises(ValueError, match=r"f: `loss_mask` has shape \(2,\), expected \(2, 3\) like `logprobs`"):
        check_2d("f", "loss_mask", torch.ones(2), (2, 3))
    with pytest.raises(ValueError, match=r"expected \(B, C\)"):
        check_2d("f", "logprobs", torch.zeros(3))
    with pytest.raises(TypeError, match="must be a torch.Tensor, got list"):
        check_2d("f", "logprobs", [[0.0]])


def test_check_finite_ignores_what_the_mask_leaves_out():
    x = torch.tensor([[0.0, -math.inf], [math.nan, 1.0]])
    check_finite("f", "x", x, torch.tensor([[True, False], [False, True]]))
    with pytest.raises(ValueError, match=r"f: `x` must be finite .* at \[0, 1\]"):
        check_finite("f", "x", x)


@pytest.mark.parametrize("bad", [-1, math.nan, math.inf, True, "1", None])
def test_check_finite_number_refuses(bad):
    with pytest.raises(ValueError, match="f: `beta` must be a finite number >= 0"):
        check_finite_number("f", "beta", bad)


def test_rewards_and_groups():
    assert rewards_1d("f", [1, 0]).dtype == torch.float32
    assert not rewards_1d("f", torch.ones(2, requires_grad=True)).requires_grad
    with pytest.raises(ValueError, match=r"`rewards` has shape \(2, 2\)"):
        rewards_1d("f", torch.ones(2, 2))
    with pytest.raises(ValueError, match=r"NaN or inf at positions \[1\]"):
        rewards_1d("f", [0.0, math.nan])
    assert resolve_group_ids("f", 4, group_size=2).tolist() == [0, 0, 1, 1]
    assert resolve_group_ids("f", 3).tolist() == [0, 0, 0]
    with pytest.raises(ValueError, match="not divisible"):
        resolve_group_ids("f", 5, group_size=2)
    with pytest.raises(TypeError, match="must be integers"):
        resolve_group_ids("f", 2, [0.0, 1.0])


def test_the_tasks_check_number_is_not_shadowed():
    "rlnb.check_number is the tasks' answer checker; the argument check has its own name."
    assert rlnb.check_number is rlnb.tasks.check_number and rlnb.check_finite_number is check_finite_number
