"""Sequence parallel (Ulysses) for the Wan-block world models: one session over N ranks.

    ulysses.py   Ulysses: the rank's token shard, the all-to-alls around attention (heads
                 scattered / tokens gathered, and back), the head share of K/V, per-rank kv geometry

Every rank holds the weights and runs the same forward on its share of the block's tokens;
attention sees every token of its heads (``H / N`` per rank), so each rank's kv/ pool holds
its heads' share of every session's K/V. The process group itself (rank 0 serving, the
others mirroring its calls) is the server's: ``realtime/engine/group.py``.
"""
