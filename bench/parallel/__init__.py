"""Runs that need several GPUs of one host (bench/multi_gpu.sh): one LingBot-World session with
sequence parallel over 1, 2 and 4 ranks, DreamZero on 2, and the one JSON all steps go into.

    record.py          the machine (CPUs, GPUs and their links, versions), a step's JSON, the merge
    random_lingbot.py  a LingBot-World checkpoint at full size with random weights, written once
    lingbot_sp.py      one LingBot session served with --sequence-parallel 1, 2, 4: chunk time, key to frame
    dreamzero_sp.py    DreamZero on 2 ranks where its entry says it splits, else the reason it is skipped

The replicas step is bench/deploy/gpu_replicas.py.
"""
