"""DreamZero-DROID's observation transforms against values worked out by hand."""

from __future__ import annotations

import numpy as np
import pytest

from models.policy.dreamzero import observation as ob
from protocols.openpi import ProtocolError

# ----------------------------------------------------------------------------- cameras


def test_center_crop_box_is_torchvisions():
    # 180 x 320 -> 171 x 304; (180 - 171) / 2 = 4.5 rounds to 4 (half to even), (320 - 304) / 2 = 8.
    assert ob.center_crop_box(180, 320) == (4, 8, 171, 304)
    # 60 x 100 -> 57 x 95: 1.5 rounds to 2, 2.5 rounds to 2.
    assert ob.center_crop_box(60, 100) == (2, 2, 57, 95)
    # 2 x 3 -> int(1.9) = 1 x int(2.85) = 2, offsets round(0.5) = 0.
    assert ob.center_crop_box(2, 3) == (0, 0, 1, 2)


def _cams(wrist, left, right) -> dict:
    return {ob.WRIST: wrist, ob.EXTERIOR_LEFT: left, ob.EXTERIOR_RIGHT: right}


def test_stitch_layout_without_resizing():
    # 3 x 5 images crop to their top-left 2 x 4 (offsets 0), exactly the 2 x 4 view of a 4 x 8 frame.
    def image(base: int) -> np.ndarray:
        img = np.zeros((3, 5, 3), np.uint8)
        for r in range(3):
            for c in range(5):
                img[r, c] = (base + 10 * r + c, base + 1, 0)
        return img

    frame = ob.stitch_cameras(_cams(image(100), image(0), image(200)), height=4, width=8)
    assert frame.shape == (4, 8, 3) and frame.dtype == np.uint8
    assert frame[..., 0].tolist() == [
        [100, 100, 101, 101, 102, 102, 103, 103],  # wrist row 0, each column twice
        [110, 110, 111, 111, 112, 112, 113, 113],  # wrist row 1
        [0, 1, 2, 3, 200, 201, 202, 203],          # left exterior | right exterior, row 0
        [10, 11, 12, 13, 210, 211, 212, 213],      # row 1 (row 2 and column 4 were cropped away)
    ]
    assert frame[..., 1].tolist() == [[101] * 8, [101] * 8, [1] * 4 + [201] * 4, [1] * 4 + [201] * 4]


def test_stitch_resizes_bilinearly_with_half_pixel_centres():
    # 2 x 3 crops to one row of two pixels, resized to the 2 x 4 view: output column j samples
    # x = (j + 0.5) / 2 - 0.5 = -0.25, 0.25, 0.75, 1.25 (clamped at the edges), so a, b becomes
    # a, 3a/4 + b/4, a/4 + 3b/4, b, on both rows.
    img = np.full((2, 3, 3), 9, np.uint8)
    img[0, 0], img[0, 1] = (0, 100, 7), (200, 20, 7)
    frame = ob.stitch_cameras(_cams(img, img, img), height=4, width=8)
    assert frame[..., 0].tolist() == [[0, 0, 50, 50, 150, 150, 200, 200]] * 2 + [[0, 50, 150, 200] * 2] * 2
    assert frame[..., 1].tolist() == [[100, 100, 80, 80, 40, 40, 20, 20]] * 2 + [[100, 80, 40, 20] * 2] * 2
    assert frame[..., 2].tolist() == [[7] * 8] * 4


def test_stitch_at_droid_size_keeps_exactly_the_crop():
    # Rows 4..174 and columns 8..311 are kept: a border of 255 outside them never shows...
    cam = np.full((180, 320, 3), 255, np.uint8)
    cam[4:175, 8:312] = 10
    frame = ob.stitch_cameras(_cams(cam, cam, cam))
    assert frame.shape == (352, 640, 3) and np.unique(frame).tolist() == [10]
    # ...while one 255 line just inside the crop on any side does.
    for line in ((4, slice(8, 312)), (174, slice(8, 312)), (slice(4, 175), 8), (slice(4, 175), 311)):
        edged = cam.copy()
        edged[line] = 255
        assert ob.stitch_cameras(_cams(edged, cam, cam)).max() > 10
    for value in (0, 1, 77, 254, 255):  # a flat image stays flat through crop, resize and the uint8 cast
        flat = np.full((180, 320, 3), value, np.uint8)
        assert np.unique(ob.stitch_cameras(_cams(flat, flat, flat))).tolist() == [value]


def test_stitch_frames_one_by_one():
    rng = np.random.default_rng(0)
    stacks = [rng.integers(0, 256, (3, 30, 40, 3), dtype=np.uint8) for _ in range(3)]
    video = ob.stitch_cameras(_cams(*stacks), height=24, width=40)
    assert video.shape == (3, 24, 40, 3)
    for t in range(3):
        assert np.array_equal(video[t], ob.stitch_cameras(_cams(*(s[t] for s in stacks)), height=24, width=40))


def test_stitch_names_a_missing_or_bad_camera():
    img = np.zeros((3, 5, 3), np.uint8)
    with pytest.raises(ValueError, match="missing camera 'observation/exterior_image_1_left'"):
        ob.stitch_cameras({ob.WRIST: img, ob.EXTERIOR_LEFT: img})
    with pytest.raises(ValueError, match="camera 'observation/exterior_image_0_left' must be uint8"):
        ob.stitch_cameras(_cams(img, img.astype(np.float32), img))


# ----------------------------------------------------------------------------- state and actions


def _stats(q01: list, q99: list) -> dict:
    n = len(q01)
    return {"max": [9.0] * n, "min": [-9.0] * n, "mean": [0.0] * n, "std": [1.0] * n, "q01": q01, "q99": q99}


METADATA = {
    "agibot": {"statistics": {"state": {}, "action": {}}},
    "oxe_droid": {
        "statistics": {
            "state": {
                "joint_position": _stats([0, 0, 0, 0, 0, 0, -2], [2, 4, 2, 2, 2, 2, -2]),
                "gripper_position": _stats([0], [1]),
            },
            "action": {
                "joint_position": _stats([-0.5] * 7, [0.5] * 7),
                "gripper_position": _stats([0], [1]),
            },
        },
        "modalities": {"video": {"exterior_image_1_left": {"resolution": [320, 180], "channels": 3, "fps": 15}}},
        "embodiment_tag": "oxe_droid",
    },
}
JOINTS = np.array([1, 1, 3, -1, 0.5, 2, 0.25])


def test_state_is_normalised_clipped_and_padded():
    state = ob.Normalizer.from_metadata(METADATA).state(JOINTS, np.array([0.25]))
    assert state.dtype == np.float32 and state.shape == (64,)
    # 2 (x - q01) / (q99 - q01) - 1: 1 of [0, 2] -> 0; 1 of [0, 4] -> -0.5; 3 -> 2 clipped to 1;
    # -1 -> -2 clipped to -1; 0.5 -> -0.5; 2 -> 1; q01 == q99 passes 0.25 through; gripper 0.25 of [0, 1] -> -0.5.
    assert state[:8].tolist() == [0.0, -0.5, 1.0, -1.0, -0.5, 1.0, 0.25, -0.5]
    assert not state[8:].any()


def test_actions_are_unnormalised_joints_relative_gripper_absolute():
    normalized = np.zeros((24, 8), np.float32)
    normalized[0, 7] = -1
    normalized[1] = [1, -1, 0.5, 0, 0, 0, 0, 1]
    actions = ob.Normalizer.from_metadata(METADATA).actions(normalized, JOINTS)
    assert actions.dtype == np.float32 and actions.shape == (24, 8)
    # Joints: (a + 1) / 2 * 1 - 0.5 = a / 2, plus the last joint state; gripper: (a + 1) / 2, absolute.
    assert actions[0].tolist() == [*JOINTS.tolist(), 0.0]
    assert actions[1].tolist() == [1.5, 0.5, 3.25, -1, 0.5, 2, 0.25, 1.0]
    assert actions[2].tolist() == [*JOINTS.tolist(), 0.5]
    # The gripper of last_state is never added.
    assert np.array_equal(ob.Normalizer.from_metadata(METADATA).actions(normalized, [*JOINTS, 0.9]), actions)


@pytest.mark.parametrize("metadata, message", [
    ({"agibot": {}}, "metadata has no embodiment 'oxe_droid' (has ['agibot'])"),
    ({"oxe_droid": {"statistics": {"state": {}}}},
     "metadata['oxe_droid']['statistics']['state']['joint_position']['q01'] is missing"),
])
def test_normalizer_names_a_missing_entry(metadata, message):
    with pytest.raises(ValueError) as info:
        ob.Normalizer.from_metadata(metadata)
    assert str(info.value) == message


def test_normalizer_names_a_bad_entry():
    bad = {"oxe_droid": {"statistics": {**METADATA["oxe_droid"]["statistics"]}}}
    bad["oxe_droid"]["statistics"]["action"] = {**METADATA["oxe_droid"]["statistics"]["action"],
                                                "gripper_position": _stats([0], [1, 2])}
    with pytest.raises(ValueError) as info:
        ob.Normalizer.from_metadata(bad)
    assert str(info.value) == ("metadata['oxe_droid']['statistics']['action']['gripper_position']['q99'] "
                               "must be a list of 1 finite number, got [1, 2]")
    with pytest.raises(ValueError, match=r"must be \[T, 8\], got \[24, 7\]"):
        ob.Normalizer.from_metadata(METADATA).actions(np.zeros((24, 7)), JOINTS)


# ----------------------------------------------------------------------------- prompt


def test_prompt_template():
    assert ob.prompt_text("Pick up the Cup.") == (
        "A multi-view video shows that a robot pick up the cup. The video is split into three views: The top "
        "view shows the camera view from the robot's wrist, the bottom-left view shows the camera view from the "
        "left exterior camera, and the bottom-right view shows the camera view from the right exterior camera. "
        "During training, one of the two bottom exterior views may be a black screen (dropped view). The robot "
        "pick up the cup."
    )


def test_prompt_as_upstream_reads_it():
    tail = ob.prompt_text("x")[len(ob.TEMPLATE_HEAD) + 1:]
    # A Python literal is replaced by its value (a list by its first item); markers are dropped.
    assert ob.prompt_text("['Stack Blocks', 'other']") == ob.TEMPLATE_HEAD + "stack blocks" + tail[:-1] + "stack blocks"
    assert ob.prompt_text("<COTRAIN>wipe") == ob.prompt_text("wipe")
    assert ob.prompt_text("[]").endswith("The robot []")  # upstream raised on an empty list
    with pytest.raises(ValueError, match="task is over 1024 characters"):
        ob.prompt_text("a" * 1025)


# ----------------------------------------------------------------------------- one observation


def good_obs(frames: int | None = None, **over) -> dict:
    shape = (180, 320, 3) if frames is None else (frames, 180, 320, 3)
    obs = {
        ob.EXTERIOR_LEFT: np.full(shape, 1, np.uint8),
        ob.EXTERIOR_RIGHT: np.full(shape, 2, np.uint8),
        ob.WRIST: np.full(shape, 3, np.uint8),
        "observation/joint_position": np.arange(7, dtype=np.float32),
        "observation/cartesian_position": np.zeros(6),
        "observation/gripper_position": np.array([0.5]),
        "prompt": "wipe the table",
        "session_id": "3f1c-A",
    }
    obs.update(over)
    return {k: v for k, v in obs.items() if v is not None}


def test_validate_observation_returns_the_droid_fields():
    got = ob.validate_observation(good_obs())
    assert got.session_id == "3f1c-A" and got.task == "wipe the table" and got.frames == 1
    assert {k: (v.shape, int(v[0, 0, 0, 0])) for k, v in got.images.items()} == {
        ob.EXTERIOR_LEFT: ((1, 180, 320, 3), 1), ob.EXTERIOR_RIGHT: ((1, 180, 320, 3), 2),
        ob.WRIST: ((1, 180, 320, 3), 3)}
    assert got.joint_position.dtype == np.float64 and got.joint_position.tolist() == [0, 1, 2, 3, 4, 5, 6]
    assert got.gripper_position.tolist() == [0.5]
    four = ob.validate_observation(good_obs(frames=4, prompt=None, session_id=None))
    assert four.frames == 4 and four.task == "" and four.session_id is None


def test_validate_observation_reads_exteriors_numbered_from_one():
    # RoboArena's evaluator sends exterior_image_1_left (its left camera) and exterior_image_2_left.
    cams = {ob.EXTERIOR_LEFT: None, ob.EXTERIOR_RIGHT: np.full((180, 320, 3), 5, np.uint8),
            "observation/exterior_image_2_left": np.full((180, 320, 3), 6, np.uint8)}
    got = ob.validate_observation(good_obs(**cams))
    assert int(got.images[ob.EXTERIOR_LEFT][0, 0, 0, 0]) == 5 and int(got.images[ob.EXTERIOR_RIGHT][0, 0, 0, 0]) == 6


@pytest.mark.parametrize("over, message", [
    ({ob.WRIST: None}, "missing camera 'observation/wrist_image_left'"),
    ({ob.EXTERIOR_LEFT: np.zeros((180, 321, 3), np.uint8)},
     "camera 'observation/exterior_image_0_left' must be uint8 [180, 320, 3] or [T, 180, 320, 3] with T in [1, 24], "
     "got uint8 [180, 321, 3]"),
    ({ob.EXTERIOR_RIGHT: np.zeros((180, 320, 3), np.float32)},
     "camera 'observation/exterior_image_1_left' must be uint8 [180, 320, 3] or [T, 180, 320, 3] with T in [1, 24], "
     "got float32 [180, 320, 3]"),
    ({ob.WRIST: np.zeros((25, 180, 320, 3), np.uint8)},
     "camera 'observation/wrist_image_left' must be uint8 [180, 320, 3] or [T, 180, 320, 3] with T in [1, 24], "
     "got uint8 [25, 180, 320, 3]"),
    ({ob.WRIST: np.zeros((4, 180, 320, 3), np.uint8)},
     "camera 'observation/wrist_image_left' has 4 frames, 'observation/exterior_image_0_left' has one frame "
     "[H, W, 3]: every camera must carry the same"),
    ({"observation/joint_position": np.array([0, 0, np.nan, 0, 0, 0, 0])},
     "'observation/joint_position' has a non-finite value (NaN or inf) at index 2"),
    ({"observation/joint_position": np.zeros(6)}, "'observation/joint_position' must have shape [7], got [6]"),
    ({"observation/gripper_position": None}, "missing 'observation/gripper_position' (float [1])"),
    ({"observation/gripper_position": np.array([np.inf])},
     "'observation/gripper_position' has a non-finite value (NaN or inf) at index 0"),
    ({"prompt": "a" * 1025}, "'prompt' is over 1024 characters"),
    ({"prompt": 7}, "'prompt' must be a string, got int"),
    ({"session_id": 12}, "session_id must be 1-128 characters of [A-Za-z0-9_.:@/+-]"),
    ({"session_id": "s" * 129}, "session_id must be 1-128 characters of [A-Za-z0-9_.:@/+-]"),
    ({"session_id": "has space"}, "session_id must be 1-128 characters of [A-Za-z0-9_.:@/+-]"),
])
def test_validate_observation_names_the_bad_field(over, message):
    with pytest.raises(ProtocolError) as info:
        ob.validate_observation(good_obs(**over))
    assert str(info.value) == message


def test_metadata_is_roboarenas_config_for_dreamzero():
    wire = ob.METADATA.to_wire()
    assert {k: wire[k] for k in ("image_resolution", "needs_wrist_camera", "n_external_cameras",
                                 "needs_stereo_camera", "needs_session_id", "action_space")} == {
        "image_resolution": [180, 320], "needs_wrist_camera": True, "n_external_cameras": 2,
        "needs_stereo_camera": False, "needs_session_id": True, "action_space": "joint_position"}
    assert wire["image_keys"] == list(ob.CAMERA_KEYS) and wire["action_horizon"] == 24 and wire["action_dim"] == 8
    assert ob.METADATA.needs_session_id
