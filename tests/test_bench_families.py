"""``storelab bench families --quick``: the rows are there and the two sides computed the same function (no time
is asserted: benches are read as ratios, never held in a test)."""

import json

from typer.testing import CliRunner

from storelab.cli import app


def test_bench_families_quick_json():
    r = CliRunner().invoke(app, ["bench", "families", "--quick", "--json"])
    assert r.exit_code == 0, r.output
    rows = json.loads(r.output)["families"]["rows"]
    assert [o["family"] for o in rows] == ["nemotron_h"]
    for o in rows:
        assert o["logits_rel_diff"] < 1e-4 and o["ours_ms"] > 0 and o["peer_ms"] > 0 and o["target"] == 2.0
