"""bench/openpi/profile_app.py drives the real app in memory: every variant answers every
request, the served variant's requests reach the engine, and the endpoint's handler is
left as it was."""

from __future__ import annotations

import argparse
import asyncio

from bench.openpi import profile_app
from realtime.openpi_ws import OpenPIConnection


def test_profile_app_measures_every_variant_through_the_real_app():
    handle = OpenPIConnection.handle
    result = asyncio.run(profile_app._run(argparse.Namespace(messages=20, repeats=2)))
    assert OpenPIConnection.handle is handle
    assert set(result["variants"]) == set(profile_app.VARIANTS)
    for row in result["variants"].values():
        assert len(row["repeats"]) == 2 and all(us > 0 for us in row["repeats"])
    # "ours-submit" and "ours" submit to the engine: 20 requests x 2 repeats each, inline or not.
    assert result["engine_works"] == 80 and 0 <= result["engine_inline_works"] <= 80
    assert set(result["steps_of_min"]) == {"ours-min_minus_starlette_us", "ours-decode_minus_ours-min_us",
                                           "ours-policy_minus_ours-decode_us", "ours-submit_minus_ours-policy_us",
                                           "ours_minus_ours-submit_us"}
