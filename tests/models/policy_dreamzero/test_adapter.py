"""DreamZeroPolicy on the tiny checkpoint (DROID's action register): per-session windows, batching
that does not change a session's chunks (sessions at different window positions share every
denoising forward), reset, K/V in kv/'s pool swapped to the host and back,
admission, drops, bad observations, uncommitted ticks."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from models.base import ModelError
from models.policy.base import PolicyWork
from models.policy.dreamzero import load_policy
from models.policy.dreamzero.adapter import EVICTED_REASON, RECLAIMED_REASON
from models.policy.dreamzero.config import TINY_DROID
from models.policy.dreamzero.observation import METADATA, droid_observation
from models.policy.dreamzero.tiny_checkpoint import write_tiny_checkpoint, write_tiny_tokenizer
from protocols.openpi import validate_observation
from protocols.roboarena import JOINT_POSITION


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("dreamzero_served")
    return str(write_tiny_checkpoint(root / "ckpt", cfg=TINY_DROID)), str(write_tiny_tokenizer(root / "tok"))


@pytest.fixture
def policy(folders):
    return load_policy(*folders, sessions=3)


def observation(seed: int, call: int, prompt: str = "wipe the table", **over):
    """Call ``call`` of an episode ``seed`` (``droid_observation``), ``over`` in place of its
    fields, checked as the OpenPI layer checks it."""
    return validate_observation({**droid_observation(seed, call, prompt=prompt), **over}, METADATA)


def step(policy, calls: dict[str, tuple[int, int]], commit: bool = True) -> dict[str, np.ndarray]:
    """One engine call: session -> (episode seed, call index); returns session -> actions."""
    works = [PolicyWork(sid, f"{sid}:{call}", observation(seed, call)) for sid, (seed, call) in calls.items()]
    results = policy.run_batch(works)
    for w in works:
        policy.end_tick(w.session_id, commit)
    return {r.session_id: r.actions for r in results}


def episode(policy, sid: str, seed: int, calls: int) -> list[np.ndarray]:
    return [step(policy, {sid: (seed, i)})[sid] for i in range(calls)]


def test_chunks_are_droid_actions_and_the_window_walks(policy):
    starts = []
    for i in range(5):
        actions = step(policy, {"a": (0, i)})["a"]
        assert actions.shape == (24, 8) and actions.dtype == np.float32 and np.isfinite(actions).all()
        starts.append(policy._sessions["a"].start)
    # TINY: chunks of 2 latent frames, a window of 5: restart (first call), continue, restart, ...
    assert starts == [3, 5, 3, 5, 3]
    assert [len(policy._sessions["a"].history)] == [4]


def dit_rows(policy) -> tuple[list[int], object]:
    """The rows of every DiT forward from now on (a hook on the DiT) and the hook's handle."""
    rows: list[int] = []
    return rows, policy.ckpt.dit.register_forward_hook(lambda module, args, out: rows.append(args[0].shape[0]))


def test_a_session_beside_another_one_call_behind_shares_its_denoising_forwards(policy):
    alone = episode(policy, "solo", seed=7, calls=4)
    policy.reset("solo")
    # z one call behind: at TINY's 2-call window one of the two restarts and the other goes on
    # in every call, so they write in two t = 0 passes (a restart writes 1 frame, a chunk 2),
    # then denoise in one forward of 2 sessions x 2 branches.
    rows, hook = dit_rows(policy)
    try:
        beside = [step(policy, {"x": (7, i), **({"z": (9, i - 1)} if i else {})})["x"] for i in range(4)]
    finally:
        hook.remove()
    assert rows == [2] * 17 + ([2, 2] + [4] * 16) * 3
    # Rows of one forward: x's chunks are its chunks alone to float32 rounding (a batch of 2 rows
    # takes other CPU matrix kernels than one, last bits apart).
    for a, b in zip(alone, beside):
        np.testing.assert_allclose(b, a, rtol=0, atol=2e-6)


@pytest.fixture(scope="module")
def droid_window_folders(tmp_path_factory):
    """TINY_DROID with DROID's window: 9 latent frames (4 calls a window), 9 condition latents."""
    root = tmp_path_factory.mktemp("dreamzero_window")
    cfg = dataclasses.replace(TINY_DROID, max_chunk_size=4, num_frames=33)
    return str(write_tiny_checkpoint(root / "ckpt", cfg=cfg)), str(write_tiny_tokenizer(root / "tok"))


@pytest.mark.parametrize("step_cache", [False, True])
def test_sessions_started_one_call_apart_share_every_denoising_forward(droid_window_folders, step_cache):
    policy = load_policy(*droid_window_folders, sessions=3, step_cache=step_cache)
    seeds, calls = {"x": 7, "y": 8, "z": 9}, 6
    alone = {}
    for k, (sid, seed) in enumerate(seeds.items()):
        alone[sid] = episode(policy, sid, seed, calls - k)
        policy.reset(sid)
    rows, hook = dit_rows(policy)
    starts, got = [], {sid: [] for sid in seeds}
    try:
        for i in range(calls):
            # x at its call i, y one call behind, z two: from the third engine call on, three
            # different window positions (DROID's walk: 0 restart, 3, 5, 7, then restart).
            starts.append({sid: policy._sessions[sid].start if sid in policy._sessions else 0
                           for k, sid in enumerate(seeds) if i - k >= 0})
            out = step(policy, {sid: (seed, i - k) for k, (sid, seed) in enumerate(seeds.items()) if i - k >= 0})
            for sid, actions in out.items():
                got[sid].append(actions)
    finally:
        hook.remove()
    assert starts == [{"x": 0}, {"x": 3, "y": 0}, {"x": 5, "y": 3, "z": 0}, {"x": 7, "y": 5, "z": 3},
                      {"x": 9, "y": 7, "z": 5}, {"x": 3, "y": 9, "z": 7}]
    # Per engine call: the restarting sessions' t = 0 pass, the continuing ones', then the
    # denoising passes (16, or 8 with the step cache), each over every session x 2 branches.
    steps = 8 if step_cache else 16
    writes = [[2], [2, 2], [2, 4], [6], [2, 4], [2, 4]]
    assert rows == [n for w in writes for n in w + [sum(w)] * steps]
    for sid in seeds:
        assert len(got[sid]) == len(alone[sid])
        for a, b in zip(alone[sid], got[sid]):
            np.testing.assert_allclose(b, a, rtol=0, atol=2e-6)
    assert np.abs(got["x"][2] - got["y"][2]).max() > 1e-2


def test_a_failed_mixed_call_leaves_every_session_as_it_was(folders):
    policy = load_policy(*folders, sessions=3)
    want = {sid: episode(load_policy(*folders, sessions=1), sid, seed, 3) for sid, seed in (("a", 1), ("b", 2))}
    step(policy, {"a": (1, 0)})
    step(policy, {"a": (1, 1), "b": (2, 0)})
    before = {sid: policy._sessions[sid] for sid in "ab"}
    states = {sid: policy.residency.state(sid) for sid in "ab"}
    free = policy.cache.num_free_blocks
    # a restarts (TINY: its call 2) and b goes on (its call 1); the forward fails in a denoising pass.
    rows, hook = dit_rows(policy)

    def second_denoising_pass(module, args, out):
        if len(rows) == 4:
            raise RuntimeError("boom")
    fail = policy.ckpt.dit.register_forward_hook(second_denoising_pass)
    try:
        with pytest.raises(RuntimeError, match="boom"):
            policy.run_batch([PolicyWork("a", "a:2", observation(1, 2)), PolicyWork("b", "b:1", observation(2, 1))])
    finally:
        fail.remove()
        hook.remove()
    assert rows[:3] == [2, 2, 4]                     # both t = 0 passes ran, then the shared forward
    for sid in "ab":
        policy.end_tick(sid, False)
        assert policy._sessions[sid] is before[sid] and policy.residency.state(sid) is states[sid]
        assert not policy.cache.in_flight(sid)
    assert policy.cache.num_free_blocks == free
    assert (policy.cache.committed_frames("a"), policy.cache.committed_frames("b")) == (3, 1)
    got = step(policy, {"a": (1, 2), "b": (2, 1)})
    np.testing.assert_allclose(got["a"], want["a"][2], rtol=0, atol=2e-6)
    np.testing.assert_allclose(got["b"], want["b"][1], rtol=0, atol=2e-6)


def test_sessions_at_one_window_position_share_a_forward(policy):
    alone = episode(policy, "solo", seed=7, calls=4)
    policy.reset("solo")
    rows, hook = dit_rows(policy)
    try:
        both = [step(policy, {"x": (7, i), "y": (8, i)}) for i in range(4)]
    finally:
        hook.remove()
    # Each call: one t = 0 pass and 16 denoising passes, every one over 2 sessions x 2 branches.
    assert rows == [4] * 17 * 4
    # Rows of one forward: x's chunks are its chunks alone to float32 rounding (a batch of 2
    # rows takes other CPU matrix kernels than one, last bits apart: 5e-7 seen), y's are its own.
    for a, b in zip(alone, both):
        np.testing.assert_allclose(b["x"], a, rtol=0, atol=2e-6)
        assert np.abs(b["y"] - a).max() > 1e-2
    assert policy.resident == ("x", "y")


def test_reset_gives_the_first_calls_chunk_again(policy):
    first = episode(policy, "a", seed=1, calls=2)
    policy.reset("a")
    assert "a" not in policy.resident
    again = episode(policy, "a", seed=1, calls=2)
    for a, b in zip(first, again):
        np.testing.assert_array_equal(a, b)
    assert not np.array_equal(first[0], first[1])


def test_an_uncommitted_tick_leaves_the_session_as_it_was(policy):
    step(policy, {"a": (2, 0)})
    before = policy._sessions["a"]
    failed = step(policy, {"a": (2, 1)}, commit=False)["a"]
    assert policy._sessions["a"] is before and policy.resident == ("a",)
    np.testing.assert_array_equal(step(policy, {"a": (2, 1)})["a"], failed)


def test_an_uncommitted_restart_leaves_the_session_and_the_pool_as_they_were(policy):
    step(policy, {"a": (2, 0)})
    step(policy, {"a": (2, 1)})
    before, free = policy._sessions["a"], policy.cache.num_free_blocks
    state = policy.residency.state("a")
    failed = step(policy, {"a": (2, 2)}, commit=False)["a"]     # TINY: call 2 restarts the window
    assert policy._sessions["a"] is before and policy.residency.state("a") is state
    assert policy.cache.num_free_blocks == free and policy.cache.committed_frames("a") == 3
    np.testing.assert_array_equal(step(policy, {"a": (2, 2)})["a"], failed)
    assert policy.cache.committed_frames("a") == 1 and policy.cache.num_free_blocks == free + 4


def test_an_idle_session_swaps_to_the_host_and_back_with_the_same_chunks(folders):
    alone = episode(load_policy(*folders, sessions=1), "a", seed=12, calls=4)
    policy = load_policy(*folders, sessions=1)                  # one session resident at a time
    got = [step(policy, {"a": (12, i)})["a"] for i in range(2)]
    step(policy, {"b": (13, 0)})                                # a swaps out to the host
    assert policy.resident == ("b",) and policy.swapped == ("a",)
    m = policy.kv_usage()
    # a after 2 calls: 3 frames x 2 branches of 2 layers x 2 (K, V) x 4 tokens x 24 floats,
    # plus its state (cross K/V of both branches and y).
    assert m["swap_outs"] == 1 and m["host_bytes"] == 3 * 2 * 2 * 2 * 4 * 24 * 4 + policy.geometry.model_state_bytes
    got += [step(policy, {"a": (12, i)})["a"] for i in (2, 3)]  # back (b out), a restart, then on
    assert policy.kv_usage()["swap_ins"] == 1 and policy.swapped == ("b",)
    for a, b in zip(alone, got):
        np.testing.assert_array_equal(a, b)


def test_close_and_reset_give_every_block_and_byte_back(folders):
    policy = load_policy(*folders, sessions=2)
    kv = policy.describe()["kv"]
    assert kv["resident_sessions"] == 2 and kv["session_bytes"] > 0 and kv["host_budget_bytes"] == 64 << 30
    idle = policy.kv_usage()
    for sid, seed in (("a", 1), ("b", 2), ("c", 3)):           # c's arrival swaps a out
        for i in range(2):
            step(policy, {sid: (seed, i)})
    m = policy.kv_usage()
    assert m["swapped_sessions"] == 1 and m["free_blocks"] < idle["free_blocks"] and m["model_state_bytes"] > 0
    policy.reset("a")                                           # swapped: its host copy goes
    policy.drop_session("b")                                    # resident: its blocks go
    policy.reset("c")
    m = policy.kv_usage()
    assert (m["free_blocks"], m["resident_sessions"], m["swapped_sessions"], m["host_bytes"],
            m["model_state_bytes"]) == (idle["free_blocks"], 0, 0, 0, 0)


def test_a_new_session_is_refused_busy_when_device_and_host_are_full(folders):
    policy = load_policy(*folders, sessions=2, host_budget_bytes=0)
    want = episode(load_policy(*folders, sessions=1), "a", seed=3, calls=2)
    np.testing.assert_array_equal(step(policy, {"a": (3, 0)})["a"], want[0])
    step(policy, {"c": (5, 0)})
    free = policy.cache.num_free_blocks
    refused = (r"^busy: session b: no room for a new session: it needs [0-9.]+ KiB of KV memory; free: 0 B on "
               r"the device \(2 sessions held, 2 resident slots\) and 0 B of the 0 B host swap budget")
    with pytest.raises(ModelError, match=refused):
        step(policy, {"b": (4, 0)})
    with pytest.raises(ModelError, match=refused):              # beside a: nothing of a's changes either
        policy.run_batch([PolicyWork("a", "a:1", observation(3, 1)), PolicyWork("b", "b:0", observation(4, 0))])
    assert policy.resident == ("a", "c") and "b" not in policy.cache and policy.cache.num_free_blocks == free
    np.testing.assert_array_equal(step(policy, {"a": (3, 1)})["a"], want[1])
    policy.drop_session("c")
    step(policy, {"b": (4, 0)})                                 # room again
    assert policy.resident == ("a", "b")


def test_a_new_session_reclaims_the_oldest_episode_no_robot_holds(folders):
    # Robots that start each episode under a new id and never reset: the episodes their robots
    # left are reclaimed, least recently used first; one a robot still holds never is.
    policy = load_policy(*folders, sessions=1, host_budget_bytes=0)
    dropped = []
    policy.set_drop_listener(lambda sid, why: dropped.append((sid, why)))
    want = episode(load_policy(*folders, sessions=1), "c", seed=5, calls=2)
    step(policy, {"a": (3, 0)})
    with pytest.raises(ModelError, match=r"^busy: session b: "):   # a's robot is still here
        step(policy, {"b": (4, 0)})
    policy.detach("a")                                          # a's connection ended
    policy.detach("nobody")                                     # an id the policy does not hold: nothing
    for i in range(2):                                          # c's chunks: as in a policy with room
        np.testing.assert_array_equal(step(policy, {"c": (5, i)})["c"], want[i])
    assert dropped == [("a", RECLAIMED_REASON)] and policy.resident == ("c",)
    with pytest.raises(ModelError, match=r"^session a: its state was evicted"):
        step(policy, {"a": (3, 1)})
    policy.reset("a")
    policy.detach("c")
    step(policy, {"a": (3, 0)})                                 # a starts over, c's room reclaimed
    assert dropped[-1] == ("c", RECLAIMED_REASON) and policy.resident == ("a",)
    step(policy, {"a": (3, 1)})                                 # a's next call attaches it again
    policy.detach("a")
    step(policy, {"a": (3, 2)})                                 # a call re-attaches a detached episode
    with pytest.raises(ModelError, match=r"^busy: session d: "):
        step(policy, {"d": (6, 0)})


def test_a_session_dropped_from_the_host_is_reported_and_refused_until_reset(folders):
    policy = load_policy(*folders, sessions=1)
    dropped = []
    policy.set_drop_listener(lambda sid, why: dropped.append((sid, why)))
    step(policy, {"a": (3, 0)})
    step(policy, {"b": (3, 0)})                                 # a on the host
    policy.residency.host_budget_bytes = 0                      # the host budget shrinks under them
    step(policy, {"a": (3, 1)})                                 # b has nowhere to go: dropped
    assert dropped == [("b", EVICTED_REASON)] and policy.resident == ("a",) and policy.swapped == ()
    refused = (r"^session b: its state was evicted \(device and host memory for sessions were full\); "
               r"reset it to start over$")
    with pytest.raises(ModelError, match=refused):
        step(policy, {"b": (3, 1)})
    policy.reset("b")
    policy.drop_session("a")
    step(policy, {"b": (3, 0)})                                 # starts over


def test_a_bad_observation_names_its_field_and_leaves_the_other_session_untouched(policy, folders):
    control = load_policy(*folders, sessions=3)
    want = episode(control, "good", seed=4, calls=2)
    assert np.array_equal(step(policy, {"good": (4, 0)})["good"], want[0])
    bad = observation(5, 0)
    joints = np.array([0, 0, np.nan, 0, 0, 0, 0], np.float64)
    bad = dataclasses.replace(bad, extras={**bad.extras, JOINT_POSITION: joints})
    works = [PolicyWork("good", "g1", observation(4, 1)), PolicyWork("bad", "b0", bad)]
    with pytest.raises(ModelError) as info:
        policy.run_batch(works)
    assert str(info.value) == ("session bad: invalid observation: 'observation/joint_position' has a non-finite "
                               "value (NaN or inf) at index 2")
    assert policy.resident == ("good",)
    np.testing.assert_array_equal(step(policy, {"good": (4, 1)})["good"], want[1])


def test_a_new_prompt_restarts_the_window(policy):
    step(policy, {"a": (6, 0)})
    works = [PolicyWork("a", "a1", observation(6, 1, prompt="open the drawer"))]
    policy.run_batch(works)
    policy.end_tick("a", True)
    assert policy._sessions["a"].start == 3           # a restart's next start, not 5


def test_step_cache_runs_eight_dit_steps(folders):
    cached = load_policy(*folders, sessions=1, step_cache=True)
    full = load_policy(*folders, sessions=1)
    a, b = step(cached, {"a": (0, 0)})["a"], step(full, {"a": (0, 0)})["a"]
    assert cached.dit_steps == (0, 1, 2, 6, 10, 13, 14, 15) and full.dit_steps is None
    assert a.shape == b.shape and not np.array_equal(a, b)


def test_more_sessions_in_one_call_than_may_be_resident_are_refused_before_anything_changes(policy):
    step(policy, {"a": (0, 0)})
    assert policy.max_batch == 3
    works = [PolicyWork(sid, f"{sid}:0", observation(0, 0)) for sid in "bcde"]
    with pytest.raises(ModelError, match="4 sessions in one call, 3 may be resident"):
        policy.run_batch(works)
    assert policy.resident == ("a",)
