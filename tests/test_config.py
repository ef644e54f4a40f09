"""Config loading: merge order, provenance, one-line errors naming file/key/reason, the example."""

from __future__ import annotations

import math
import os
import pwd
import tempfile
from pathlib import Path

import annotated_types
import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import BaseModel
from pydantic.fields import FieldInfo

from slurm_elastic.config import (
    DEFAULT_SOURCE,
    ENV_VAR,
    Config,
    config_paths,
    load_config,
)
from slurm_elastic.errors import ConfigError

REPO = Path(__file__).resolve().parent.parent
EXAMPLE = REPO / "etc" / "slurm-elastic.yaml.example"


def _write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def test_example_parses_and_equals_defaults() -> None:
    config = load_config(EXAMPLE)
    assert config.plain() == Config().plain()
    # EVERY key is spelled out in the example: none falls back to a default.
    assert set(config.provenance.values()) == {str(EXAMPLE)}


def test_defaults_are_the_contract() -> None:
    c = Config()
    assert (c.mode, c.interval_s, str(c.state_dir)) == ("shadow", 10, "/var/lib/slurm-elastic")
    assert (c.api.bind, c.api.port) == ("127.0.0.1", 8790)
    assert c.guards.max_resizes_per_cycle == 2 and c.guards.hard_shrink is False
    assert c.log.json_ == "auto" and c.policy.name == "mip"


def test_conf_d_merges_in_order_with_provenance(tmp_path: Path) -> None:
    main = _write(tmp_path / "slurm-elastic.yaml", "mode: enforce\nguards: {cooldown_s: 60}\n")
    a = _write(tmp_path / "conf.d" / "20-b.yaml", "guards: {cooldown_s: 5}\n")
    b = _write(tmp_path / "conf.d" / "10-a.yaml", "guards: {cooldown_s: 7, hard_shrink: true}\n")
    _write(tmp_path / "conf.d" / "ignored.yml", "mode: nonsense\n")  # only *.yaml is read
    paths = config_paths(main)
    assert paths == [main, b, a]
    config = load_config(*paths)
    assert config.mode == "enforce"
    assert config.guards.cooldown_s == 5  # 20-b wins over 10-a over main
    assert config.guards.hard_shrink is True
    assert config.guards.min_dwell_s == 300  # untouched sibling keeps its default
    prov = config.provenance
    assert prov["mode"] == str(main)
    assert prov["guards.cooldown_s"] == str(a)
    assert prov["guards.hard_shrink"] == str(b)
    assert prov["guards.min_dwell_s"] == DEFAULT_SOURCE
    assert config.files == (str(main), str(b), str(a))


def test_env_var_overrides_main_file(tmp_path: Path) -> None:
    main = _write(tmp_path / "x.yaml", "interval_s: 3\n")
    config = load_config(environ={ENV_VAR: str(main)})
    assert config.interval_s == 3 and config.source_of("interval_s") == str(main)


def test_env_var_pointing_nowhere_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(
        ConfigError, match=r"nope\.yaml: \(file\): does not exist or is a directory"
    ):
        load_config(environ={ENV_VAR: str(tmp_path / "nope.yaml")})


def test_missing_default_file_gives_defaults() -> None:
    if Path("/etc/slurm-elastic/slurm-elastic.yaml").exists():
        pytest.skip("a real config is installed on this machine")
    assert load_config(environ={}).plain() == Config().plain()


@pytest.mark.parametrize(
    ("text", "key", "reason"),
    [
        ("guards: {cooldwn_s: 5}\n", "guards.cooldwn_s", "unknown key"),
        ("mode: agressive\n", "mode", "Input should be 'shadow' or 'enforce'"),
        ("interval_s: -1\n", "interval_s", "greater than or equal to 0.01"),
        ("interval_s: .inf\n", "interval_s", "finite number"),
        ("guards: {cooldown_s: .nan}\n", "guards.cooldown_s", "finite number"),
        ("guards: {min_dwell_s: 1.0e+300}\n", "guards.min_dwell_s", "less than or equal"),
        ("policy: {horizon_s: true}\n", "policy.horizon_s", "not true/false"),
        ("guards: {max_resizes_per_cycle: 2.5}\n", "guards.max_resizes_per_cycle", "integer"),
        ("api: {port: 70000}\n", "api.port", "less than or equal to 65535"),
        ("api: {bind: localhost}\n", "api.bind", "not an IP address"),
        ("guards: 5\n", "guards", "valid dictionary"),
        ("log: {json: maybe}\n", "log.json", "maybe"),
        ("policy: {time_limit_s: fast}\n", "policy.time_limit_s", "valid number"),
        ("cluster: {gpu_types: {a100: ''}}\n", "cluster.gpu_types.a100", "must not be empty"),
        ("cluster: {gpu_types: {a100: 100}}\n", "cluster.gpu_types.a100", "a string"),
        ("cluster: {gpu_types: {a100: [x]}}\n", "cluster.gpu_types.a100", "a string"),
        ("cluster: {gpu_types: {a100: null}}\n", "cluster.gpu_types.a100", "a string"),
        ("cluster: {gpu_types: {a100: 'a 100'}}\n", "cluster.gpu_types.a100", "one word"),
        ("cluster: {gpu_types: {a100: Mixed}}\n", "cluster.gpu_types.a100", "name one type"),
        ("cluster: {gpu_types: {'': a100}}\n", "cluster.gpu_types..[key]", "partition name"),
        ("cluster: {gpu_types: [a100]}\n", "cluster.gpu_types", "valid dictionary"),
        ("cluster: {gpu_type: {}}\n", "cluster.gpu_type", "unknown key"),
    ],
)
def test_errors_name_file_key_and_reason(tmp_path: Path, text: str, key: str, reason: str) -> None:
    main = _write(tmp_path / "main.yaml", "interval_s: 5\n")
    bad = _write(tmp_path / "conf.d" / "50-bad.yaml", text)
    with pytest.raises(ConfigError) as info:
        load_config(*config_paths(main))
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith(f"{bad}: {key}: ")
    assert reason in message


def test_invalid_yaml_names_file_and_line(tmp_path: Path) -> None:
    bad = _write(tmp_path / "main.yaml", "mode: shadow\nguards: {cooldown_s: 5\n")
    with pytest.raises(ConfigError, match=rf"^{bad}: line \d+: invalid YAML: "):
        load_config(bad)


def test_top_level_must_be_mapping(tmp_path: Path) -> None:
    bad = _write(tmp_path / "main.yaml", "- a\n- b\n")
    with pytest.raises(ConfigError, match=r"must be a mapping"):
        load_config(bad)


def test_empty_file_is_all_defaults(tmp_path: Path) -> None:
    empty = _write(tmp_path / "main.yaml", "# nothing\n")
    assert load_config(empty).plain() == Config().plain()


def test_replacing_a_list_and_partitions_filter(tmp_path: Path) -> None:
    main = _write(tmp_path / "main.yaml", "partitions: {include: [batch, shared]}\n")
    _write(tmp_path / "conf.d" / "a.yaml", "partitions: {include: [batch], exclude: [debug]}\n")
    config = load_config(*config_paths(main))
    assert config.partitions.include == ("batch",)
    assert config.partitions.allows("batch") and not config.partitions.allows("shared")
    assert not config.partitions.allows("debug")


def test_gpu_types_are_read_in_lower_case_with_provenance(tmp_path: Path) -> None:
    """cluster.gpu_types: node types are read in lower case (NodeView.gpu_type), so a
    configured "A100" must match them; each entry keeps the file that set it."""
    main = _write(tmp_path / "main.yaml", "cluster:\n  gpu_types: {a100: A100, old: v100}\n")
    config = load_config(main)
    assert config.cluster.gpu_types == {"a100": "a100", "old": "v100"}
    assert config.provenance["cluster.gpu_types.old"] == str(main)
    assert Config().cluster.gpu_types == {}


def test_config_is_frozen() -> None:
    from pydantic import ValidationError

    with pytest.raises(ValidationError):
        Config().mode = "enforce"  # type: ignore[misc]


# --------------------------------------------------------------------------- numeric bounds

NUMERIC_TYPES = (int, float)


def _numeric_fields(model: type[BaseModel] = Config, prefix: str = "") -> dict[str, FieldInfo]:
    """Every numeric leaf key of the config (dotted, as in the file) with its field."""
    found: dict[str, FieldInfo] = {}
    for name, info in model.model_fields.items():
        key = prefix + (info.alias or name)
        if isinstance(info.annotation, type) and issubclass(info.annotation, BaseModel):
            found.update(_numeric_fields(info.annotation, key + "."))
        elif info.annotation in NUMERIC_TYPES:
            found[key] = info
    return found


def _documented_bounds() -> dict[str, tuple[float, float]]:
    """The ranges the admin guide's "Bounds" table promises: | `key` | min | max | why |."""
    text = (REPO / "docs" / "admin-guide.md").read_text()
    table = text.split("| key | min | max | why the bound |", 1)[1].split("\n\n", 1)[0]
    bounds = {}
    for line in table.splitlines()[2:]:
        key, low, high = (cell.strip() for cell in line.strip("|").split("|")[:3])
        bounds[key.strip("`")] = (float(low), float(high))
    return bounds


def test_every_number_has_the_bounds_the_admin_guide_states() -> None:
    fields = _numeric_fields()
    documented = _documented_bounds()
    assert set(fields) == set(documented)
    for key, info in fields.items():
        low = next(m.ge for m in info.metadata if isinstance(m, annotated_types.Ge))
        high = next(m.le for m in info.metadata if isinstance(m, annotated_types.Le))
        assert (low, high) == documented[key], key
        assert low <= info.default <= high, key


BOUNDS = _documented_bounds()


@given(
    key=st.sampled_from(sorted(BOUNDS)),
    value=st.one_of(
        st.floats(allow_nan=True, allow_infinity=True),
        st.integers(min_value=-(10**400), max_value=10**400),
        st.booleans(),
        st.sampled_from([0, 0.0, -0.0, 1e-300, 0.009, 0.01, 3600, 3600.5, 65535, 65536]),
    ),
)
@settings(max_examples=300, deadline=None)
def test_a_number_is_loaded_iff_finite_and_in_bounds(key: str, value: float) -> None:
    """Property over every numeric key: in range loads as given; anything else (inf, nan, a
    bool, a fraction for an integer key, out of range) is one line naming file and key."""
    low, high = BOUNDS[key]
    integral = _numeric_fields()[key].annotation is int
    section, _, leaf = key.rpartition(".")
    tree: dict[str, object] = {leaf: value}
    if section:
        tree = {section: tree}
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "main.yaml"
        path.write_text(yaml.safe_dump(tree))
        ok = (
            not isinstance(value, bool)
            and (isinstance(value, int) or math.isfinite(value))
            and low <= value <= high  # exact for ints of any size
            and (not integral or float(value).is_integer())
        )
        if ok:
            loaded = load_config(path).plain()
            got = loaded[section][leaf] if section else loaded[leaf]
            assert got == value and math.isfinite(got)
        else:
            with pytest.raises(ConfigError) as info:
                load_config(path)
            message = str(info.value)
            assert "\n" not in message and message.startswith(f"{path}: {key}: ")
            assert len(message) < 300


@pytest.mark.parametrize("end", ["min", "max"])
def test_a_config_at_its_bounds_runs_cycles(end: str) -> None:
    """No accepted value makes the cycle fail: every number at its lowest, then its highest."""
    from slurm_elastic.actuate.instructions import InstructionBoard
    from slurm_elastic.actuate.journal import Journal
    from slurm_elastic.daemon.controller import Controller
    from slurm_elastic.daemon.reports import ReportStore
    from tests.fakes import RecordingBackend
    from tests.test_daemon_controller_data import job, pending, snapshot

    tree: dict[str, dict[str, float]] = {}
    for key, (low, high) in BOUNDS.items():
        section, _, leaf = key.rpartition(".")
        tree.setdefault(section, {})[leaf] = low if end == "min" else high
    top = tree.pop("")
    config = Config.model_validate(
        {**top, **tree, "mode": "enforce", "policy": {**tree["policy"], "name": "greedy"}}
    )
    now = 1.8e9
    snap = snapshot([job(1, nodes=("n1",)), pending(2)], taken_at=now)
    backend = RecordingBackend(snap, fresh=True)
    ctl = Controller(
        backend,  # type: ignore[arg-type]
        config,
        reports=ReportStore(),
        journal=Journal(),
        agents=InstructionBoard(),
    )
    for k in range(3):
        result = ctl.run_once(now + k * config.interval_s)
        assert result.ok, result.error


# --------------------------------------------------------------------------- unreadable files


def test_a_file_that_is_not_utf8_is_one_line(tmp_path: Path) -> None:
    bad = tmp_path / "main.yaml"
    bad.write_bytes(b"mode: shadow\n# caf\xe9\n")
    with pytest.raises(ConfigError) as info:
        load_config(bad)
    assert str(info.value) == f"{bad}: (file): not UTF-8 text (byte 0xe9 at offset 18)"


@pytest.mark.parametrize(
    ("content", "reason"),
    [
        (b"mode: shadow\x00\n", "invalid YAML: unacceptable character #x0000"),
        (b"a: " + b"[" * 50_000 + b"\n", "invalid YAML"),
        (b"\x1b]0;title\x07: 1\n", "invalid YAML"),
    ],
)
def test_a_file_that_is_not_yaml_is_one_line(tmp_path: Path, content: bytes, reason: str) -> None:
    bad = tmp_path / "main.yaml"
    bad.write_bytes(content)
    with pytest.raises(ConfigError) as info:
        load_config(bad)
    message = str(info.value)
    assert message.startswith(f"{bad}: ") and reason in message and "\n" not in message


def test_a_fifo_is_refused_without_blocking(tmp_path: Path) -> None:
    fifo = tmp_path / "main.yaml"
    os.mkfifo(fifo)
    with pytest.raises(ConfigError, match=r"main\.yaml: \(file\): not a regular file$"):
        load_config(fifo)


def _load_as_nobody(path: Path) -> str:
    """``load_config(path)`` in a child that became ``nobody``: its one-line error (or
    "loaded").  Real permissions: root reads everything, so the test must drop them."""
    nobody = pwd.getpwnam("nobody")
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: drop to nobody, try, report the message, never return
        message = "child failed"
        try:
            os.close(read_end)
            os.setgid(nobody.pw_gid)
            os.setuid(nobody.pw_uid)
            try:
                load_config(path)
                message = "loaded"
            except ConfigError as exc:
                message = str(exc)
            except BaseException as exc:  # reported to the parent as is
                message = f"{type(exc).__name__}: {exc}"
        finally:
            os.write(write_end, message.encode())
            os._exit(0)
    os.close(write_end)
    with os.fdopen(read_end, "rb") as pipe:
        message = pipe.read().decode()
    os.waitpid(pid, 0)
    return message


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to become another user")
def test_an_unreadable_file_is_one_line(tmp_path: Path) -> None:
    """A root-only file, and a file inside a directory the reader cannot search."""
    with tempfile.TemporaryDirectory() as shared:
        Path(shared).chmod(0o755)
        secret = Path(shared) / "main.yaml"
        secret.write_text("mode: shadow\n")
        secret.chmod(0o600)
        assert _load_as_nobody(secret) == f"{secret}: (file): cannot read: Permission denied"
        hidden = Path(shared) / "private" / "main.yaml"
        hidden.parent.mkdir(mode=0o700)
        hidden.write_text("mode: shadow\n")
        assert _load_as_nobody(hidden) == f"{hidden}: (file): cannot read: Permission denied"
