"""The maze world: a torch raycast maze simulator and a small action-conditioned AR-diffusion model
trained on it here, served as the default world.

    sim.py        MazeSim: batched raycast maze (CPU/CUDA), 64x64 RGB, W A S D I J K L
    policy.py     ScriptedPolicy: sticky key combos, 1-8 frames, forward-biased
    data.py       ClipStream: training clips rendered on the training device
    attention.py  attend(): the one attention call; frame-causal masks
    model.py      MazeDiT: frame-causal pixel DiT (x0-prediction, per-frame adaLN)
    cache.py      FrameCache: contiguous sink + window K/V rows (evaluation)
    rollout.py    denoise_frame / write_frame / next_frame: Euler sampling + clean pass
    weights.py    safetensors save/load (config in metadata); DEFAULT_WEIGHTS
    train.py      python -m models.world.maze.train --minutes N --out DIR [--resume CKPT]
    evaluate.py   python -m models.world.maze.evaluate [--mazes 256 --out JSON]
    adapter.py    MazeWorld(ModelAdapter): served through kv/'s paged cache
    goals.py      goal walls / floor markers with beacons, prompts, the success rule
    planner.py    the shortest-path expert on the true map (policy training, evaluation)
    scanner.py    a teacher that knows only what the robot has seen (corridor_view)
    seen_map.py   SeenMap: the robot's map as seen, turned to its heading (the policy's map state)
    sim_world.py  MazeSimWorld: the goal simulator itself served as a world (maze-sim)
    MODEL_CARD.md what was trained, how, and how well
"""
