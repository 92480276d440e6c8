"""DreamZero split over 2 gloo ranks, driven as the server drives it (rank 0's calls mirrored to
rank 1), makes the actions one process makes: Ulysses (the tiny DiT's 2 heads, one a rank) and
the CFG split (one branch a rank).

Tolerance: actions (up to about 5 in size) agree to 1e-4 (float32, 16 denoising passes a call
whose rounding may follow the row and token counts each rank's layers see; measured: equal
under Ulysses, 4.8e-7 apart under the CFG split, whose forwards have half the rows). Under
Ulysses each rank's K/V pages are the one-process pages' head of that rank, to 1e-5 (measured:
equal). Swaps, a detached session
reclaimed for a new one, the refusal that follows, reset and drop leave the same sessions,
counters and blocks as on one process, on both ranks.
"""

from __future__ import annotations

import pytest
import torch

from tests.parallel.dreamzero_ranks import policy_of, scenario
from tests.parallel.dreamzero_splits import SPLITS
from tests.parallel.ranks import run_ranks
from tests.support.threads import torch_threads

ATOL = 1e-4
PAGES_ATOL = 1e-5


@pytest.fixture(scope="module")
def folders(dreamzero_folders):
    return dreamzero_folders


@pytest.fixture(scope="module")
def single(folders):
    with torch_threads(1):   # as the ranks run (the sums in the same order)
        return scenario(policy_of(*folders))


def test_one_process_scenario(single):
    # a's 5 calls, b's first, c's, a's first again; b's second refused (reclaimed for c).
    assert len(single["actions"]) == 7 and single["errors"] == [("b", "session b")]
    assert single["dropped"] == [("b", "policy state reclaimed for a new session")]
    torch.testing.assert_close(single["actions"][6], single["actions"][0], rtol=0, atol=0)   # reset replays
    assert single["swaps"] == (4, 1) and single["sessions"] == []
    assert single["describe"]["sequence_parallel"] == 1 and single["describe"]["split"] is None


@pytest.fixture(scope="module")
def ranks(folders, tmp_path_factory):
    out = tmp_path_factory.mktemp("dreamzero_ranks_out")
    done = run_ranks(2, "tests.parallel.dreamzero_ranks", *folders, str(out), timeout=120)
    assert [p.returncode for p in done] == [0, 0], "\n".join(p.stdout[-3000:] for p in done)
    return [torch.load(out / f"rank{r}.pt", weights_only=False) for r in (0, 1)]


@pytest.mark.parametrize("how", SPLITS)
def test_split_calls_equal_one_process(how, single, ranks):
    got = [r[how] for r in ranks]
    lead = got[0]
    assert len(lead["actions"]) == len(single["actions"])
    for a, b in zip(lead["actions"], single["actions"]):
        torch.testing.assert_close(a, b, rtol=0, atol=ATOL)
    for key in ("errors", "dropped", "swaps", "resident", "swapped"):
        assert lead[key] == single[key], key
    assert lead["describe"]["sequence_parallel"] == 2 and lead["describe"]["split"] == how
    for rank, g in enumerate(got):   # every rank ends where one process ends
        assert g["sessions"] == [] and g["swaps"] == single["swaps"], rank
        assert (g["free_blocks"], g["total_blocks"]) == (got[0]["free_blocks"], got[0]["total_blocks"]), rank
    if how == "heads":
        # Rank 0's pool holds its head of each page (both branches), nothing more; same blocks.
        assert (lead["free_blocks"], lead["total_blocks"]) == (single["free_blocks"], single["total_blocks"])
        for key in ("pages_k", "pages_v"):
            assert lead[key].shape[-2] == 1
            torch.testing.assert_close(lead[key], single[key][..., :1, :], rtol=0, atol=PAGES_ATOL)
    else:
        # One branch a rank: half the pages of a session, every head.
        assert lead["describe"]["kv"]["session_bytes"] < single["describe"]["kv"]["session_bytes"]
        assert lead["pages_k"].shape[-2] == single["pages_k"].shape[-2]


def test_the_cfg_split_needs_a_group_of_two(folders):
    from models.factory import BuildOptions
    from models.policy.dreamzero import build
    from models.policy.dreamzero.options import OptionError

    ckpt, tok = folders
    with pytest.raises(OptionError, match="on 2 ranks: serve with --sequence-parallel 2$"):
        build(ckpt, BuildOptions(model_options=(("tokenizer", tok), ("cfg_parallel", "1"))))
