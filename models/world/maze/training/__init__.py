"""Training and evaluating the maze world model; not installed (pyproject's packages.find
excludes every ``training`` package), run from a clone.

    data.py       ClipStream: training clips rendered on the training device
    train.py      python -m models.world.maze.training.train --minutes N --out DIR [--resume CKPT]
    evaluate.py   python -m models.world.maze.training.evaluate [--mazes 256 --out JSON]
"""
