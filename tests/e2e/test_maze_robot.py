"""The maze simulator as a robot through a real server: openpi-client + ActionChunkBroker, the trained policy."""

from __future__ import annotations

import pytest
import torch
from openpi_client.websocket_client_policy import WebsocketClientPolicy

from models.policy.maze.adapter import MazePolicy
from models.policy.maze.episodes import Episodes
from models.policy.maze.model import MazeFlowModel, config, save_policy
from models.policy.maze.robot import check_metadata, main as robot_main, run_episode, state_layout
from models.policy.maze.training.evaluate import drive_policy
from tests.e2e.test_openpi_ws import PATH, running

BUDGET = 24  # frames: 6 policy calls an episode keeps the test fast on CPU


@pytest.mark.parametrize("layout", ["keys", "memory"])
def test_robot_episodes_through_the_server_equal_the_in_process_evaluation(tmp_path, layout):
    # A tiny random policy of each state layout (the memory one: odometry, visits, sky panorama,
    # which the robot builds on its side of the wire), whichever the shipped weights read.
    torch.manual_seed(0)
    weights = tmp_path / f"{layout}.safetensors"
    save_policy(MazeFlowModel(config(layout, d_model=32, num_heads=2, num_layers=1)), weights)
    policy = MazePolicy(weights, max_batch=4)
    reference = MazePolicy(weights, max_batch=4)
    with running(policy) as addr:
        robot = WebsocketClientPolicy(host=f"ws://{addr}{PATH}")
        assert check_metadata(robot.get_server_metadata()) == 4
        assert state_layout(robot.get_server_metadata()) == layout
        for seed, kind in ((0, "wall"), (1, "marker")):
            report = run_episode(robot, seed, kind, BUDGET)
            assert report.policy_calls == BUDGET // 4 or report.success
            ep = Episodes([seed], kind, budget=BUDGET, layout=layout)
            calls = drive_policy(ep, reference)
            # Same pixels, same seeds, same batch of one: the same keys, so the same pose.
            assert (report.success, report.frames, report.policy_calls) == (bool(ep.success[0]), int(ep.frames[0]), calls)
            assert report.pose == (float(ep.sim.pos[0, 0]), float(ep.sim.pos[0, 1]), float(ep.sim.yaw[0]))
            assert report.prompt == ep.prompts()[0]
        out = tmp_path / "robot.json"
        assert robot_main(["--url", f"ws://{addr}{PATH}", "--episodes", "1", "--budget", "8", "--out", str(out)]) == 0
        assert '"episodes": 2' in out.read_text()


def test_the_robot_cli_says_in_one_line_when_no_server_listens(capsys):
    assert robot_main(["--url", "ws://127.0.0.1:1/v1/realtime/robot/openpi", "--episodes", "1"]) == 2
    assert capsys.readouterr().err.startswith("cannot talk to ws://127.0.0.1:1/v1/realtime/robot/openpi: ")
    with pytest.raises(SystemExit):
        robot_main(["--episodes", "0"])
    assert "--episodes: must be >= 1, got 0" in capsys.readouterr().err
