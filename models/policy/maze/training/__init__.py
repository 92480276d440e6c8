"""Training and evaluating the maze policy; not installed (pyproject's packages.find excludes
every ``training`` package), run from a clone.

    train.py              python -m models.policy.maze.training.train --minutes N --out DIR [--resume CKPT]
    evaluate.py           python -m models.policy.maze.training.evaluate [--mazes 200 --out JSON]
"""
