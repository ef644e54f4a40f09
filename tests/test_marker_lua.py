"""etc/job_submit.lua agrees with slurm_elastic.marker on every input.

The shipped plugin runs here in a stand-alone Lua 5.1 interpreter (the version Debian's
job_submit_lua.so embeds; installed by scripts/install-deps.sh) with a minimal ``slurm``
table: what the plugin provides (NO_VAL, SUCCESS, ERROR, log_user, log_info).
tests/test_marker_submit.py checks the real plugin inside slurmctld.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from slurm_elastic.errors import MarkerError
from slurm_elastic.marker import check_submission, complete_marker
from tests.slurm_cluster import in_ci

LUA_SCRIPT = Path(__file__).resolve().parent.parent / "etc" / "job_submit.lua"
NO_VAL = 4294967294

# Reads cases "<min>\t<max>\t<hex comment>" from stdin, prints one result line per case.
DRIVER = r"""
local function hex(s)
  return (string.gsub(s, ".", function(c) return string.format("%02x", string.byte(c)) end))
end
local function unhex(h)
  return (string.gsub(h, "%x%x", function(x) return string.char(tonumber(x, 16)) end))
end
local user_msg
slurm = { NO_VAL = 4294967294, SUCCESS = 0, ERROR = -1,
          log_user = function(m) user_msg = m end, log_info = function() end }
dofile(arg[1])
for line in io.lines() do
  local lo, hi, h = string.match(line, "^(%d+)\t(%d+)\t(%x*)$")
  local job = { min_nodes = tonumber(lo), max_nodes = tonumber(hi), comment = unhex(h) }
  if job.comment == "" then job.comment = nil end
  user_msg = nil
  local rc = slurm_job_submit(job, {}, 0)
  if rc == slurm.SUCCESS then
    print(string.format("OK\t%s\t%d\t%d", hex(job.comment or ""), job.min_nodes, job.max_nodes))
  else
    print("ERR\t" .. hex(user_msg or "(no message)"))
  end
end
"""

Case = tuple[str, int | None, int | None]


def _lua() -> str:
    exe = shutil.which("lua5.1")
    if exe is None:
        if in_ci():
            pytest.fail("no lua5.1 interpreter: scripts/install-deps.sh installs it")
        pytest.skip("no lua5.1 interpreter (apt-get install lua5.1)")
    return exe


def run_lua(cases: list[Case], tmp: Path) -> list[tuple[str, ...]]:
    driver = tmp / "driver.lua"
    driver.write_text(DRIVER)
    lines = "".join(
        f"{NO_VAL if lo is None else lo}\t{NO_VAL if hi is None else hi}\t"
        f"{comment.encode().hex()}\n"
        for comment, lo, hi in cases
    )
    proc = subprocess.run(
        [_lua(), str(driver), str(LUA_SCRIPT)],
        input=lines,
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    out = []
    for line in proc.stdout.splitlines():
        kind, *rest = line.split("\t")
        decoded = bytes.fromhex(rest[0]).decode(errors="replace")
        out.append((kind, decoded, *rest[1:]))
    assert len(out) == len(cases)
    return out


def python_result(comment: str, lo: int | None, hi: int | None) -> tuple[str, ...]:
    try:
        new_comment = complete_marker(comment, lo, hi)
        spec = check_submission(comment, lo, hi)
    except MarkerError as exc:
        return ("ERR", str(exc))
    if spec is not None and lo is None:  # the plugin sets the range from the marker
        lo, hi = spec.min_nodes, spec.max_nodes
    return ("OK", new_comment, str(NO_VAL if lo is None else lo), str(NO_VAL if hi is None else hi))


EXAMPLES: list[Case] = [
    ("", 2, 8),
    ("nightly run", 2, 8),
    ("elastic", 2, 8),
    ("elastic", None, None),
    ("elastic", 4, 4),
    ("a; elastic:step=2 b", 2, 8),
    ("elastic/1", 2, 8),
    ("elastic:min=2,max=8", 2, 8),
    ("elastic:min=2,max=8", None, None),
    ("elastic:min=3", None, None),
    ("elastic:min=2", 4, 8),
    ("elastic:max=5", 4, 4),
    ("elastic:min=8,max=2", None, None),
    ("elastic:min=x", 2, 8),
    ("elastic:size=4", 2, 8),
    ("elastic:min=1,min=1", 2, 8),
    ("elastic:step=3", 2, 8),
    ("elastic/2", 2, 8),
    ("elastic:", 2, 8),
    ("elastic:min", 2, 8),
    ("elastic:gpus=4,", 2, 8),
    ("elastic:cost=1234567", 2, 8),
    ("elastic elastic", 2, 8),
    ("slurm-elastic:companion-of=12 elastic:min=9", 2, 8),
    ("slurm-elastic:companion-of=zz", 2, 8),
    ("elastic:min=\x01" + "7" * 90, 2, 8),
]


def test_lua_matches_python_on_examples(tmp_path: Path) -> None:
    for case, got in zip(EXAMPLES, run_lua(EXAMPLES, tmp_path), strict=True):
        assert got == python_result(*case), case


comment_alphabet = st.sampled_from(list("elastic:/=,;0123456789 minaxstepgpuscot-\t"))
node_counts = st.none() | st.integers(1, 12)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.text(comment_alphabet, max_size=30), node_counts, node_counts)))
def test_lua_matches_python_on_generated_comments(tmp_path_factory, cases: list[Case]) -> None:
    cases = [(c, lo, None if lo is None else hi) for c, lo, hi in cases]
    if not cases:
        return
    tmp = tmp_path_factory.mktemp("lua")
    for case, got in zip(cases, run_lua(cases, tmp), strict=True):
        assert got == python_result(*case), case
