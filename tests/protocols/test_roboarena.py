"""RoboArena's handshake and requests on the OpenPI wire (protocols/roboarena.py, protocols/openpi.py)."""

from __future__ import annotations

import numpy as np
import pytest

from protocols import openpi as op
from protocols.roboarena import RoboArenaConfig

ARENA = RoboArenaConfig(image_resolution=(6, 8), n_external_cameras=2, needs_session_id=True)
CAMS = ("observation/exterior_image_0_left", "observation/exterior_image_1_left", "observation/wrist_image_left")
META = op.PolicyMetadata(action_horizon=4, action_dim=8, image_keys=CAMS, image_resolution=(6, 8), state_dim=0,
                         max_frames=3, max_prompt_chars=20, roboarena=ARENA, extra={"policy": "p"})


def obs(frames: int | None = None, **over) -> dict:
    shape = (6, 8, 3) if frames is None else (frames, 6, 8, 3)
    out = {k: np.zeros(shape, np.uint8) for k in CAMS}
    out.update({"observation/joint_position": np.zeros(7, np.float32), "observation/gripper_position": np.ones(1),
                "observation/cartesian_position": np.zeros(6), "prompt": "wipe"})
    out.update(over)
    return {k: v for k, v in out.items() if v is not None}


def _error(msg) -> str:
    with pytest.raises(op.ProtocolError) as info:
        op.parse_request(msg, META)
    return str(info.value)


def test_config_cameras_and_actions():
    assert ARENA.camera_keys == CAMS and ARENA.action_dim == 8
    stereo = RoboArenaConfig(image_resolution=(4, 4), n_external_cameras=1, needs_stereo_camera=True,
                             action_space="cartesian_velocity")
    assert stereo.camera_keys == ("observation/exterior_image_0_left", "observation/exterior_image_0_right",
                                  "observation/wrist_image_left", "observation/wrist_image_right")
    assert stereo.action_dim == 7
    for bad, message in (({"n_external_cameras": 3}, "n_external_cameras must be 0, 1 or 2"),
                         ({"action_space": "torque"}, "action_space must be one of"),
                         ({"n_external_cameras": 0, "needs_wrist_camera": False}, "needs at least one camera")):
        with pytest.raises(ValueError, match=message):
            RoboArenaConfig(image_resolution=(4, 4), **bad)


def test_metadata_carries_both_handshakes():
    assert META.to_wire() == {
        "policy": "p", "action_horizon": 4, "action_dim": 8, "image_keys": list(CAMS), "image_resolution": [6, 8],
        "state_dim": 0, "state_key": "state", "prompt_key": "prompt", "max_frames": 3, "max_prompt_chars": 20,
        "needs_wrist_camera": True, "n_external_cameras": 2,  # RoboArena's image_resolution is the one above
        "needs_stereo_camera": False, "needs_session_id": True, "action_space": "joint_position",
    }
    assert META.needs_session_id
    plain = op.PolicyMetadata(action_horizon=4, action_dim=8, image_keys=("cam",), image_resolution=(6, 8), state_dim=0)
    assert not plain.needs_session_id and "max_frames" not in plain.to_wire()


@pytest.mark.parametrize("change, message", [
    ({"image_keys": CAMS[:2]}, "must be the roboarena cameras"),
    ({"image_resolution": (6, 9)}, "differs from roboarena's [6, 8]"),
    ({"action_dim": 7}, "action_dim 7 differs from roboarena's 8 (joint_position)"),
    ({"extra": {"action_space": "x"}}, "would hide the roboarena config"),
    ({"max_frames": 0}, "max_frames must be a positive int"),
    ({"max_prompt_chars": 9000}, "max_prompt_chars must be an int in [1, 8192]"),
])
def test_metadata_refuses_a_config_that_contradicts_itself(change, message):
    fields = dict(action_horizon=4, action_dim=8, image_keys=CAMS, image_resolution=(6, 8), state_dim=0,
                  roboarena=ARENA)
    fields.update(change)
    with pytest.raises(ValueError) as info:
        op.PolicyMetadata(**fields)
    assert message in str(info.value)


def test_infer_endpoint_is_an_observation():
    req = op.parse_request({**obs(), "endpoint": "infer", "session_id": "ep-1"}, META)
    assert isinstance(req, op.InferRequest) and req.session_id == "ep-1"
    assert sorted(req.observation.extras) == ["observation/cartesian_position", "observation/gripper_position",
                                              "observation/joint_position"]
    joint = req.observation.extras["observation/joint_position"]
    assert joint.dtype == np.float64 and not joint.flags.writeable
    # The same request without the endpoint is the same observation.
    assert op.parse_request({**obs(), "session_id": "ep-1"}, META).session_id == "ep-1"
    assert op.parse_request({"endpoint": "reset", "session_id": "ep-1"}, META) == op.ResetRequest("ep-1")
    assert _error({"batch": [{**obs(), "endpoint": "infer"}]}) == "batch[0] must be an observation"


def test_frames_stack_up_to_max_frames():
    req = op.parse_request(obs(frames=3), META)
    assert all(v.shape == (3, 6, 8, 3) for v in req.observation.images.values())
    assert _error(obs(frames=4)) == ("camera 'observation/exterior_image_0_left' must be uint8 [6, 8, 3] or "
                                     "[T, 6, 8, 3] with T in [1, 3], got uint8 [4, 6, 8, 3]")
    mixed = obs(frames=2, **{CAMS[2]: np.zeros((6, 8, 3), np.uint8)})
    assert _error(mixed) == ("camera 'observation/wrist_image_left' has one frame [H, W, 3], "
                             "'observation/exterior_image_0_left' has 2 frames: every camera must carry the same")


@pytest.mark.parametrize("over, message", [
    ({"observation/joint_position": None}, "missing 'observation/joint_position' (float [7])"),
    ({"observation/joint_position": [0.0] * 7}, None),
    ({"observation/joint_position": np.zeros((1, 7))}, "'observation/joint_position' must have shape [7], got [1, 7]"),
    ({"observation/joint_position": "0"}, "'observation/joint_position' must be a float array, got string"),
    ({"observation/cartesian_position": None}, None),  # only a cartesian action space needs it
    ({"observation/cartesian_position": np.full(6, np.nan)},
     "'observation/cartesian_position' has a non-finite value (NaN or inf) at index 0"),
    ({"prompt": "x" * 21}, "'prompt' is over 20 characters"),
])
def test_state_vectors_and_prompt(over, message):
    if message is None:
        assert isinstance(op.parse_request(obs(**over), META), op.InferRequest)
    else:
        assert _error(obs(**over)) == message


def test_exteriors_numbered_from_one_are_read_as_roboarenas_evaluator_sends_them():
    left, right = np.full((6, 8, 3), 1, np.uint8), np.full((6, 8, 3), 2, np.uint8)
    evaluator = obs(**{CAMS[0]: None, CAMS[1]: left, "observation/exterior_image_2_left": right})
    images = op.parse_request(evaluator, META).observation.images
    assert sorted(images) == sorted(CAMS) and images[CAMS[0]] is left and images[CAMS[1]] is right
    # Errors name the key as sent.
    bad = {**evaluator, "observation/exterior_image_2_left": np.zeros((6, 9, 3), np.uint8)}
    assert _error(bad).startswith("camera 'observation/exterior_image_2_left' must be uint8 [6, 8, 3]")
    assert ARENA.sent_cameras(obs()) == {}
    # A 0-indexed request with one camera too many still names it.
    assert _error(obs(**{"observation/exterior_image_2_left": right})).startswith(
        "unknown camera key 'observation/exterior_image_2_left'")
