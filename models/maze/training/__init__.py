"""What only training and evaluation drive the simulator with; not installed (pyproject's
packages.find excludes every ``training`` package).

    scripted.py   ScriptedPolicy: sticky key combos, 1-8 frames, forward-biased (the world
                  model's training data, the policy evaluation's random baseline)
"""
