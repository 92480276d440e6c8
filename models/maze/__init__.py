"""The maze: a batched torch raycast simulator with goals, the environment that the maze world
model learned to imitate and the maze policy learned to navigate. Both import it from here.

    sim.py        MazeSim: batched raycast maze (CPU/CUDA), 64x64 RGB, W A S D I J K L
    goals.py      goal walls / floor markers with beacons, prompts, the success rule
    planner.py    the shortest-path expert on the true map; goal_sim / goal_seeds build goal episodes
    scanner.py    a teacher that knows only what the robot has seen (corridor_view)
    seen_map.py   SeenMap: the robot's map as seen, turned to its heading (the policy's map state)
    sim_world.py  MazeSimWorld: the goal simulator itself served as a world (factory row maze-sim)
    training/     what only training and evaluation use (kept out of the wheel)
"""
