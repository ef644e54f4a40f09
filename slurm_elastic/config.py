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

Every number is finite and inside a closed range ``[low, high]`` (``_number``): ``.inf``,
``.nan``, ``true`` and absurd values are refused at load time, with the same one-line error,
instead of making every cycle fail later.  The ranges are listed in docs/admin-guide.md
("Bounds"), and a test checks that list against the fields.
"""

from __future__ import annotations

import ipaddress
import os
import re
import stat
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    PrivateAttr,
    ValidationError,
    ValidationInfo,
    field_validator,
)

from slurm_elastic.errors import ConfigError
from slurm_elastic.policy.registry import DEFAULT_FALLBACK, DEFAULT_POLICY, FALLBACKS, POLICIES
from slurm_elastic.types import MIXED_GPU_TYPE

DEFAULT_CONFIG_PATH = Path("/etc/slurm-elastic/slurm-elastic.yaml")
ENV_VAR = "SLURM_ELASTIC_CONFIG"
DEFAULT_SOURCE = "default"

MINUTE = 60.0
HOUR = 3600.0
DAY = 86400.0


def _not_bool(value: Any) -> Any:
    # pydantic reads true/false as 1/0; in this file that is a typo, not a number.
    if isinstance(value, bool):
        raise ValueError("must be a number, not true/false")
    return value


# Numbers of the config (seconds, counts, shares): never a bool, always finite.
Number = Annotated[float, BeforeValidator(_not_bool)]
Count = Annotated[int, BeforeValidator(_not_bool)]


def _number(default: float, low: float, high: float) -> Any:
    """A finite number in ``[low, high]``: the stated bounds of one key (admin guide, Bounds)."""
    return Field(default, ge=low, le=high, allow_inf_nan=False)


class _Section(BaseModel):
    """A frozen config section that refuses unknown keys."""

    # frozen: a running cycle holds a reference to one Config; SIGHUP swaps the whole object.
    model_config = ConfigDict(extra="forbid", frozen=True)


class SlurmSection(_Section):
    """How the daemon talks to Slurm: backend, timeouts, accounting reads."""

    backend: Literal["auto", "cli", "pyslurm"] = "auto"
    # Where per-Slurm-release pyslurm builds live (scripts/build-pyslurm.sh): the daemon
    # imports <pyslurm_path>/<major.minor of the running Slurm> itself ("" = don't look;
    # a pyslurm already importable from PYTHONPATH wins).  See slurm.select.
    pyslurm_path: str = "/var/lib/slurm-elastic/pyslurm"
    timeout_s: Number = _number(20.0, 0.1, 10 * MINUTE)
    sacct_interval_s: Number = _number(300.0, 1.0, DAY)
    sacct_lookback_s: Number = _number(2_592_000.0, 0.0, 366 * DAY)
    # ``scontrol reconfigure`` once a job the daemon shrank has ended (Slurm 22.05 node leak,
    # see ``slurm.cli.leaks_nodes_after_shrink``): auto = when the probed version has it.
    reconfigure_after_shrink: Literal["auto", "always", "never"] = "auto"


class PolicySection(_Section):
    """Which policy decides (``policy.registry``) and what it falls back to when it fails."""

    name: str = DEFAULT_POLICY
    time_limit_s: Number = _number(1.0, 0.01, 10 * MINUTE)
    horizon_s: Number = _number(3600.0, 1.0, 30 * DAY)
    # The policy whose plan is used when ``name`` fails (mip: no incumbent at the time
    # limit, or a HiGHS error); "none": every job keeps its size for that cycle.
    fallback: str = DEFAULT_FALLBACK
    # What an elastic job holds by right; nodes above it are on loan and are given back
    # when a pending job ahead of it in Slurm's queue needs them (``policy.capacity``).
    # requested: the nodes Slurm gave the job itself (its companions' are on loan);
    # minimum: its elastic minimum; off: nothing is ever reclaimed.
    reclaim: Literal["requested", "minimum", "off"] = "requested"
    # A pending job listing several partitions it may use: "slurm" plans it in the first of
    # them and lets Slurm start it wherever it fits first (only its size is pinned);
    # "plan" lets the policy choose the partition too and narrows the job to it.  "slurm"
    # by default: in the simulator the policy's choice is not yet better than Slurm's
    # (docs/benchmarks.md, "GPU types").
    placement: Literal["slurm", "plan"] = "slurm"
    # With "plan": how long a job narrowed to the partition the plan chose may stay there
    # unstarted before it gets its partitions back (Slurm did not start it there: what
    # frees elsewhere may).  At least Slurm's backfill interval (bf_interval, 30 s).
    placement_wait_s: Number = _number(60.0, 0.0, DAY)

    @field_validator("name", "fallback")
    @classmethod
    def _registered(cls, value: str, info: ValidationInfo) -> str:
        names = POLICIES if info.field_name == "name" else FALLBACKS
        if value not in names:
            raise ValueError(f"unknown policy; choose one of {', '.join(names)}")
        return value


class GuardsSection(_Section):
    """Limits on resizing: cooldowns, dwell, per-cycle budget, acknowledgements."""

    cooldown_s: Number = _number(120.0, 0.0, 7 * DAY)
    min_dwell_s: Number = _number(300.0, 0.0, 7 * DAY)
    max_resizes_per_cycle: Count = _number(2, 0, 10_000)
    payback_horizon_s: Number = _number(1800.0, 0.0, 30 * DAY)
    hard_shrink: bool = False
    # A shrink that gives back a loan (``policy.reclaim``) is applied when its agent does
    # not answer by ``ack_timeout_s`` or refuses, whatever ``hard_shrink`` says: a borrower
    # is never left holding nodes that a job ahead of it in the queue waits for.
    reclaim_hard_shrink: bool = True
    ack_timeout_s: Number = _number(60.0, 1.0, DAY)
    time_limit_margin_s: Number = _number(300.0, 0.0, 7 * DAY)
    stale_snapshot_s: Number = _number(60.0, 1.0, DAY)
    # A refusal Slurm gives as final (a pin or shrink it says cannot be done) bars that
    # action on the job for this long, or until the job changes (partition, QOS, account,
    # node range, time limit, a requeue): a misread answer never bars a job for good.
    refusal_hold_s: Number = _number(3600.0, 1.0, 30 * DAY)
    # A refusal Slurm calls temporary ("try again in a bit") or an unreachable Slurm: the
    # action is asked again after retry_backoff_s, doubled after each such answer in a row,
    # at most retry_backoff_max_s; never given up.
    retry_backoff_s: Number = _number(2.0, 0.0, HOUR)
    retry_backoff_max_s: Number = _number(120.0, 0.0, DAY)


def _grow_method(value: Any) -> Any:
    # YAML 1.1 reads an unquoted ``off`` as false.
    if value is False:
        return "off"
    # Documented once as a method to come; refused until it exists rather than silently
    # acting as "companion".
    if value == "expand":
        raise ValueError("expand is not implemented; use companion or off")
    return value


class GrowSection(_Section):
    """How the daemon grows a job (companion jobs) and when it stops trying."""

    method: Annotated[Literal["companion", "off"], BeforeValidator(_grow_method)] = "companion"
    companion_pending_timeout_s: Number = _number(600.0, 1.0, 7 * DAY)
    # A companion whose parent completed has finished training too: its launcher ends it
    # within seconds.  It is cancelled (Slurm then writes "CANCELLED" error lines into its
    # output) only if it is still there this long after its parent's end.
    orphan_grace_s: Number = _number(30.0, 0.0, DAY)
    agent_command: str = Field("slurm-elastic run", min_length=1)
    # A companion that ends by itself sooner than this after it started (or before it ever
    # ran) while its parent still runs has failed.  The next grow of that job waits
    # companion_retry_backoff_s, doubled after each further failure in a row, and after
    # companion_max_failures in a row the daemon stops growing the job (its REASON says so).
    companion_fail_window_s: Number = _number(60.0, 1.0, DAY)
    companion_retry_backoff_s: Number = _number(60.0, 0.0, DAY)
    companion_max_failures: Count = _number(3, 1, 100)


class ModelSection(_Section):
    """The progress and speed models' defaults."""

    default_resize_cost_s: Number = _number(30.0, 0.0, DAY)
    # The same before a measurement, for a job that reports it resizes stop-free
    # (``slurm-elastic run --mode torchft``): its survivors only pause (bench_resize.py).
    stop_free_resize_cost_s: Number = _number(2.0, 0.0, DAY)
    # The convergence curve family (``model.convergence``): "exp" is the default validated
    # on public training curves; "auto" selects per job by holdout on its own reports.
    curve_family: Literal["exp", "optimus", "power", "auto"] = "exp"
    # A grow must deliver this share of the speed-up it was decided on, measured over this
    # many rates at the new size, or the job's fit stops extrapolating gains (GrowCheck).
    grow_check_reports: Count = _number(3, 1, 32)
    grow_min_gain_share: Number = _number(0.5, 0.0, 1.0)


class ApiSection(_Section):
    """The HTTP API for job reports and acknowledgements."""

    bind: str = "127.0.0.1"
    port: Count = _number(8790, 0, 65535)  # 0: pick a free port (tests)
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
    """Log level and format."""

    level: Literal["debug", "info", "warning", "error"] = "info"
    json_: Literal["auto", True, False] = Field("auto", alias="json")

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)


class PartitionsSection(_Section):
    """Which partitions the daemon may act in."""

    include: tuple[str, ...] = ()  # empty: every partition
    exclude: tuple[str, ...] = ()

    def allows(self, partition: str) -> bool:
        if self.include and partition not in self.include:
            return False
        return partition not in self.exclude


# A GPU type as Slurm's gres.conf writes it (``Type=a100``): a word, the same characters the
# gres parser accepts (slurm.convert.gres_gpu_type).
_GPU_TYPE = re.compile(r"[A-Za-z0-9_.+-]{1,256}")


def _partition_name(value: Any) -> Any:
    if not isinstance(value, str) or not value.strip():
        raise ValueError("a partition name must be a non-empty string")
    return value


def _gpu_type(value: Any) -> Any:
    """One GPU type of ``cluster.gpu_types``, in lower case as nodes' types are read
    (``NodeView.gpu_type``), so that a configured "A100" matches a node's ``gpu:a100``."""
    if not isinstance(value, str):
        raise ValueError("must be a GPU type name (a string, as gres.conf's Type=)")
    if not value:
        raise ValueError("must not be empty: name a GPU type")
    if not _GPU_TYPE.fullmatch(value):
        raise ValueError("must be one word of letters, digits and _.+- (as gres.conf's Type=)")
    if value.lower() == MIXED_GPU_TYPE:
        raise ValueError(f"{MIXED_GPU_TYPE!r} is what several types read as; name one type")
    return value.lower()


class ClusterSection(_Section):
    """Facts about the cluster that Slurm does not say (or says in a way a site overrides)."""

    # Partition -> the type of its GPUs ("a100"), for sites whose gres are untyped (gpu:4):
    # it decides over what the nodes' gres say (cluster_state.partition_gpu_types).
    gpu_types: dict[
        Annotated[str, BeforeValidator(_partition_name)], Annotated[str, BeforeValidator(_gpu_type)]
    ] = Field(default_factory=dict)
    # GPU type -> how fast one of its GPUs trains, relative to the others (any scale: only
    # ratios count; a100: 2.2, t4: 1.0).  A type not listed, and an untyped or mixed
    # partition, count 1.0.  Prices a job's start in each partition it may run in before it
    # has run in any (daemon.placement); what a job reports from where it runs decides over it.
    gpu_speeds: dict[
        Annotated[str, BeforeValidator(_gpu_type)],
        Annotated[float, BeforeValidator(_not_bool), Field(gt=0, le=1e6, allow_inf_nan=False)],
    ] = Field(default_factory=dict)


class Config(_Section):
    """The daemon's whole configuration, with the file each key came from."""

    mode: Literal["shadow", "enforce"] = "shadow"
    interval_s: Number = _number(10.0, 0.01, HOUR)
    state_dir: Path = Path("/var/lib/slurm-elastic")
    slurm: SlurmSection = SlurmSection()
    policy: PolicySection = PolicySection()
    guards: GuardsSection = GuardsSection()
    grow: GrowSection = GrowSection()
    model: ModelSection = ModelSection()
    api: ApiSection = ApiSection()
    log: LogSection = LogSection()
    partitions: PartitionsSection = PartitionsSection()
    cluster: ClusterSection = ClusterSection()

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
    try:
        extra = sorted(conf_d.glob("*.yaml")) if _kind(conf_d) == "dir" else []
    except OSError as exc:
        raise ConfigError(f"{conf_d}: (directory): cannot read: {exc.strerror or exc}") from None
    return [main_path, *extra]


def _kind(path: Path) -> Literal["missing", "dir", "file", "other"]:
    """What is at ``path``; a directory on the way that cannot be searched is a ConfigError
    (``Path.exists`` raises PermissionError there rather than answer)."""
    try:
        mode = path.stat().st_mode
    except (FileNotFoundError, NotADirectoryError):
        return "missing"
    except OSError as exc:
        raise ConfigError(f"{path}: (file): cannot read: {exc.strerror or exc}") from None
    if stat.S_ISDIR(mode):
        return "dir"
    # /dev/null: "no settings" (scripts and tests pass it); other devices, FIFOs and sockets
    # could block or never end.
    return "file" if stat.S_ISREG(mode) or str(path) == os.devnull else "other"


def _read_yaml(path: Path) -> dict[str, Any]:
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise ConfigError(f"{path}: (file): cannot read: {exc.strerror or exc}") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        bad = raw[exc.start : exc.start + 1].hex()
        raise ConfigError(
            f"{path}: (file): not UTF-8 text (byte 0x{bad} at offset {exc.start})"
        ) from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}" if mark is not None else "(file)"
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise ConfigError(f"{path}: {where}: invalid YAML: {problem}") from None
    except RecursionError:
        raise ConfigError(f"{path}: (file): invalid YAML: nested too deeply") from None
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


def _shown(value: Any, limit: int = 60) -> str:
    """The offending value for the error line: repr (control characters escaped), cut short."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _error_line(exc: ValidationError, prov: Mapping[str, str]) -> str:
    err = exc.errors()[0]
    loc = ".".join(str(p) for p in err["loc"]).replace("json_", "json") or "(top level)"
    reason = err["msg"]
    if err["type"] == "value_error":  # our own validators: their text without pydantic's prefix
        reason = str(err.get("ctx", {}).get("error", reason))
    if err["type"] == "extra_forbidden":
        reason = "unknown key"
    elif "input" in err and err["type"] not in ("missing",):
        reason = f"{reason} (got {_shown(err['input'])})"
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
        kind = _kind(path)
        if index == 0 and optional_main and kind == "missing":
            continue
        if kind in ("missing", "dir"):
            raise ConfigError(f"{path}: (file): does not exist or is a directory")
        if kind == "other":  # a FIFO or a device would block or never end
            raise ConfigError(f"{path}: (file): not a regular file")
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
