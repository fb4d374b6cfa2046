"""Typed schema of a study: from a plain config mapping (Hydra's, converted) to validated library objects.

The libraries never see a DictConfig: ``codesign/`` converts the composed config with
``OmegaConf.to_container(resolve=True)`` and hands the plain tree to :func:`load_study`, which builds each section
with its library's own validating constructor. Every failure is one :class:`ConfigError` line naming the field.
Presets referenced by name (``competitors``) are loaded from ``conf/hardware/NAME.yaml`` and validated the same way.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from omegaconf import OmegaConf

from arch_space.chip import Chip
from arch_space.design_space import DesignSpace
from arch_space.errors import ConfigError
from arch_space.technology import Generation
from arch_space.validation import build, check_names, check_quantities, check_quantity, choice, quantity
from serving.architecture import ModelArchitecture
from serving.precision import Precision
from serving.perf import ParamSet, ServingParams
from serving.scenario import Scenario, check_positions

CONF_DIR = Path(__file__).resolve().parent.parent / "conf"
TOP_LEVEL = ("hardware", "generation", "workload", "precision", "scenario", "space", "sweep", "report", "serving",
             "competitors", "study_name", "hf_config", "mix", "mix_weights")


def load_workload(cfg: dict) -> ModelArchitecture:
    """The workload group's architecture, or the Hugging Face ``config.json`` named by ``hf_config`` (a path)."""
    path = cfg.get("hf_config")
    if path is not None:
        if not isinstance(path, str):
            raise ConfigError("hf_config", f"expected a path to a config.json, got {path!r}")
        return ModelArchitecture.from_hf_config(Path(path).expanduser())
    return ModelArchitecture.from_dict(cfg["workload"], "workload")


@dataclasses.dataclass(frozen=True)
class SweepConfig:
    output_dir: str = "sweeps_store"
    ray_address: str | None = None
    num_workers: int = quantity(integer=True, default=2)
    batch_size: int = quantity(integer=True, default=256)
    max_in_flight: int = quantity(integer=True, default=4)
    max_retries: int = quantity(integer=True, allow_zero=True, default=3)
    mappings: tuple[str, ...] | None = None  # names to keep (e.g. [tp1, tp2, dep8]); null: every enumerated one
    keep: str = choice(("all", "frontier"), default="all")  # operating points stored per design
    progress: bool = True

    @classmethod
    def from_dict(cls, data, path: str = "sweep") -> "SweepConfig":
        cfg = build(cls, data, path)
        if cfg.ray_address is not None and not (cfg.ray_address == "auto" or cfg.ray_address.startswith("ray://")
                                                or ":" in cfg.ray_address):
            raise ConfigError(f"{path}.ray_address", f"expected null, 'auto', 'ray://host:port' or 'host:port', "
                                                     f"got {cfg.ray_address!r}")
        if cfg.mappings is not None:
            check_names(list(cfg.mappings), f"{path}.mappings", what="mapping name")  # [] would sweep nothing
        if Path(cfg.output_dir).expanduser().is_file():
            raise ConfigError(f"{path}.output_dir", f"{cfg.output_dir!r} is an existing file, not a directory")
        return cfg


MAX_DPI = 1200  # a 12 x 8 in figure at 1200 dpi is ~140 Mpixel; beyond that matplotlib runs out of memory


@dataclasses.dataclass(frozen=True)
class ReportConfig:
    title: str = "Gen 2 / Gen 3 design study"
    objective: str = choice(("total_tok_s_per_kw", "total_tok_s_per_chip", "output_tok_s_per_chip"),
                            default="total_tok_s_per_kw")
    interactivity_targets_tok_s_user: tuple[float, ...] = (50.0, 100.0, 200.0)
    top_k: int = quantity(integer=True, default=5)
    agent_chain_steps: int = quantity(integer=True, default=10)
    dpi: int = quantity(integer=True, default=110)

    @classmethod
    def from_dict(cls, data, path: str = "report") -> "ReportConfig":
        cfg = build(cls, data, path)
        check_quantities(cfg.interactivity_targets_tok_s_user, f"{path}.interactivity_targets_tok_s_user")
        if cfg.dpi > MAX_DPI:  # checked before the sweep: matplotlib would fail only when the report is drawn
            raise ConfigError(f"{path}.dpi", f"must be <= {MAX_DPI} (print quality is 300), got {cfg.dpi}")
        return cfg


@dataclasses.dataclass(frozen=True)
class Study:
    study_name: str
    hardware: Chip
    generations: dict[str, Generation]
    workload: ModelArchitecture
    precision: Precision
    scenario: Scenario
    space: DesignSpace
    sweep: SweepConfig
    report: ReportConfig
    serving: ServingParams
    competitors: tuple[Chip, ...]
    raw: dict
    # the weighted workload mix designs are selected over; ``workload`` is its primary member (plots, refinement)
    mix: tuple[tuple[ModelArchitecture, float], ...] = ()
    # serving parameters per vendor family (``serving`` above is their shared set: candidates and unmeasured vendors)
    serving_set: ParamSet | None = None

    def params_for(self, vendor: str | None) -> ServingParams:
        return self.serving_set.for_vendor(vendor) if self.serving_set else self.serving

    @property
    def workloads(self) -> tuple[ModelArchitecture, ...]:
        return tuple(a for a, _ in self.mix) or (self.workload,)

    @property
    def mix_weights(self) -> dict[str, float]:
        return {a.name: w for a, w in self.mix} or {self.workload.name: 1.0}  # the validated plain config, for hashing and the report's assumptions section


def hardware_presets(conf_dir: Path = CONF_DIR) -> list[str]:
    return sorted(p.stem for p in (conf_dir / "hardware").glob("*.yaml"))


def load_hardware_preset(name: str, path: str, conf_dir: Path = CONF_DIR) -> Chip:
    file = conf_dir / "hardware" / f"{name}.yaml"
    if not isinstance(name, str) or not file.exists():
        raise ConfigError(path, f"unknown hardware preset {name!r} (known: {', '.join(hardware_presets(conf_dir))})")
    return Chip.from_dict(OmegaConf.to_container(OmegaConf.load(file), resolve=True), path)


def workload_presets(conf_dir: Path = CONF_DIR) -> list[str]:
    return sorted(p.stem for p in (conf_dir / "workload").glob("*.yaml"))


def load_mix(cfg: dict, workload: ModelArchitecture, overridden: tuple[str, ...], conf_dir: Path = CONF_DIR):
    """The weighted workload mix: ``mix`` lists conf/workload preset names, ``mix_weights`` their weights (> 0;
    null: equal). Lists, so that a command-line override replaces the mix instead of merging into it. ``mix: null``
    studies ``workload`` alone, and so does a command line that picks the workload (``workload=...`` or
    ``hf_config=...``) without also setting ``mix``: the user asked for that model."""
    raw, weights = cfg.get("mix"), cfg.get("mix_weights")
    picked = any(k in ("workload", "hf_config") or k.startswith("workload.") for k in overridden)
    if raw is None or (picked and "mix" not in overridden):
        return ((workload, 1.0),)
    if not isinstance(raw, list) or not raw or not all(isinstance(n, str) for n in raw):
        raise ConfigError("mix", f"expected a list of workload preset names, or null, got {raw!r}")
    if len(set(raw)) != len(raw):
        raise ConfigError("mix", f"lists a workload twice: {raw!r}")
    if weights is None:
        weights = [1.0] * len(raw)
    if not isinstance(weights, list) or len(weights) != len(raw):
        raise ConfigError("mix_weights", f"expected one weight per mix entry ({len(raw)}), got {weights!r}")
    if workload.name not in raw:
        raise ConfigError("mix", f"does not include the workload {workload.name!r} ({', '.join(raw)}): add it "
                                 f"or study it alone (mix=null)")
    out = []
    for i, (name, w) in enumerate(zip(raw, weights)):
        weight = check_quantity(w, f"mix_weights[{i}]")
        if name == workload.name:
            out.append((workload, weight))
            continue
        file = conf_dir / "workload" / f"{name}.yaml"
        if not file.exists():
            raise ConfigError(f"mix[{i}]", f"unknown workload preset {name!r} (known: "
                                           f"{', '.join(workload_presets(conf_dir))})")
        out.append((ModelArchitecture.from_dict(OmegaConf.to_container(OmegaConf.load(file), resolve=True),
                                                f"mix[{i}]"), weight))
    primary = [p for p in out if p[0] is workload]
    return tuple(primary + [p for p in out if p[0] is not workload])  # the primary workload first


def load_study(cfg: dict, *, overridden: tuple[str, ...] = (), conf_dir: Path = CONF_DIR) -> Study:
    """Validate a composed config (plain mapping) into a :class:`Study`. ``overridden`` lists dotted keys set on
    the command line (their hardware provenance becomes "command line")."""
    if not isinstance(cfg, dict):
        raise ConfigError("", f"expected a mapping at the top level, got {type(cfg).__name__}")
    for key in cfg:
        if key not in TOP_LEVEL:
            raise ConfigError(key, f"unknown top-level key (known: {', '.join(TOP_LEVEL)})")
    for key in TOP_LEVEL:
        if key not in cfg:
            raise ConfigError(key, "is missing from the composed config")
    hw_over = tuple(k.split(".", 1)[1] for k in overridden if k.startswith("hardware.") and k.count(".") == 1)
    hardware = Chip.from_dict(cfg["hardware"], "hardware", overridden=hw_over)
    gens_raw = cfg["generation"]
    if not isinstance(gens_raw, dict) or not gens_raw:
        raise ConfigError("generation", f"expected one or more generations, got {gens_raw!r}")
    generations = {k: Generation.from_dict(v, f"generation.{k}") for k, v in gens_raw.items()}
    for k, g in generations.items():
        if g.name != k:
            raise ConfigError(f"generation.{k}.name", f"must match its key {k!r}, got {g.name!r}")
    comps = cfg["competitors"]
    if not isinstance(comps, list):
        raise ConfigError("competitors", f"expected a list of hardware preset names, got {comps!r}")
    competitors = tuple(load_hardware_preset(n, f"competitors[{i}]", conf_dir) for i, n in enumerate(comps))
    if not isinstance(cfg["study_name"], str) or not cfg["study_name"]:
        raise ConfigError("study_name", f"expected a non-empty string, got {cfg['study_name']!r}")
    workload = load_workload(cfg)
    scenario = Scenario.from_dict(cfg["scenario"], "scenario")
    mix = load_mix(cfg, workload, overridden, conf_dir)
    for arch, _ in mix:
        check_positions(scenario, arch, "scenario" if arch.name == workload.name else f"mix ({arch.name})")
        if scenario.draft_tokens and not arch.num_mtp_layers:
            raise ConfigError("scenario.draft_tokens", f"{scenario.draft_tokens} MTP draft tokens, but "
                                                       f"{arch.name} has no MTP head (num_mtp_layers = 0)")
    return Study(
        study_name=cfg["study_name"],
        hardware=hardware,
        generations=generations,
        workload=workload,
        precision=Precision.from_dict(cfg["precision"], "precision"),
        scenario=scenario,
        space=DesignSpace.from_dict(cfg["space"], "space"),
        sweep=SweepConfig.from_dict(cfg["sweep"], "sweep"),
        report=ReportConfig.from_dict(cfg["report"], "report"),
        serving=ParamSet.from_dict(cfg["serving"], "serving").shared,  # candidates: unmeasured_family's set
        serving_set=ParamSet.from_dict(cfg["serving"], "serving"),
        competitors=competitors,
        raw=cfg,
        mix=mix,
    )


def yaml_comments(path: Path) -> dict[str, str]:
    """The comment of each top-level ``key: value  # comment`` line of a YAML file, with the comment-only lines
    indented under it appended (how conf/serving/default.yaml gives each assumed parameter its reasoning)."""
    out: dict[str, str] = {}
    key = None
    for line in Path(path).read_text().splitlines():
        body, _, comment = line.partition("#")
        if body.strip() and not line[:1].isspace() and ":" in body:
            key = body.split(":", 1)[0].strip()
            if comment.strip():
                out[key] = comment.strip()
            continue
        if key in out and not body.strip() and comment.strip() and line[:1].isspace():
            # a word hyphenated across the line break joins without a space
            out[key] += ("" if out[key].endswith("-") else " ") + comment.strip()
        elif not line.strip() or not line[:1].isspace():
            key = None
    return out
