"""One session over N ranks for the Wan-block models: sequence parallel (Ulysses) or, for a
guided model on two ranks, one CFG branch a rank.

    ulysses.py   Ulysses: the rank's token shard, the all-to-alls around attention (heads
                 scattered / tokens gathered, and back), the head share of K/V, per-rank kv geometry
    cfg.py       CfgSplit: two ranks, one CFG branch each, both branches' outputs all-gathered

Every rank holds the weights. Under Ulysses each runs the same forward on its share of the
block's tokens; attention sees every token of its heads (``H / N`` per rank), so each rank's
kv/ pool holds its heads' share of every session's K/V. Under a CFG split each rank runs its
branch's rows and its pool holds that branch's K/V. The process group itself (rank 0 serving,
the others mirroring its calls) is the server's: ``realtime/engine/group.py``.
"""
