"""A stored run's report settings (objective, interactivity targets, top-k, workload mix, agent-chain steps,
headline target, dpi), read from its ``study.json``: the meta's own keys first, then the study's config, then
defaults, every value checked so that a hand-edited or damaged file is one line naming its field and value."""

from __future__ import annotations

from arch_space.errors import ConfigError
from arch_space.validation import check_names, check_quantities, check_quantity
from codesign.schema import MAX_DPI

META = "study.json"  # where the meta of a stored run lives: error paths name its fields
_DEFAULTS = {"objective": "total_tok_s_per_kw", "targets": (50.0, 100.0, 200.0), "top_k": 5, "chain_steps": 1,
             "dpi": 110}


def _section(cfg: dict, key: str, path: str) -> dict:
    v = cfg.get(key)
    if v is None:
        return {}
    if not isinstance(v, dict):
        raise ConfigError(f"{path}.{key}", f"expected a mapping, got {v!r}")
    return v


def _first(*sources):
    """(path, value) of the first source whose value is set (not null); ``(None, None)`` if none is."""
    for path, mapping, key in sources:
        if mapping.get(key) is not None:
            return path, mapping[key]
    return None, None


def _check_mix(value, path: str) -> dict[str, float]:
    if not isinstance(value, dict) or not value:
        raise ConfigError(path, f"expected a mapping of workload name -> weight (> 0), got {value!r}")
    out = {}
    for w, a in value.items():
        if not isinstance(w, str) or not w:
            raise ConfigError(path, f"expected workload names as keys, got {w!r}")
        out[w] = check_quantity(a, f"{path}.{w}")
    return out


def _config_mix(cfg: dict, path: str) -> dict[str, float] | None:
    """The study config's mix: a list of workload names with ``mix_weights`` (null: equal), or a mapping."""
    raw, weights = cfg.get("mix"), cfg.get("mix_weights")
    if raw is None:
        return None
    if isinstance(raw, dict):
        return _check_mix(raw, f"{path}.mix")
    names = check_names(raw, f"{path}.mix", what="workload name")
    if weights is None:
        return {w: 1.0 for w in names}
    if not isinstance(weights, (list, tuple)) or len(weights) != len(names):
        raise ConfigError(f"{path}.mix_weights", f"expected one weight per mix entry ({len(names)}), got {weights!r}")
    return {w: check_quantity(a, f"{path}.mix_weights[{i}]") for i, (w, a) in enumerate(zip(names, weights))}


def settings_from_meta(meta: dict, workloads=None) -> dict:
    """objective, targets, top_k, mix, chain_steps (and chain_in_e2e: whether the rows' E2E already is the chain,
    as an agentic scenario's is), headline_target and dpi for a report, from the study's meta:
    its own keys first, then the study's config (``config.report``, ``config.scenario``, ``config.mix``), then
    defaults. Every value is checked: a bad one is a ConfigError naming the field of ``study.json`` (e.g.
    ``study.json: targets[0]``) and the value. ``workloads`` (those with rows in the results), when given, must
    include every workload of the mix."""
    if not isinstance(meta, dict):
        raise ConfigError(META, f"expected a JSON object, got {meta!r}")
    cfg = meta.get("config")
    if cfg is None:
        cfg = {}
    elif not isinstance(cfg, dict):
        raise ConfigError(f"{META}: config", f"expected a mapping (the study's config), got {cfg!r}")
    rep = _section(cfg, "report", f"{META}: config")
    scen = _section(cfg, "scenario", f"{META}: config")
    top, crep, cscen = f"{META}: ", f"{META}: config.report.", f"{META}: config.scenario."

    path, objective = _first((top + "objective", meta, "objective"), (crep + "objective", rep, "objective"))
    if path is None:
        objective = _DEFAULTS["objective"]
    elif not isinstance(objective, str) or not objective:
        raise ConfigError(path, f"expected the name of a result column, got {objective!r}")

    path, targets = _first((top + "targets", meta, "targets"),
                           (crep + "interactivity_targets_tok_s_user", rep, "interactivity_targets_tok_s_user"))
    if path is None:
        targets = _DEFAULTS["targets"]
    elif not isinstance(targets, (list, tuple)):
        raise ConfigError(path, f"expected a list of interactivity targets (tok/s/user), got {targets!r}")
    else:
        targets = check_quantities(targets, path)

    def integer(field: str, *sources) -> int:
        path, v = _first(*sources)
        return _DEFAULTS[field] if path is None else check_quantity(v, path, integer=True)

    top_k = integer("top_k", (top + "top_k", meta, "top_k"), (crep + "top_k", rep, "top_k"))
    # An agentic scenario's E2E is already its chain of dependent turns (tool gaps included, serving.serve):
    # the chain is that one, not report.agent_chain_steps requests of it.
    chain_in_e2e = scen.get("kind") == "agentic"
    chain_sources = [(top + "agent_chain_steps", meta, "agent_chain_steps"),
                     (crep + "agent_chain_steps", rep, "agent_chain_steps"), (cscen + "chain_steps", scen, "chain_steps")]
    steps = integer("chain_steps", *(chain_sources[2:] + chain_sources[:2] if chain_in_e2e else chain_sources))
    dpi = integer("dpi", (crep + "dpi", rep, "dpi"))
    if dpi > MAX_DPI:
        raise ConfigError(crep + "dpi", f"must be <= {MAX_DPI}, got {dpi}")

    path, headline = _first((top + "headline_target", meta, "headline_target"),
                            (crep + "headline_target", rep, "headline_target"))
    if path is not None:
        headline = check_quantity(headline, path)

    if meta.get("mix") is not None:
        path, mix = top + "mix", _check_mix(meta["mix"], top + "mix")
    else:
        path, mix = f"{META}: config.mix", _config_mix(cfg, f"{META}: config")
    if mix and workloads is not None:
        have = sorted({str(w) for w in workloads})
        for w in mix:
            if w not in have:
                raise ConfigError(path, f"workload {w!r} has no rows in results.parquet (workloads there: "
                                        f"{', '.join(have) or 'none'})")
    return {"objective": objective, "targets": tuple(float(t) for t in targets), "top_k": top_k, "mix": mix,
            "chain_steps": steps, "chain_in_e2e": chain_in_e2e, "headline_target": headline, "dpi": dpi}
