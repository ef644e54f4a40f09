"""Config loading: merge order, provenance, one-line errors naming file/key/reason, the example."""

from __future__ import annotations

from pathlib import Path

import pytest

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
        ("interval_s: -1\n", "interval_s", "greater than 0"),
        ("api: {port: 70000}\n", "api.port", "less than or equal to 65535"),
        ("api: {bind: localhost}\n", "api.bind", "not an IP address"),
        ("guards: 5\n", "guards", "valid dictionary"),
        ("log: {json: maybe}\n", "log.json", "maybe"),
        ("policy: {time_limit_s: fast}\n", "policy.time_limit_s", "valid number"),
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


def test_config_is_frozen() -> None:
    from pydantic import ValidationError

    with pytest.raises(ValidationError):
        Config().mode = "enforce"  # type: ignore[misc]
