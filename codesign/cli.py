"""Start-up checks shared by every Hydra entry point: bad input fails with one line, before any work starts.

Hydra reports composition problems (an unknown preset, an override of a key that does not exist, bad override
syntax) as multi-line messages, and the schema's own checks would otherwise surface inside the job. :func:`precheck`
runs first: it parses the command line as Hydra does, expands a multirun sweep into its jobs, composes each job
with Hydra's compose API and validates it with the typed schema. The first problem becomes one line on stderr
(``codesign: error: <field>: <what is wrong>``) and exit status 2, with no traceback.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Callable

from arch_space.errors import ConfigError

CONF_DIR = Path(__file__).resolve().parent.parent / "conf"
_SKIP_FLAGS = ("help", "hydra_help", "version", "cfg", "info", "shell_completion", "resolve", "package")


def fail(prog: str, err: Exception) -> None:
    sys.stderr.write(f"{prog}: error: {err}\n")
    sys.stderr.flush()
    raise SystemExit(2)


def _groups() -> dict[str, list[str]]:
    return {d.name: sorted(p.stem for p in d.glob("*.yaml")) for d in CONF_DIR.iterdir() if d.is_dir()}


def _check_choices(overrides: list[str]) -> None:
    """Unknown preset names, checked before Hydra so the message lists the known ones."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    groups = _groups()
    try:
        parsed = OverridesParser.create().parse_overrides(overrides)
    except Exception as exc:  # Hydra's OverrideParseException: first line is the useful one
        raise ConfigError("command line", str(exc).strip().splitlines()[0]) from None
    for ov in parsed:
        key = ov.key_or_group
        if key not in groups or ov.package:
            continue
        values = list(ov.sweep_string_iterator()) if ov.is_sweep_override() else [ov.get_value_element_as_str()]
        for v in values:
            for name in str(v).strip("[]").split(","):
                name = name.strip()
                if name == "null":  # Hydra: "Config group override must be a string or a list. Got NoneType"
                    raise ConfigError(key, f"expected a preset name (known: {', '.join(groups[key])}), got null"
                                      + ("; leave experiment out for none" if key == "experiment" else ""))
                if name and name != "null" and name not in groups[key]:
                    raise ConfigError(key, f"unknown preset {name!r} (known: {', '.join(groups[key])})")


def _jobs(overrides: list[str], multirun: bool) -> list[list[str]]:
    if not multirun:
        return [overrides]
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
    from hydra.core.override_parser.overrides_parser import OverridesParser

    parsed = OverridesParser.create().parse_overrides(overrides)
    batches = BasicSweeper.split_arguments(parsed, None)
    return [job for batch in batches for job in batch]


def _compose(job: list[str], config_name: str) -> dict:
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from omegaconf import OmegaConf

    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
            cfg = compose(config_name=config_name, overrides=[o for o in job if not o.startswith("hydra")])
            return OmegaConf.to_container(cfg, resolve=True)
    except ConfigError:
        raise
    except Exception as exc:
        lines = [ln.strip() for ln in str(exc).strip().splitlines() if ln.strip()]
        cause = exc.__cause__
        detail = lines[0] if lines else type(exc).__name__
        if cause is not None and str(cause).strip():
            detail += " (" + str(cause).strip().splitlines()[0] + ")"
        raise ConfigError("command line", detail) from None
    finally:
        GlobalHydra.instance().clear()


def overridden_keys(job: list[str]) -> tuple[str, ...]:
    keys = []
    for o in job:
        k = o.split("=", 1)[0].lstrip("+~")
        keys.append(k)
    return tuple(keys)


def precheck(argv: list[str], validate: Callable[[dict, tuple[str, ...]], object], config_name: str = "config"):
    """Validate every job the command line describes; raise ConfigError on the first problem."""
    from hydra._internal.utils import get_args_parser

    args = get_args_parser().parse_args(argv)
    if any(getattr(args, f, None) for f in _SKIP_FLAGS):
        return
    overrides = list(args.overrides or [])
    _check_choices(overrides)
    for job in _jobs(overrides, bool(args.multirun)):
        validate(_compose(job, args.config_name or config_name), overridden_keys(job))


def entry(prog: str, config_name: str, validate: Callable, hydra_main: Callable) -> None:
    """A command's console entry point: validate the command line first (one-line errors), then run Hydra."""
    try:
        precheck(sys.argv[1:], validate, config_name=config_name)
    except ConfigError as err:
        fail(prog, err)
    hydra_main()


def output_path(value, field: str, *, directory: bool = False) -> Path:
    """The path an output goes to, checked before any work starts: a non-empty string, not an existing entry of the
    other kind (a file where a directory goes or the reverse), under a parent that is (or can be made) a directory.
    A command that finds its output unwritable only after minutes of work has wasted them."""
    if not isinstance(value, str) or not value.strip():
        raise ConfigError(field, f"expected a {'directory' if directory else 'file'} path, got {value!r}")
    path = Path(value).expanduser()
    if path.exists() and path.is_dir() != directory:
        raise ConfigError(field, f"{value!r} is an existing {'file' if directory else 'directory'}")
    parent = path.parent
    while not parent.exists():
        parent = parent.parent
    if not parent.is_dir():
        raise ConfigError(field, f"{value!r} lies under {str(parent)!r}, which is a file")
    return path
