"""etc/job_submit.lua agrees with slurm_elastic.marker on every input.

The shipped plugin runs here in a stand-alone Lua 5.1 interpreter (the version Debian's
job_submit_lua.so embeds; installed by scripts/install-deps.sh) with a minimal ``slurm``
table: what the plugin provides (NO_VAL, SUCCESS, ERROR, log_user, log_info: both
``string.format`` over their arguments, as slurmctld defines them), and a
partition list shaped like slurmctld's (name -> total_nodes, max_nodes, flag_default).
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

# What every driver starts with: hex coding (comments may hold any byte), the ``slurm``
# table the plugin expects, and the plugin itself (its path is the driver's argument).
PRELUDE = r"""
local function hex(s)
  return (string.gsub(s, ".", function(c) return string.format("%02x", string.byte(c)) end))
end
local function unhex(h)
  return (string.gsub(h, "%x%x", function(x) return string.char(tonumber(x, 16)) end))
end
local user_msg
-- As slurmctld defines them (src/lua/slurm_lua.c): string.format over the arguments.
slurm = { NO_VAL = 4294967294, SUCCESS = 0, ERROR = -1,
          log_user = function(...) user_msg = string.format(unpack({...})) end,
          log_info = function(...) local _ = string.format(unpack({...})) end }
dofile(arg[1])
"""

# Reads cases "<min>\t<max>\t<capacity>\t<partition>\t<hex comment>" from stdin, prints one
# result line per case.  Capacity 0: no partition list.  Otherwise the default partition
# "batch" has capacity + 2 nodes and MaxNodes=capacity, and "big" (not default) has 100 nodes
# and no MaxNodes: a job naming no partition can get ``capacity`` nodes, one naming "big" 100.
DRIVER = (
    PRELUDE
    + r"""local INFINITE = 4294967295
for line in io.lines() do
  local lo, hi, cap, part, h = string.match(line, "^(%d+)\t(%d+)\t(%d+)\t([%w,]*)\t(%x*)$")
  local job = { min_nodes = tonumber(lo), max_nodes = tonumber(hi), comment = unhex(h) }
  if job.comment == "" then job.comment = nil end
  if part ~= "" then job.partition = part end
  local parts = {}
  if tonumber(cap) > 0 then
    parts.batch = { total_nodes = tonumber(cap) + 2, max_nodes = tonumber(cap), flag_default = 1 }
    parts.big = { total_nodes = 100, max_nodes = INFINITE, flag_default = 0 }
  end
  user_msg = nil
  local rc = slurm_job_submit(job, parts, 0)
  if rc == slurm.SUCCESS then
    print(string.format("OK\t%s\t%d\t%d", hex(job.comment or ""), job.min_nodes, job.max_nodes))
  else
    print("ERR\t" .. hex(user_msg or "(no message)"))
  end
end
"""
)

Case = tuple[str, int | None, int | None]
# A case with the partitions the job sees: (capacity of the default partition or None for
# no partition list, the job's --partition or "").
PartCase = tuple[str, int | None, int | None, int | None, str]


def _with_parts(case: Case | PartCase) -> PartCase:
    return case if len(case) == 5 else (*case, None, "")  # type: ignore[return-value]


def _capacity(cap: int | None, partition: str) -> int | None:
    """What DRIVER's partition list gives a job naming ``partition`` (see DRIVER)."""
    if cap is None:
        return None
    names = partition.split(",") if partition else ["batch"]
    caps = [{"batch": cap, "big": 100}[n] for n in names if n in ("batch", "big")]
    return max(caps) if caps else None


def _lua() -> str:
    exe = shutil.which("lua5.1")
    if exe is None:
        if in_ci():
            pytest.fail("no lua5.1 interpreter: scripts/install-deps.sh installs it")
        pytest.skip("no lua5.1 interpreter (apt-get install lua5.1)")
    return exe


def run_driver(driver_text: str, lines: list[str], tmp: Path) -> list[tuple[str, ...]]:
    """Run the shipped plugin under ``driver_text`` on one input line per case: per case
    ("OK", comment, min, max) or ("ERR", message), hex-decoded."""
    driver = tmp / "driver.lua"
    driver.write_text(driver_text)
    proc = subprocess.run(
        [_lua(), str(driver), str(LUA_SCRIPT)],
        input="".join(line + "\n" for line in lines),
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
    assert len(out) == len(lines)
    return out


def run_lua(cases: list[Case] | list[PartCase], tmp: Path) -> list[tuple[str, ...]]:
    lines = [
        f"{NO_VAL if lo is None else lo}\t{NO_VAL if hi is None else hi}\t"
        f"{cap or 0}\t{part}\t{comment.encode().hex()}"
        for comment, lo, hi, cap, part in map(_with_parts, cases)
    ]
    return run_driver(DRIVER, lines, tmp)


def python_result(
    comment: str,
    lo: int | None,
    hi: int | None,
    cap: int | None = None,
    partition: str = "",
) -> tuple[str, ...]:
    capacity = _capacity(cap, partition)
    try:
        new_comment = complete_marker(comment, lo, hi, capacity=capacity)
        spec = check_submission(comment, lo, hi, capacity=capacity)
    except MarkerError as exc:
        return ("ERR", str(exc))
    given_hi = lo if hi is None else hi
    if spec is not None and (lo is None or spec.max_nodes != given_hi):
        # The plugin sets the range from the marker, or lowers --nodes to the capacity.
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

# Hostile and honest ranges against partitions (class 2 of issue 19: bounded work).
CAPPED: list[PartCase] = [
    ("elastic:min=1,max=999999", None, None, 4, ""),
    ("elastic", 1, 999999, 4, ""),
    ("elastic:min=1,max=999999", 1, 999999, 4, ""),
    ("x elastic:step=3 y", 1, 999997, 4, ""),
    ("elastic:min=2,max=10,step=4", None, None, 4, ""),
    ("elastic:min=5", None, None, 4, ""),
    ("elastic", 5, 8, 4, ""),
    ("elastic:min=1,max=999999", None, None, 4, "big"),
    ("elastic:min=1,max=999999", None, None, 4, "big,batch"),
    ("elastic:min=1,max=999999", None, None, 4, "nosuch"),
    ("elastic:min=2,max=4", None, None, 4, ""),
    ("elastic", 1, 3, 4, ""),
    ("plain -N1-999999 is not ours", 1, 999999, 4, ""),
]


def test_lua_matches_python_on_examples(tmp_path: Path) -> None:
    for case, got in zip(EXAMPLES, run_lua(EXAMPLES, tmp_path), strict=True):
        assert got == python_result(*case), case


def test_lua_caps_ranges_at_what_the_partitions_give(tmp_path: Path) -> None:
    got = run_lua(CAPPED, tmp_path)
    for case, result in zip(CAPPED, got, strict=True):
        assert result == python_result(*case), case
    by_comment = {case[0]: result for case, result in zip(CAPPED, got, strict=True)}
    assert got[0] == ("OK", "elastic:min=1,max=4", "1", "4")
    assert got[1] == ("OK", "elastic:min=1,max=4", "1", "4")
    assert got[3] == ("OK", "x elastic:min=1,max=4,step=3 y", "1", "4")
    assert got[4] == ("OK", "elastic:min=2,max=2,step=4", "2", "2")
    assert got[5][0] == "ERR" and "min=5 is more than the 4 nodes" in got[5][1]
    assert got[7] == ("OK", "elastic:min=1,max=100", "1", "100")  # MaxNodes only on batch
    assert got[9] == ("OK", "elastic:min=1,max=999999", "1", "999999")  # unknown: Slurm's call
    assert got[11] == ("OK", "elastic:min=1,max=3", "1", "3")
    assert by_comment["plain -N1-999999 is not ours"] == (
        "OK",
        "plain -N1-999999 is not ours",
        "1",
        "999999",
    )


comment_alphabet = st.sampled_from(list("elastic:/=,;0123456789 minaxstepgpuscot-\t%"))
node_counts = st.none() | st.integers(1, 12)
capacities = st.none() | st.integers(1, 12)
partitions = st.sampled_from(["", "batch", "big", "big,batch", "nosuch"])


# Lua's string.format directives (and a lone "%"): slurmctld's log_user is string.format, so
# each must reach the user as text (issue 38, class 4: "%" raised a Lua error there, and
# slurmctld took the job unchecked).
FORMATS = ["%", "%s", "%n", "%d", "%q", "%%", "%5.2f", "%c", "%x", "%-", "%*d"]


def format_cases(f: str) -> list[Case]:
    """A directive in every field of a comment the plugin echoes in its refusal."""
    return [
        (f"elastic:min=1{f}", 2, 8),  # a value
        (f"elastic:min={f}", 2, 8),
        (f"elastic:{f}=1", 2, 8),  # a key
        (f"elastic:{f}", 2, 8),  # an option that is not key=value
        (f"elastic/{f}", 2, 8),  # a version
        (f"elastic elastic{f}", 2, 8),  # a second marker
        (f"slurm-elastic:companion-of={f}", 2, 8),  # a companion token
        (f"note{f} elastic:min=2,max=8", 2, 8),  # beside a good marker: accepted, untouched
        (f"elastic:min=1,max=999999 {f}", None, None),  # capped, the rest kept as written
    ]


@pytest.mark.parametrize("directive", FORMATS)
def test_format_directives_in_a_comment_are_text_not_a_format(
    tmp_path: Path, directive: str
) -> None:
    cases = format_cases(directive)
    for case, got in zip(cases, run_lua(cases, tmp_path), strict=True):
        assert got == python_result(*case), case
        assert directive in got[1], got  # echoed as written, refused or kept


def test_an_error_inside_the_check_refuses_the_job(tmp_path: Path) -> None:
    """Fails closed: a Lua error inside the check (here a node count slurmctld would never
    hand over) refuses the job with one line, never accepts it unchecked."""
    driver = (
        PRELUDE
        + r"""
local job = { min_nodes = "two", max_nodes = 8, comment = "elastic" }
print(slurm_job_submit(job, {}, 0) == slurm.ERROR, user_msg)
"""
    )
    path = tmp_path / "broken.lua"
    path.write_text(driver)
    proc = subprocess.run(
        [_lua(), str(path), str(LUA_SCRIPT)], capture_output=True, text=True, timeout=30
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == (
        "true\tslurm-elastic: the elastic check of this job failed; the job is refused "
        "(slurmctld's log has the reason for your admin)"
    )


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.text(comment_alphabet, max_size=30), node_counts, node_counts, capacities, partitions
        )
    )
)
def test_lua_matches_python_on_generated_comments(tmp_path_factory, cases: list[PartCase]) -> None:
    cases = [(c, lo, None if lo is None else hi, cap, p) for c, lo, hi, cap, p in cases]
    if not cases:
        return
    tmp = tmp_path_factory.mktemp("lua")
    for case, got in zip(cases, run_lua(cases, tmp), strict=True):
        assert got == python_result(*case), case
