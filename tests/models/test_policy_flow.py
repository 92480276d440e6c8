"""models/policy/flow.py: the built-in flow-matching policy computes, batches and replays."""

from __future__ import annotations

from types import MappingProxyType

import numpy as np
import pytest
import torch

from models.policy.base import PolicyWork
from models.policy.flow import FlowMatchingPolicy, FlowPolicyConfig, prompt_buckets, sinusoid
from protocols.openpi import Observation, SamplingParams

SMALL = FlowPolicyConfig(
    action_horizon=8, action_dim=3, image_keys=("left", "wrist"), image_resolution=(64, 32), state_dim=4,
    d_model=32, num_heads=2, num_layers=2, num_inference_steps=4, max_batch=8,
)


@pytest.fixture(scope="module")
def policy() -> FlowMatchingPolicy:
    return FlowMatchingPolicy(SMALL)


def _obs(seed: int = 0, prompt: str | None = "pick up the cup", state_shift: float = 0.0) -> Observation:
    rng = np.random.default_rng(seed)
    images = {k: rng.integers(0, 256, (64, 32, 3), dtype=np.uint8) for k in SMALL.image_keys}
    state = rng.standard_normal(4).astype(np.float32) + np.float32(state_shift)
    return Observation(MappingProxyType(images), state, prompt, MappingProxyType({}))


def _act(policy, obs, sid="s", **sampling) -> np.ndarray:
    return policy.run_batch([PolicyWork(sid, "r", obs, SamplingParams(**sampling))])[0].actions


def test_prompt_buckets_are_stable_hashes():
    assert prompt_buckets(None).tolist() == [0]
    assert prompt_buckets("").tolist() == [0]
    ids = prompt_buckets("ab")
    assert ids.tolist() == [1 + (98 * 2654435761 % 2**32) % 4095, 1 + (99 * 2654435761 % 2**32) % 4095,
                            1 + ((257 + 97 * 256 + 98) * 2654435761 % 2**32) % 4095]
    assert len(prompt_buckets("abcd")) == 4 + 3 + 2
    assert len(prompt_buckets("x" * 600)) == 512 + 511 + 510  # truncated at 512 bytes
    assert all(0 < i < 4096 for i in prompt_buckets("é ü ✓").tolist())


def test_sinusoid_shape_and_values():
    emb = sinusoid(torch.tensor([0.0, 0.5]), 8)
    assert emb.shape == (2, 8)
    assert emb[0].tolist() == [0.0] * 4 + [1.0] * 4


def test_metadata_and_describe(policy):
    assert policy.kind == "policy" and policy.name == "flow-policy"
    assert policy.metadata.to_wire() == {
        "policy": "flow-matching", "num_inference_steps": 4, "action_horizon": 8, "action_dim": 3,
        "image_keys": ["left", "wrist"], "image_resolution": [64, 32], "state_dim": 4,
        "state_key": "state", "prompt_key": "prompt",
    }
    assert policy.describe()["parameters"] == sum(p.numel() for p in policy.model.parameters())


def test_same_weights_for_the_same_seed():
    a, b = FlowMatchingPolicy(SMALL), FlowMatchingPolicy(SMALL)
    for pa, pb in zip(a.model.parameters(), b.model.parameters()):
        assert torch.equal(pa, pb)
    other = FlowMatchingPolicy(FlowPolicyConfig(**{**SMALL.__dict__, "seed": 1}))
    assert not torch.equal(next(a.model.parameters()), next(other.model.parameters()))


def test_actions_depend_on_every_input(policy):
    base = _act(policy, _obs(), seed=7)
    assert base.shape == (8, 3) and base.dtype == np.float32 and np.isfinite(base).all()
    assert np.array_equal(base, _act(policy, _obs(), seed=7))  # deterministic
    assert np.array_equal(base, _act(policy, _obs(), sid="other-robot", seed=7))  # seed, not session
    changed_image = _obs()
    images = dict(changed_image.images)
    images["wrist"] = 255 - images["wrist"]
    changed_image = Observation(MappingProxyType(images), changed_image.state, changed_image.prompt, {})
    for variant in (changed_image, _obs(state_shift=1.0), _obs(prompt="open the drawer"), _obs(prompt=None)):
        other = _act(policy, variant, seed=7)
        assert np.abs(other - base).max() > 1e-3
    assert np.abs(_act(policy, _obs(), seed=8) - base).max() > 1e-2  # the noise matters too
    assert np.abs(_act(policy, _obs(), seed=7, num_inference_steps=1) - base).max() > 1e-3


def test_batched_equals_one_at_a_time(policy):
    works = [PolicyWork(f"s{i}", f"r{i}", _obs(i), SamplingParams(seed=i, num_inference_steps=(2, 4, 4, 6, 2)[i]))
             for i in range(5)]
    batched = policy.run_batch(works)
    assert [r.session_id for r in batched] == ["s0", "s1", "s2", "s3", "s4"]
    for work, got in zip(works, batched):
        alone = policy.run_batch([work])[0].actions
        np.testing.assert_allclose(got.actions, alone, rtol=0, atol=1e-5)
    assert np.abs(batched[0].actions - batched[1].actions).max() > 1e-2


def test_session_noise_advances_only_on_commit_and_replays_after_reset():
    policy = FlowMatchingPolicy(SMALL)
    obs = _obs()
    first = _act(policy, obs, sid="robot")
    policy.end_tick("robot", committed=False)
    assert np.array_equal(_act(policy, obs, sid="robot"), first)  # not committed: same draw again
    policy.end_tick("robot", committed=True)
    second = _act(policy, obs, sid="robot")
    policy.end_tick("robot", committed=True)
    assert np.abs(second - first).max() > 1e-2
    # Robots draw their own noise: the same observation gives another sample elsewhere.
    assert np.abs(_act(policy, obs, sid="another") - first).max() > 1e-2
    policy.reset("robot")
    assert np.array_equal(_act(policy, obs, sid="robot"), first)


def test_default_config_shape():
    policy = FlowMatchingPolicy()
    assert policy.metadata.action_shape == (50, 32)
    assert policy.metadata.image_resolution == (224, 224) and len(policy.metadata.image_keys) == 3
    rng = np.random.default_rng(0)
    obs = Observation(
        MappingProxyType({k: rng.integers(0, 256, (224, 224, 3), dtype=np.uint8) for k in policy.metadata.image_keys}),
        rng.standard_normal(32).astype(np.float32), "pick", MappingProxyType({}))
    actions = _act(policy, obs, num_inference_steps=2)
    assert actions.shape == (50, 32) and np.isfinite(actions).all() and actions.std() > 0.1


def test_resolution_must_fit_the_patch():
    with pytest.raises(ValueError) as info:
        FlowMatchingPolicy(FlowPolicyConfig(**{**SMALL.__dict__, "image_resolution": (60, 32)}))
    assert str(info.value) == "image_resolution must be multiples of 32, got (60, 32)"
