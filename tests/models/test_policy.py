"""models/policy: the adapter seam, the dummy policy, user policies, and --policy specs through models.factory.build_policy."""

from __future__ import annotations

import sys
import time
import types
from types import MappingProxyType

import numpy as np
import pytest

from models.base import ModelError
from models.factory import BuildOptions, build_policy
from models.policy import (
    PROBE_METADATA,
    DummyPolicy,
    PolicyWork,
    UserPolicyAdapter,
    check_actions,
    load_user_policy,
)
from models.policy.example import ReachPolicy
from protocols.openpi import Observation, PolicyMetadata

META = PolicyMetadata(action_horizon=3, action_dim=2, image_keys=("cam",), image_resolution=(4, 4), state_dim=2)


def _obs(value: int = 0, state=(0.0, 0.0), prompt: str | None = "go", key: str = "cam", res=(4, 4)) -> Observation:
    img = np.full((*res, 3), value, np.uint8)
    return Observation(MappingProxyType({key: img}), np.asarray(state, np.float32), prompt, MappingProxyType({}))


def _works(n: int, **kw) -> list[PolicyWork]:
    return [PolicyWork(f"s{i}", f"r{i}", _obs(**kw)) for i in range(n)]


# ----------------------------------------------------------------------------- check_actions


def test_check_actions_accepts_the_largest_finite_float32():
    big = np.full((3, 2), np.finfo(np.float32).max, np.float32)
    assert check_actions(big, META, "p").tolist() == big.tolist()


def test_check_actions_returns_read_only_float32():
    src = [[1, 2], [3, 4], [5, 6]]
    out = check_actions(src, META, "p")
    assert out.dtype == np.float32 and out.tolist() == [[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]]
    assert not out.flags.writeable
    mine = np.zeros((3, 2), np.float32)
    out = check_actions(mine, META, "p")
    assert mine.flags.writeable and not out.flags.writeable  # the policy's own array is left alone


@pytest.mark.parametrize(
    "value,text",
    [
        (np.zeros((2, 2)), "policy p returned actions [2, 2], advertised [3, 2]"),
        (np.zeros(6), "policy p returned actions [6], advertised [3, 2]"),
        (np.full((3, 2), np.nan), "policy p returned non-finite actions"),
        (np.array([[0, 0], [np.inf, 0], [0, 0]], np.float32), "policy p returned non-finite actions"),
        (np.array([[0, 0], [0, 0], [0, -np.inf]]), "policy p returned non-finite actions"),
        ("abc", "policy p returned actions that are not numeric: could not convert string to float: 'abc'"),
    ],
)
def test_check_actions_rejects(value, text):
    with pytest.raises(ModelError) as info:
        check_actions(value, META, "p")
    assert str(info.value) == text


# ----------------------------------------------------------------------------- dummy


def test_dummy_policy_answers_zeros_once_per_batch():
    policy = DummyPolicy(infer_ms=20)
    assert policy.kind == "policy" and policy.name == "dummy-policy" and policy.max_batch == 32
    works = [PolicyWork(f"s{i}", f"r{i}", _obs(key=k, res=(224, 224), state=np.zeros(32)))
             for i, k in enumerate(PROBE_METADATA.image_keys)]
    started = time.perf_counter()
    results = policy.run_batch(works)
    elapsed_ms = (time.perf_counter() - started) * 1000
    assert policy.calls == 1
    assert 20 <= elapsed_ms < 200  # one sleep for the whole batch
    assert [(r.session_id, r.request_id) for r in results] == [("s0", "r0"), ("s1", "r1"), ("s2", "r2")]
    for r in results:
        assert r.actions.shape == (50, 32) and r.actions.dtype == np.float32 and not r.actions.any()
        assert r.outputs == {} and r.policy_ms >= 20
    assert policy.describe() == {"kind": "policy", "name": "dummy-policy", "max_batch": 32,
                                 "metadata": PROBE_METADATA.to_wire(), "infer_ms": 20.0}


def test_probe_metadata_matches_the_reference_observation():
    assert PROBE_METADATA.to_wire() == {
        "action_horizon": 50,
        "action_dim": 32,
        "image_keys": ["observation/exterior_image_1_left", "observation/exterior_image_2_left",
                       "observation/wrist_image_left"],
        "image_resolution": [224, 224],
        "state_dim": 32,
        "state_key": "observation/state",
        "prompt_key": "prompt",
    }


# ----------------------------------------------------------------------------- user policies


class _OneAtATime:
    """openpi's BasePolicy shape: infer(obs) and reset() only."""

    metadata = {"action_horizon": 3, "action_dim": 2, "image_keys": ["cam"], "image_resolution": [4, 4],
                "state_dim": 2, "robot": "arm"}

    def __init__(self):
        self.seen: list[dict] = []
        self.resets = 0

    def infer(self, obs):
        self.seen.append(obs)
        value = float(obs["cam"][0, 0, 0])
        return {"actions": np.full((3, 2), value, np.float32), "state": obs["state"]}

    def reset(self):
        self.resets += 1


class _PerSession(_OneAtATime):
    def reset(self, session_id):
        self.resets_of = session_id


def test_user_policy_one_at_a_time():
    user = _OneAtATime()
    adapter = UserPolicyAdapter(user, name="mine", max_batch=32)
    assert adapter.max_batch == 1  # no infer_batch: nothing to gain from batching
    assert adapter.metadata == PolicyMetadata(3, 2, ("cam",), (4, 4), 2, extra={"robot": "arm"})
    works = [PolicyWork("a", "1", _obs(5, state=(1, 2))), PolicyWork("b", "2", _obs(9))]
    results = adapter.run_batch(works)
    assert [r.actions[0, 0] for r in results] == [5.0, 9.0]
    assert results[0].outputs["state"].tolist() == [1.0, 2.0]
    assert sorted(user.seen[0]) == ["cam", "prompt", "state"] and user.seen[0]["prompt"] == "go"
    adapter.reset("a")
    assert user.resets == 1


def test_user_policy_reset_with_a_session_argument():
    user = _PerSession()
    UserPolicyAdapter(user).reset("robot-3")
    assert user.resets_of == "robot-3" and user.resets == 0


def test_user_policy_with_infer_batch_is_batched():
    adapter = UserPolicyAdapter(ReachPolicy(), name="reach")
    assert adapter.max_batch == 32
    works = [PolicyWork(f"s{i}", f"r{i}", Observation(
        MappingProxyType({"observation/image": np.full((96, 96, 3), v, np.uint8)}),
        np.arange(7, dtype=np.float32) / 10, None, MappingProxyType({}))) for i, v in enumerate((0, 255))]
    results = adapter.run_batch(works)
    # Chunks end at the brightness target (-1 for black, +1 for white) from the state.
    assert results[0].actions.shape == (10, 7)
    assert results[0].actions[-1].tolist() == [-1.0] * 7
    assert results[1].actions[-1].tolist() == [1.0] * 7
    np.testing.assert_allclose(results[1].actions[0], 0.1 * 1.0 + 0.9 * np.arange(7) / 10, rtol=1e-6)


def test_user_policy_bad_output_is_a_model_error():
    user = _OneAtATime()
    user.infer = lambda obs: {"action": np.zeros((3, 2))}
    with pytest.raises(ModelError) as info:
        UserPolicyAdapter(user, name="typo").run_batch([PolicyWork("a", "1", _obs())])
    assert str(info.value) == "policy typo returned no 'actions' for session a"


def test_load_user_policy_from_module_factory(monkeypatch):
    adapter = load_user_policy("models.policy.example:make_policy", action_horizon=4)
    assert isinstance(adapter, UserPolicyAdapter) and adapter.name == "models.policy.example:make_policy"
    assert adapter.metadata.action_shape == (4, 7) and adapter.metadata.extra == {"policy": "reach-example"}
    mod = types.ModuleType("my_robot_policies")
    mod.factories = types.SimpleNamespace(build=_OneAtATime)
    monkeypatch.setitem(sys.modules, "my_robot_policies", mod)
    assert load_user_policy("my_robot_policies:factories.build").metadata.state_dim == 2


@pytest.mark.parametrize(
    "spec,exc,text",
    [
        ("models.policy.example", ValueError, "a user policy is 'module:factory', got 'models.policy.example'"),
        ("models.policy.example:nope", ValueError, "models.policy.example has no attribute 'nope'"),
        ("models.policy.example:np", ValueError, "models.policy.example:np is not callable"),
        ("no_such_module_xyz:f", ModuleNotFoundError, "No module named 'no_such_module_xyz'"),
    ],
)
def test_load_user_policy_errors(spec, exc, text):
    with pytest.raises(exc) as info:
        load_user_policy(spec)
    assert str(info.value) == text


def test_user_policy_without_metadata_keys():
    bad = types.SimpleNamespace(metadata={"action_horizon": 1}, infer=lambda o: o)
    with pytest.raises(ValueError) as info:
        UserPolicyAdapter(bad)
    assert str(info.value) == "policy metadata is missing ['action_dim', 'image_keys', 'image_resolution', 'state_dim']"


# ----------------------------------------------------------------------------- build_policy


def test_build_policy_specs():
    dummy = build_policy("dummy:50", BuildOptions(max_batch=16))
    assert isinstance(dummy, DummyPolicy) and dummy.infer_ms == 50.0 and dummy.max_batch == 16
    assert build_policy("dummy").infer_ms == 0.0
    user = build_policy("models.policy.example:make_policy", BuildOptions(device="cpu", max_batch=4))
    assert isinstance(user, UserPolicyAdapter) and user.max_batch == 4
    default = build_policy("default", BuildOptions(device="cpu", max_batch=8))  # DEFAULTS["policy"]: the maze policy
    assert default.name == "maze-policy" and default.max_batch == 8 and default.metadata.action_shape == (8, 8)
    flow = build_policy("flow", BuildOptions(device="cpu", max_batch=8))
    assert flow.name == "flow-policy" and flow.max_batch == 8 and flow.metadata.action_shape == (50, 32)
