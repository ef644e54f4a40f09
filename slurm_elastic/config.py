"""The daemon's configuration: YAML files merged, validated, with the source of every key.

Files, in the order they are merged (later wins, key by key):

1. the main file: ``$SLURM_ELASTIC_CONFIG`` if set, else ``/etc/slurm-elastic/slurm-elastic.yaml``
   (a missing default file is fine: every key has a default);
2. ``conf.d/*.yaml`` beside the main file, in lexical order.

Mappings merge recursively; scalars and lists replace.  Validation is pydantic with
``extra="forbid"`` so that a typo is an error, not a silently ignored key.  Every error is a
one-line ``ConfigError`` naming the file, the dotted key and the reason.

``Config.provenance`` maps each dotted leaf key to the file that set it (``"default"`` when no
file did), which ``slurm-elastic config check`` prints.
"""

from __future__ import annotations

import ipaddress
import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, ValidationError, field_validator

from slurm_elastic.errors import ConfigError

DEFAULT_CONFIG_PATH = Path("/etc/slurm-elastic/slurm-elastic.yaml")
ENV_VAR = "SLURM_ELASTIC_CONFIG"
DEFAULT_SOURCE = "default"


class _Section(BaseModel):
    # frozen: a running cycle holds a reference to one Config; SIGHUP swaps the whole object.
    model_config = ConfigDict(extra="forbid", frozen=True)


class SlurmSection(_Section):
    backend: Literal["auto", "cli", "pyslurm"] = "auto"
    # Where per-Slurm-release pyslurm builds live (scripts/build-pyslurm.sh): the daemon
    # imports <pyslurm_path>/<major.minor of the running Slurm> itself ("" = don't look;
    # a pyslurm already importable from PYTHONPATH wins).  See slurm.select.
    pyslurm_path: str = "/var/lib/slurm-elastic/pyslurm"
    timeout_s: float = Field(20.0, gt=0)
    sacct_interval_s: float = Field(300.0, gt=0)
    sacct_lookback_s: float = Field(2_592_000.0, ge=0)
    # ``scontrol reconfigure`` once a job the daemon shrank has ended (Slurm 22.05 node leak,
    # see ``slurm.cli.leaks_nodes_after_shrink``): auto = when the probed version has it.
    reconfigure_after_shrink: Literal["auto", "always", "never"] = "auto"


class PolicySection(_Section):
    name: Literal["mip", "greedy", "dp", "static"] = "mip"
    time_limit_s: float = Field(1.0, gt=0)
    horizon_s: float = Field(3600.0, gt=0)
    fallback: Literal["greedy", "dp", "static", "none"] = "greedy"


class GuardsSection(_Section):
    cooldown_s: float = Field(120.0, ge=0)
    min_dwell_s: float = Field(300.0, ge=0)
    max_resizes_per_cycle: int = Field(2, ge=0)
    payback_horizon_s: float = Field(1800.0, ge=0)
    hard_shrink: bool = False
    ack_timeout_s: float = Field(60.0, gt=0)
    time_limit_margin_s: float = Field(300.0, ge=0)
    stale_snapshot_s: float = Field(60.0, gt=0)


class GrowSection(_Section):
    method: Literal["companion", "expand", "off"] = "companion"
    companion_pending_timeout_s: float = Field(600.0, gt=0)
    agent_command: str = Field("slurm-elastic run", min_length=1)
    # A companion that ends by itself sooner than this after it started (or before it ever
    # ran) while its parent still runs has failed.  The next grow of that job waits
    # companion_retry_backoff_s, doubled after each further failure in a row, and after
    # companion_max_failures in a row the daemon stops growing the job (its REASON says so).
    companion_fail_window_s: float = Field(60.0, gt=0, le=86_400, allow_inf_nan=False)
    companion_retry_backoff_s: float = Field(60.0, ge=0, le=86_400, allow_inf_nan=False)
    companion_max_failures: int = Field(3, ge=1, le=100)


class ModelSection(_Section):
    default_resize_cost_s: float = Field(30.0, ge=0)
    # The convergence curve family (``model.convergence``): "exp" is the default validated
    # on public training curves; "auto" selects per job by holdout on its own reports.
    curve_family: Literal["exp", "optimus", "power", "auto"] = "exp"


class ApiSection(_Section):
    bind: str = "127.0.0.1"
    port: int = Field(8790, ge=0, le=65535)  # 0: pick a free port (tests)
    unmunge: str = Field("unmunge", min_length=1)

    @field_validator("bind")
    @classmethod
    def _bind_is_ip(cls, value: str) -> str:
        # An IP literal, not a host name: binding must not depend on name resolution.
        try:
            ipaddress.ip_address(value)
        except ValueError:
            raise ValueError(f"not an IP address: {value!r}") from None
        return value


class LogSection(_Section):
    level: Literal["debug", "info", "warning", "error"] = "info"
    json_: Literal["auto", True, False] = Field("auto", alias="json")

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)


class PartitionsSection(_Section):
    include: tuple[str, ...] = ()  # empty: every partition
    exclude: tuple[str, ...] = ()

    def allows(self, partition: str) -> bool:
        if self.include and partition not in self.include:
            return False
        return partition not in self.exclude


class Config(_Section):
    mode: Literal["shadow", "enforce"] = "shadow"
    interval_s: float = Field(10.0, gt=0)
    state_dir: Path = Path("/var/lib/slurm-elastic")
    slurm: SlurmSection = SlurmSection()
    policy: PolicySection = PolicySection()
    guards: GuardsSection = GuardsSection()
    grow: GrowSection = GrowSection()
    model: ModelSection = ModelSection()
    api: ApiSection = ApiSection()
    log: LogSection = LogSection()
    partitions: PartitionsSection = PartitionsSection()

    _provenance: dict[str, str] = PrivateAttr(default_factory=dict)
    _files: tuple[str, ...] = PrivateAttr(default=())

    @property
    def provenance(self) -> dict[str, str]:
        """Dotted leaf key -> file that set it, or ``"default"``; one entry per leaf key."""
        return {key: self._provenance.get(key, DEFAULT_SOURCE) for key in leaf_keys(self.plain())}

    @property
    def files(self) -> tuple[str, ...]:
        """The files that were read, in merge order."""
        return self._files

    def source_of(self, key: str) -> str:
        return self._provenance.get(key, DEFAULT_SOURCE)

    def plain(self) -> dict[str, Any]:
        """JSON/YAML-ready values under the file's key names (``log.json``, not ``json_``)."""
        return self.model_dump(mode="json", by_alias=True)


# --------------------------------------------------------------------------- loading


def flat_items(tree: Mapping[str, Any], prefix: str = "") -> list[tuple[str, Any]]:
    """Dotted leaf keys with their values, in document order (an empty mapping is a leaf)."""
    items: list[tuple[str, Any]] = []
    for name, value in tree.items():
        dotted = f"{prefix}{name}"
        if isinstance(value, Mapping) and value:
            items.extend(flat_items(value, dotted + "."))
        else:
            items.append((dotted, value))
    return items


def leaf_keys(tree: Mapping[str, Any], prefix: str = "") -> list[str]:
    return [key for key, _ in flat_items(tree, prefix)]


def config_paths(
    main: str | Path | None = None, environ: Mapping[str, str] | None = None
) -> list[Path]:
    """The files to merge: the main file (argument, env, or default) then its ``conf.d/*.yaml``."""
    env = os.environ if environ is None else environ
    if main is None:
        main = env.get(ENV_VAR) or DEFAULT_CONFIG_PATH
    main_path = Path(main)
    conf_d = main_path.parent / "conf.d"
    extra = sorted(conf_d.glob("*.yaml")) if conf_d.is_dir() else []
    return [main_path, *extra]


def _read_yaml(path: Path) -> dict[str, Any]:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read: {exc.strerror or exc}") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" line {mark.line + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise ConfigError(f"{path}:{where}: invalid YAML: {problem}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(
            f"{path}: (top level): must be a mapping of keys, got {type(data).__name__}"
        )
    return data


def _merge(
    base: dict[str, Any],
    update: Mapping[str, Any],
    source: str,
    prov: dict[str, str],
    prefix: str = "",
) -> None:
    for key, value in update.items():
        dotted = f"{prefix}{key}"
        if isinstance(value, Mapping) and isinstance(base.get(key), dict):
            _merge(base[key], value, source, prov, dotted + ".")
            continue
        base[key] = dict(value) if isinstance(value, Mapping) else value
        # A replaced subtree forgets the sources of its former leaves.
        for old in [k for k in prov if k.startswith(dotted + ".")]:
            del prov[old]
        if isinstance(value, Mapping) and value:
            for leaf in leaf_keys(value, dotted + "."):
                prov[leaf] = source
        else:
            prov[dotted] = source


def _source_for(loc: str, prov: Mapping[str, str]) -> str:
    """The file responsible for the key at ``loc`` (or for the closest key around it)."""
    if loc in prov:
        return prov[loc]
    below = sorted(v for k, v in prov.items() if k.startswith(loc + "."))
    if below:
        return below[-1]
    parts = loc.split(".")
    while parts:
        parts.pop()
        if ".".join(parts) in prov:
            return prov[".".join(parts)]
    return DEFAULT_SOURCE


def _error_line(exc: ValidationError, prov: Mapping[str, str]) -> str:
    err = exc.errors()[0]
    loc = ".".join(str(p) for p in err["loc"]).replace("json_", "json") or "(top level)"
    reason = err["msg"]
    if err["type"] == "extra_forbidden":
        reason = "unknown key"
    elif "input" in err and err["type"] not in ("missing",):
        reason = f"{reason} (got {err['input']!r})"
    more = len(exc.errors()) - 1
    tail = f" (+{more} more error{'s' if more > 1 else ''})" if more else ""
    return f"{_source_for(loc, prov)}: {loc}: {reason}{tail}"


def load_config(
    *paths: str | Path, environ: Mapping[str, str] | None = None, optional_main: bool | None = None
) -> Config:
    """Merge and validate ``paths`` (default: ``config_paths()``); raise a one-line ConfigError.

    With no paths the default main file may be missing (defaults apply); a path given
    explicitly, or through ``$SLURM_ELASTIC_CONFIG``, must exist.
    """
    env = os.environ if environ is None else environ
    if not paths:
        files: Iterable[Path] = config_paths(None, env)
        if optional_main is None:
            optional_main = not env.get(ENV_VAR)
    else:
        files = [Path(p) for p in paths]
    merged: dict[str, Any] = {}
    prov: dict[str, str] = {}
    read: list[str] = []
    for index, path in enumerate(files):
        if index == 0 and optional_main and not path.exists():
            continue
        if not path.exists() or path.is_dir():
            raise ConfigError(f"{path}: (file): does not exist or is a directory")
        _merge(merged, _read_yaml(path), str(path), prov)
        read.append(str(path))
    try:
        config = Config.model_validate(merged)
    except ValidationError as exc:
        raise ConfigError(_error_line(exc, prov)) from None
    config._provenance = prov
    config._files = tuple(read)
    return config


def default_config() -> Config:
    return Config()


def load_main(main: str | Path | None = None, environ: Mapping[str, str] | None = None) -> Config:
    """What the daemon and the CLI load: ``main`` (``--config``), else ``$SLURM_ELASTIC_CONFIG``,
    else the default file, each with its ``conf.d``.  Only the default file may be missing.
    """
    env = os.environ if environ is None else environ
    optional = main is None and not env.get(ENV_VAR)
    return load_config(*config_paths(main, env), optional_main=optional)
