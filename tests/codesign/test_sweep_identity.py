"""A sweep's identity (the store directory its results live under) is a hash of what defines the results: it
changes with the workload, scenario, precision, serving parameters, design space, generations, presets, mappings
and storage mode, and not with worker count, batch size, in-flight tasks, retries, output paths or progress."""

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from codesign.cli import CONF_DIR
from codesign.schema import load_study
from codesign.study import candidate_designs, preset_designs, sweep_definition
from sweeps.store import definition_hash


def sweep_id(*overrides):
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = OmegaConf.to_container(compose("config", overrides=["experiment=smoke", *overrides]), resolve=True)
    study = load_study(cfg)
    return definition_hash(sweep_definition(study, [preset_designs(study)] + candidate_designs(study)))


BASE = sweep_id()


@pytest.mark.parametrize("override", [
    "sweep.num_workers=7", "sweep.batch_size=17", "sweep.max_in_flight=9", "sweep.max_retries=0",
    "sweep.output_dir=/elsewhere", "sweep.progress=false", "sweep.ray_address=auto", "report.dpi=300",
    "report.top_k=2", "study_name=another_name",
])
def test_runtime_settings_do_not_change_the_identity(override):
    assert sweep_id(override) == BASE


@pytest.mark.parametrize("override", [
    "workload=llama2_70b", "scenario=offline_1k1k", "precision=fp8", "serving=default",
    "space.power_rating_w=[700,1200]", "space.clock_scale=[1.1]", "generation=[gen2]",
    "hardware.hbm_bandwidth_bytes_per_s=2e13", "competitors=[gb200]", "sweep.keep=frontier",
    "sweep.mappings=[tp1]", "serving.unmeasured_family=nvidia",
])
def test_what_defines_results_changes_the_identity(override):
    assert sweep_id(override) != BASE


def test_the_model_code_is_part_of_the_identity():
    """A change to arch_space/, serving/ or sweeps/ is a new sweep: their hash is in every definition."""
    from pathlib import Path

    import arch_space
    import serving
    import sweeps
    from sweeps.store import source_fingerprint

    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = OmegaConf.to_container(compose("config", overrides=["experiment=smoke"]), resolve=True)
    study = load_study(cfg)
    definition = sweep_definition(study, [preset_designs(study)] + candidate_designs(study))
    code = source_fingerprint(*(Path(pkg.__file__).parent for pkg in (arch_space, serving, sweeps)))
    assert definition["model_code"] == code
    assert definition_hash(definition | {"model_code": "0" * 16}) != BASE
