"""docs/nki.md's API table is the one the code generates (it cannot drift),
and it lists every call of the public API, implemented or not."""
import os
import subprocess
import sys

from tern.nki import _api_table

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")


def test_docs_table_matches_the_code():
    r = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "nki_api_table.py"), "--check"],
                       capture_output=True, text=True, env=dict(os.environ))
    assert r.returncode == 0, r.stderr


def test_every_public_name_has_a_row_with_a_status():
    rows = _api_table.table().splitlines()[2:]
    assert len(rows) >= len(_api_table.CURRENT_ISA) + len(_api_table.LANGUAGE)
    for row in rows:
        status = row.rsplit("|", 2)[-2].strip()
        assert status.startswith(("supported", "partial: ", "not yet")), row


def test_unimplemented_calls_are_marked_not_yet():
    from tern.nki import _tracer
    assert _api_table.status_of(_tracer.not_yet("nki.isa.example")) == "not yet"
    rows = {r.split("`")[1]: r for r in _api_table.table().splitlines()[2:]}
    assert rows["nki.isa.max8"].endswith("| supported |")
    assert "partial: " in rows["nki.isa.nc_matmul"]
